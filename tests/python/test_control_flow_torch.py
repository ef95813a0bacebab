"""Control flow exported by torch (issue 24, point 2): torch.jit.script modules with a loop and a data-dependent
branch, exported with torch.onnx.export (TorchScript exporter, opset 17) to Loop and If nodes whose bodies read
the weights from the enclosing scope. Their gradients, from TrainingSession.gradients and through the Yield
boundary (run_forward/run_backward), match torch autograd on the eager module."""
import copy
import io
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import onnxtrain  # noqa: E402


class ScriptedLoop(nn.Module):
    """h <- tanh(fc(h)), once per row of x: a Loop whose trip count the exporter writes as a Constant."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = x
        for _ in range(x.size(0)):
            h = torch.tanh(self.fc(h))
        return h


class ScriptedCountingLoop(nn.Module):
    """ScriptedLoop with an int counter carried along and read by the step: a Loop with a non-float carried value."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = x
        k = 0
        for _ in range(x.size(0)):
            h = torch.tanh(self.fc(h)) * (1.0 + 0.1 * k)
            k += 1
        return h


class ScriptedWhile(nn.Module):
    """h <- tanh(fc(h)) + h while the sum of |h| stays under a bound, at most 8 times: a Loop whose condition is
    computed from the data, with an int counter carried along. Its number of iterations is only known at run time."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = x
        i = 0
        while bool(h.abs().sum() < 9.0) and i < 8:
            h = torch.tanh(self.fc(h)) + h
            i += 1
        return h


def while_iterations(module, x):
    """How many times ScriptedWhile's loop runs on x (eagerly, as the module does)."""
    h, i = x, 0
    with torch.no_grad():
        while bool(h.abs().sum() < 9.0) and i < 8:
            h = torch.tanh(module.fc(h)) + h
            i += 1
    return i


