"""onnxtrain.torch.TrainModule against eager PyTorch: loss curves, gradients, Module behaviour, errors."""
import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import onnxtrain.torch as ott
from torch_parity_models import CNN, MLP, Encoder


def rel(a, b):
    """Largest difference relative to the reference's largest magnitude."""
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def data(name, step, gen):
    if name == "mlp":
        return (torch.randn(6, 8, generator=gen),), torch.randint(0, 4, (6,), generator=gen)
    if name == "cnn":
        return (torch.randn(4, 3, 12, 12, generator=gen),), torch.randint(0, 5, (4,), generator=gen)
    ids = torch.randint(0, 20, (3, 7), generator=gen)
    lengths = torch.tensor([7, 4, 5])
    return (ids, torch.arange(7)[None, :] < lengths[:, None]), torch.randint(0, 3, (3,), generator=gen)


MODELS = {"mlp": MLP, "cnn": CNN, "transformer": Encoder}


def logits(out):
    return out[0] if isinstance(out, tuple) else out


def pair(name):
    torch.manual_seed(0)
    eager = MODELS[name]().train()
    return eager, ott.TrainModule(copy.deepcopy(eager))


@pytest.mark.parametrize("name", list(MODELS))
def test_loss_curve_matches_eager_adamw_50_steps(name):
    eager, wrapped = pair(name)
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (eager, wrapped)]
    gen = torch.Generator().manual_seed(1)
    worst = 0.0
    for step in range(50):
        inputs, labels = data(name, step, gen)
        losses = []
        for m, opt in zip((eager, wrapped), opts):
            opt.zero_grad()
            loss = F.cross_entropy(logits(m(*inputs)), labels)
            loss.backward()
            opt.step()
            losses.append(loss)
        worst = max(worst, rel(losses[1], losses[0]))
        assert rel(losses[1], losses[0]) < 1e-4, f"{name} step {step}: {losses[1].item()} vs {losses[0].item()}"
    print(f"{name}: largest relative loss difference over 50 steps {worst:.2e}")
    assert wrapped.exports == 1  # optimizer steps never re-export
    for (n, p), (_, q) in zip(eager.named_parameters(), wrapped.named_parameters()):
        if n == "qkv.bias":
            # The key bias's gradient is exactly zero (softmax ignores a shift shared by every key), so both
            # frameworks' gradients there are round-off, which AdamW normalises into full-sized random steps.
            d = p.shape[0] // 3
            p, q = torch.cat([p[:d], p[2 * d:]]), torch.cat([q[:d], q[2 * d:]])
        assert rel(q, p) < 1e-3, n
    for (n, b), (_, c) in zip(eager.named_buffers(), wrapped.named_buffers()):
        if b.is_floating_point():
            assert rel(c, b) < 1e-4, n  # BatchNorm running statistics written back as torch does
        else:
            assert torch.equal(c, b), n  # num_batches_tracked


@pytest.mark.parametrize("name", list(MODELS))
def test_gradients_equal_eager_after_one_step(name):
    eager, wrapped = pair(name)
    gen = torch.Generator().manual_seed(2)
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (eager, wrapped)]
    for step in range(2):  # the second step's gradients are taken after one optimizer step
        inputs, labels = data(name, step, gen)
        grads = []
        for m, opt in zip((eager, wrapped), opts):
            leaves = [t.clone().requires_grad_(t.is_floating_point()) for t in inputs]
            opt.zero_grad()
            F.cross_entropy(logits(m(*leaves)), labels).backward()
            grads.append({**{n: p.grad.clone() for n, p in m.named_parameters()},
                          **{f"input{i}": t.grad for i, t in enumerate(leaves) if t.requires_grad}})
            opt.step()
        assert grads[0].keys() == grads[1].keys()
        for k in grads[0]:
            assert rel(grads[1][k], grads[0][k]) < 1e-5, f"{name} step {step}: gradient of {k}"