class ScriptedBranch(nn.Module):
    """A branch on the data: an If whose condition is only known at run time, each branch reading weights."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x):
        if bool(x.sum() > 0):
            y = torch.tanh(self.a(x))
        else:
            y = torch.sigmoid(self.b(x)) * x
        return y


def export(module, x, dynamic_rows=False):
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(torch.jit.script(copy.deepcopy(module)), (x,), f, opset_version=17, dynamo=False,
                          input_names=["x"], output_names=["y"],
                          dynamic_axes={"x": {0: "rows"}, "y": {0: "rows"}} if dynamic_rows else None)
    return f.getvalue()


@pytest.mark.parametrize("make,sign,op", [(ScriptedLoop, 1.0, "Loop"), (ScriptedBranch, 1.0, "If"),
                                          (ScriptedBranch, -1.0, "If")], ids=["loop", "if_then", "if_else"])
def test_scripted_control_flow_gradients_match_torch(make, sign, op):
    onnx = pytest.importorskip("onnx")
    torch.manual_seed(0)
    eager = make()
    x = torch.randn(3, 4).abs() * sign  # the sign of the sum picks the branch
    data = export(eager, torch.randn(3, 4))
    assert op in {n.op_type for n in onnx.load_from_string(data).graph.node}, "the exporter kept the control flow"
    target = torch.randn(3, 4)
    loss = ((eager(x) - target) ** 2).mean()
    loss.backward()
    # The weights of the branch not taken get no gradient in torch: zero, which ours must be too.
    want = {n: (p.grad if p.grad is not None else torch.zeros_like(p)).numpy() for n, p in eager.named_parameters()}

    s = onnxtrain.TrainingSession(data, loss="mse")
    got_loss, grads = s.gradients({"x": x.numpy(), s.target_name: target.numpy()})
    assert got_loss == pytest.approx(loss.item(), rel=1e-5)
    # Through the Yield boundary: the backward If/Scan read, inside their bodies, what the forward saved.
    s.run_forward({"x": x.numpy()})
    split = s.run_backward([(2 * (eager(x) - target) / target.numel()).detach().numpy()])
    for name, w in want.items():
        scale = max(np.abs(w).max(), 1e-6)
        assert np.abs(grads[name] - w).max() / scale < 1e-4, name
        assert np.abs(split[name] - w).max() / scale < 1e-4, name


@pytest.mark.parametrize("make", [ScriptedLoop, ScriptedCountingLoop], ids=["loop", "with_int_counter"])
@pytest.mark.parametrize("rows", [5, 2])
def test_loop_over_a_dynamic_axis_runs_as_many_times_as_the_rows_fed(rows, make):
    # Exported with a dynamic first axis, the trip count is Gather(Shape(x), 0), computed when the step is planned:
    # the gradient takes the Scan path over Range(0, M), here for other row counts than the export's.
    onnx = pytest.importorskip("onnx")
    torch.manual_seed(0)
    eager = make()
    data = export(eager, torch.randn(3, 4), dynamic_rows=True)
    graph = onnx.load_from_string(data).graph
    loop = next(n for n in graph.node if n.op_type == "Loop")
    assert not any(i.name == loop.input[0] for i in graph.initializer), "the trip count is computed, not a constant"
    x = torch.randn(rows, 4)
    target = torch.randn(rows, 4)
    loss = ((eager(x) - target) ** 2).mean()
    loss.backward()
    s = onnxtrain.TrainingSession(data, loss="mse")
    got_loss, grads = s.gradients({"x": x.numpy(), s.target_name: target.numpy()})
    assert got_loss == pytest.approx(loss.item(), rel=1e-5)
    for name, p in eager.named_parameters():
        w = p.grad.numpy()
        assert np.abs(grads[name] - w).max() / max(np.abs(w).max(), 1e-6) < 1e-4, name


@pytest.mark.parametrize("scale", [0.3, 0.5, 3.0])
def test_while_loop_with_a_data_dependent_condition_matches_torch(scale):
    # torch.jit.script's `while` becomes a Loop whose condition the body computes from h: the loop runs a number of
    # times that depends on x (scale picks it), and the gradient recomputes rather than stacks the states. Also
    # through the Yield boundary and in onnxruntime (the exported gradient graph is standard ONNX).
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    torch.manual_seed(0)
    eager = ScriptedWhile()
    data = export(eager, torch.randn(3, 4))
    loop = next(n for n in onnx.load_from_string(data).graph.node if n.op_type == "Loop")
    assert loop.input[1], "the exporter wrote a condition"
    x = torch.randn(3, 4) * scale
    runs = while_iterations(eager, x)
    assert {0.3: 1 <= runs < 8, 0.5: 1 <= runs < 8, 3.0: runs == 0}[scale], runs  # 3, 4 and 0 here
    target = torch.randn(3, 4)
    loss = ((eager(x) - target) ** 2).mean()
    if loss.requires_grad:  # with no iteration, y = x reads no weight: torch has no graph, the gradients are zero
        loss.backward()
    want = {n: p.grad.numpy() if p.grad is not None else np.zeros(tuple(p.shape), np.float32)
            for n, p in eager.named_parameters()}

    s = onnxtrain.TrainingSession(data, loss="mse")
    got_loss, grads = s.gradients({"x": x.numpy(), s.target_name: target.numpy()})
    assert got_loss == pytest.approx(loss.item(), rel=1e-5)
    s.run_forward({"x": x.numpy()})
    split = s.run_backward([(2 * (eager(x) - target) / target.numel()).detach().numpy()])
    for name, w in want.items():
        scale_w = max(np.abs(w).max(), 1e-6)
        assert np.abs(grads[name] - w).max() / scale_w < 1e-4, name
        assert np.abs(split[name] - w).max() / scale_w < 1e-4, name

    model = s.export_gradient_model()
    onnx.checker.check_model(model, full_check=True)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {i.name: {"x": x.numpy()}.get(i.name, target.numpy()) for i in sess.get_inputs()}
    outs = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    for name, g in grads.items():
        got = [v for k, v in outs.items() if k == name + "_grad" or k.startswith(name + "_grad_")]
        assert len(got) == 1, (name, list(outs))
        assert np.abs(got[0] - g).max() <= 1e-4 * max(np.abs(g).max(), 1e-6), name


@pytest.mark.parametrize("make,sign", [(ScriptedLoop, 1.0), (ScriptedBranch, -1.0)], ids=["loop", "if_else"])
def test_exported_gradient_graph_with_control_flow_is_standard_onnx(make, sign):
    # The fused gradient ops sit inside the backward If/Scan bodies: the exported model must still carry their
    # functions and the onnxtrain opset, pass the full checker, and give our gradients in onnxruntime.
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    torch.manual_seed(0)
    x = (torch.randn(3, 4).abs() * sign).numpy()
    s = onnxtrain.TrainingSession(export(make(), torch.randn(3, 4)), loss="mse")
    target = np.random.default_rng(1).normal(size=(3, 4)).astype(np.float32)
    _, grads = s.gradients({"x": x, s.target_name: target})
    model = s.export_gradient_model()
    onnx.checker.check_model(model, full_check=True)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {i.name: {"x": x}.get(i.name, target) for i in sess.get_inputs()}
    outs = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    for name, g in grads.items():
        # "<weight>_grad", made unique when a body already uses that name ("fc.bias_grad_1")
        got = [v for k, v in outs.items() if k == name + "_grad" or k.startswith(name + "_grad_")]
        assert len(got) == 1, (name, list(outs))
        assert np.abs(got[0] - g).max() <= 1e-4 * max(np.abs(g).max(), 1e-6), name