def test_eval_mode_no_grad_and_cache():
    eager, wrapped = pair("cnn")
    gen = torch.Generator().manual_seed(3)
    opt = torch.optim.SGD(wrapped.parameters(), lr=0.1)
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1)
    for _ in range(3):
        (x,), y = data("cnn", 0, gen)
        for m, o in ((eager, opt_e), (wrapped, opt)):
            o.zero_grad()
            F.cross_entropy(m(x), y).backward()
            o.step()
    eager.eval()
    wrapped.eval()
    assert not wrapped.module.training and not wrapped.module.bn1.training
    (x,), _ = data("cnn", 0, gen)
    with torch.no_grad():
        out = wrapped(x)
        ref = eager(x)
    assert out.grad_fn is None and not out.requires_grad
    assert rel(out, ref) < 1e-5  # eval BatchNorm reads the running statistics training wrote back
    assert wrapped.exports == 2
    # eval mode keeps every BatchNorm its own node and parameter (no Conv folding, no merged initializers)
    compiled = [c for c in wrapped._cache.values()][-1]
    assert sorted(n for _, n in compiled.trainable) == sorted(n for n, _ in wrapped.named_parameters())
    wrapped.train()
    wrapped(x)
    assert wrapped.exports == 2  # the training signature is cached


def test_layernorm_weights_stay_distinct_in_eval():
    """Every LayerNorm weight starts at 1: an eval-mode export that merged equal initializers would tie them."""
    torch.manual_seed(0)
    eager = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4), nn.Linear(4, 4), nn.LayerNorm(4)).eval()
    wrapped = ott.TrainModule(copy.deepcopy(eager))
    x, t = torch.randn(3, 4), torch.randn(3, 4)
    (wrapped(x) * t).sum().backward()  # not a plain sum: LayerNorm makes the sum's input gradients zero
    (eager(x) * t).sum().backward()
    for (n, p), (_, q) in zip(eager.named_parameters(), wrapped.named_parameters()):
        assert q.grad is not None and rel(q.grad, p.grad) < 1e-5, n
    assert rel(wrapped.module[1].weight.grad, wrapped.module[3].weight.grad) > 1e-3  # not tied


class Nested(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(5, 3), nn.Linear(5, 2)

    def forward(self, x, *, scale=1.0, extra=None):
        h = torch.tanh(self.a(x)) * scale
        out = {"h": h, "pair": (self.b(x), [h.sum(-1)])}
        if extra is not None:
            out["extra"] = extra * 2
        out["argmax"] = h.argmax(-1)
        out["tag"] = "nested"
        return out


def test_kwargs_and_nested_outputs():
    torch.manual_seed(0)
    eager = Nested()
    wrapped = ott.TrainModule(copy.deepcopy(eager))
    x = torch.randn(4, 5)
    e = torch.randn(4, 2, requires_grad=True)
    e2 = e.detach().clone().requires_grad_()
    got, ref = wrapped(x, scale=3.0, extra=e), eager(x, scale=3.0, extra=e2)
    assert got.keys() == ref.keys() and got["tag"] == "nested"
    assert torch.equal(got["argmax"], ref["argmax"]) and got["argmax"].dtype == torch.int64
    assert rel(got["pair"][1][0], ref["pair"][1][0]) < 1e-6
    loss = lambda o: o["h"].pow(2).sum() + o["pair"][0].sum() * 0.5 + o["pair"][1][0].mean() + o["extra"].pow(2).sum()
    loss(got).backward()
    loss(ref).backward()
    for (n, p), (_, q) in zip(eager.named_parameters(), wrapped.named_parameters()):
        assert rel(q.grad, p.grad) < 1e-5, n
    assert rel(e.grad, e2.grad) < 1e-6
    wrapped(x, scale=2.0)  # another constant is another signature
    assert wrapped.exports == 2


def test_module_interface_and_weight_binding():
    torch.manual_seed(0)
    inner = MLP()
    wrapped = ott.TrainModule(inner)
    assert list(wrapped.state_dict()) == list(inner.state_dict())
    assert [n for n, _ in wrapped.named_parameters()] == [n for n, _ in inner.named_parameters()]
    assert wrapped.fc1 is inner.fc1  # attributes of the wrapped module
    x = torch.randn(6, 8)
    wrapped(x)
    compiled = next(iter(wrapped._cache.values()))
    assert not compiled.copied  # every parameter bound in place, none copied per step
    # load_state_dict copies in place: the bound storage sees it; assign=True replaces tensors: rebound.
    other = MLP()
    wrapped.load_state_dict(other.state_dict())
    assert rel(wrapped(x), other(x)) < 1e-6
    third = MLP()
    wrapped.load_state_dict(third.state_dict(), assign=True)
    assert rel(wrapped(x), third(x)) < 1e-6
    with torch.no_grad():
        inner.fc3.bias.add_(1.0)
    assert rel(wrapped(x), inner.fc3(torch.tanh(inner.fc2(torch.relu(inner.fc1(x)))))) < 1e-6
    assert wrapped.exports == 1


def test_two_forwards_before_one_backward():
    """The session keeps one pass's activations; an older pass's backward recomputes its forward."""
    torch.manual_seed(0)
    eager = MLP()
    wrapped = ott.TrainModule(copy.deepcopy(eager))
    x1, x2 = torch.randn(6, 8), torch.randn(6, 8)
    (wrapped(x1).pow(2).sum() + wrapped(x2).sum()).backward()
    (eager(x1).pow(2).sum() + eager(x2).sum()).backward()
    for (n, p), (_, q) in zip(eager.named_parameters(), wrapped.named_parameters()):
        assert rel(q.grad, p.grad) < 1e-5, n


def test_in_place_change_between_forward_and_backward_is_reported():
    wrapped = ott.TrainModule(MLP())
    out = wrapped(torch.randn(2, 8)).sum()
    with torch.no_grad():
        wrapped.fc1.weight.mul_(2)
    with pytest.raises(RuntimeError, match="fc1.weight"):
        out.backward()


class Unsupported(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return torch.linalg.eigvalsh(self.fc(x) @ self.fc(x).T)


def test_export_error_names_module_and_op_and_fallback_warns():
    m = ott.TrainModule(Unsupported())
    x = torch.randn(4, 4)
    with pytest.raises(ott.ExportError, match=r"Unsupported.*linalg_eigh|Unsupported.*eig"):
        m(x)
    fb = ott.TrainModule(Unsupported(), fallback=True)
    with pytest.warns(RuntimeWarning, match="running Unsupported in PyTorch"):
        out = fb(x)
    assert torch.allclose(out, fb.module(x))
    out.sum().backward()
    assert fb.module.fc.weight.grad is not None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fb(x)  # the cached fallback does not warn again


class Double(torch.autograd.Function):
    """A user's custom op: exported as custom.Double, for which onnxtrain has no gradient rule (nor kernel)."""

    @staticmethod
    def forward(ctx, x):
        return 2 * x

    @staticmethod
    def backward(ctx, g):
        return 2 * g

    @staticmethod
    def symbolic(g, x):
        return g.op("custom::Double", x).setType(x.type())


class NoRule(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        return Double.apply(h) * h


class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.block, self.head = NoRule(), nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.block(x))


def test_missing_gradient_rule_names_module_submodule_and_op():
    x = torch.randn(3, 4)
    with pytest.raises(ott.ExportError, match=r"Outer \(in submodule 'block'\).*\(custom\.Double\): no gradient rule for op 'Double'"
                                              r".*'block\.fc\.weight'"):
        ott.TrainModule(Outer())(x)
    fb = ott.TrainModule(Outer(), fallback=True)
    with pytest.warns(RuntimeWarning, match="no gradient rule for op 'Double'"):
        out = fb(x)
    assert torch.equal(out, fb.module(x))


def test_unused_parameter_is_allowed_and_gets_no_gradient():
    class WithSpare(nn.Module):
        def __init__(self):
            super().__init__()
            self.used, self.spare = nn.Linear(3, 2), nn.Linear(3, 2)

        def forward(self, x):
            return self.used(x)

    wrapped = ott.TrainModule(WithSpare())
    wrapped(torch.randn(4, 3)).sum().backward()
    assert wrapped.used.weight.grad is not None and wrapped.spare.weight.grad is None  # as in eager PyTorch
