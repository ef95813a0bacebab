"""Whole-model gradient parity fixtures: four small PyTorch models, exported to ONNX in training mode, with the
gradients torch autograd computes for them.

    python torch_parity_models.py MODEL OUTDIR     # MODEL: mlp, cnn, transformer, conv1d (or "all")
    python torch_parity_models.py --ort GRADIENT_MODEL FIXTURES OURS_DIR

writes OUTDIR/MODEL.onnx (the exported model; parameters are initializers named as in torch) and
OUTDIR/MODEL.fixtures.onnx, a tensor container (one initializer per tensor; read with any ONNX loader):

    input/<name>        the model's inputs
    output/<i>          torch's outputs (forward check)
    output_grad/<i>     dL/d output i for a loss torch computes (cross-entropy on the first output; absent for an
                        output the loss does not use, whose gradient is zero)
    grad/<name>         dL/d parameter, and dL/d input for every floating-point input
    mse_target          a target for the first output
    mse_grad/<name>     d mean((output_0 - mse_target)^2) / d parameter

tests/training/test_run_forward_backward_torch.cpp compares onnxtrain's gradients with these;
tests/python/test_gradient_graph_portable.py runs our exported gradient graph in onnxruntime against them.
The --ort mode checks an exported gradient graph (TrainingSession::export_gradient_model, MSE loss) with
onnx.checker (full_check) and runs it in onnxruntime on the fixtures' inputs and mse_target: its gradients must
equal OURS_DIR/<weight>.npy (our executor's) and torch's mse_grad/<weight>. Exits non-zero, saying what differs.
"""
import math
import pathlib
import sys
import warnings

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import numpy_helper
from torch import nn



class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(8, 16), nn.Linear(16, 16), nn.Linear(16, 4)

    def forward(self, x):
        return self.fc3(torch.tanh(self.fc2(torch.relu(self.fc1(x)))))


class CNN(nn.Module):
    """Conv-BN-ReLU stem, one residual block, max pooling, a strided conv, average pooling, a linear head. Convs
    feeding BatchNorm have no bias, as usual: in training mode its gradient is exactly zero, and comparing two
    round-off noises relative to each other says nothing."""

    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
        self.conv2, self.bn2 = nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
        self.conv3, self.bn3 = nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
        self.pool = nn.MaxPool2d(2)
        self.conv4, self.bn4 = nn.Conv2d(8, 16, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(16)
        self.avg = nn.AvgPool2d(2, stride=1)
        self.fc = nn.Linear(16, 5)

    def forward(self, x):
        h = torch.relu(self.bn1(self.conv1(x)))
        r = torch.relu(self.bn2(self.conv2(h)))
        h = torch.relu(self.bn3(self.conv3(r)) + h)
        h = self.pool(h)
        h = torch.relu(self.bn4(self.conv4(h)))
        h = self.avg(h)
        h = F.adaptive_avg_pool2d(h, 1).flatten(1)
        return self.fc(h)


class Encoder(nn.Module):
    """Token + learned position embeddings, one pre-softmax-masked self-attention block (key padding mask),
    LayerNorm, a GELU feed-forward, masked mean pooling and a linear head. Two outputs: the logits (the loss
    reads them) and the token states (it does not)."""

    def __init__(self, vocab=20, d=16, heads=2, seq=7, classes=3):
        super().__init__()
        self.heads, self.d = heads, d
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(0.1 * torch.randn(seq, d))
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.ff1, self.ff2 = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)
        self.head = nn.Linear(d, classes)

    def forward(self, ids, mask):
        b, t = ids.shape
        h = self.emb(ids) + self.pos[:t]
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        split = lambda z: z.reshape(b, t, self.heads, self.d // self.heads).transpose(1, 2)
        q, k, v = split(q), split(k), split(v)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d // self.heads)
        scores = scores.masked_fill(~mask[:, None, None, :], -1e9)
        a = torch.softmax(scores, dim=-1) @ v
        h = self.ln1(h + self.proj(a.transpose(1, 2).reshape(b, t, self.d)))
        h = self.ln2(h + self.ff2(F.gelu(self.ff1(h))))
        m = mask.unsqueeze(-1).to(h.dtype)
        pooled = (h * m).sum(1) / m.sum(1)
        return self.head(pooled), h


class SeqConv(nn.Module):
    """A 1D-conv sequence tagger: a same-padded conv, a dilated grouped conv, a causal (left-padded) gated conv
    whose output is split in two (tanh * sigmoid), a residual, and per-step logits."""

    def __init__(self, cin=4, c=12, classes=5):
        super().__init__()
        self.inp = nn.Conv1d(cin, c, 5, padding=2)
        self.dil = nn.Conv1d(c, c, 3, padding=2, dilation=2, groups=3)
        self.gate = nn.Conv1d(c, 2 * c, 3)
        self.out = nn.Linear(c, classes)

    def forward(self, x):
        h = F.gelu(self.inp(x))
        h = torch.relu(self.dil(h)) + h
        a, g = self.gate(F.pad(h, (2, 0))).chunk(2, dim=1)
        h = torch.tanh(a) * torch.sigmoid(g) + h
        return self.out(h.transpose(1, 2))  # [batch, time, classes]


class GeluMLP(nn.Module):
    """An MLP with the two tanh-approximated GELUs models write at opsets below 20: torch's
    F.gelu(approximate="tanh") and GPT-2's NewGELU (Pow(x, 3)); both become one GeluTanhGrad (gradients/subgraphs.h)."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(6, 16), nn.Linear(16, 16), nn.Linear(16, 4)

    def forward(self, x):
        h = F.gelu(self.fc1(x), approximate="tanh")
        h = self.fc2(h)
        h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 3.0))))
        return self.fc3(h)


def _inputs(name, gen):
    if name == "mlp":
        return {"x": torch.randn(6, 8, generator=gen)}
    if name == "cnn":
        return {"x": torch.randn(4, 3, 12, 12, generator=gen)}
    if name == "transformer":
        ids = torch.randint(0, 20, (3, 7), generator=gen)
        lengths = torch.tensor([7, 4, 5])
        return {"ids": ids, "mask": torch.arange(7)[None, :] < lengths[:, None]}
    if name == "conv1d":
        return {"x": torch.randn(3, 4, 20, generator=gen)}
    if name == "gelu_mlp":
        return {"x": torch.randn(5, 6, generator=gen)}
    raise SystemExit(f"unknown model '{name}'; expected one of {', '.join(MODELS)}")


# Model and export opset. Opset 20 makes the transformer's GELU one Gelu node; at 17 the 1D-conv model's
# GELU is exported as its Erf formula, so both forms are covered.
MODELS = {"mlp": (MLP, 13), "cnn": (CNN, 17), "transformer": (Encoder, 20), "conv1d": (SeqConv, 17),
          "gelu_mlp": (GeluMLP, 17)}


def _loss(logits, labels):
    # Class axis second, as torch's cross_entropy wants for sequences.
    return F.cross_entropy(logits if logits.dim() == 2 else logits.transpose(1, 2), labels)


def generate(name, outdir):
    """Exports MODELS[name] and writes its fixtures; returns (model path, fixtures path)."""
    outdir = pathlib.Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    cls, opset = MODELS[name]
    model = cls().train()
    inputs = _inputs(name, gen)
    names = list(inputs)
    model_path = outdir / f"{name}.onnx"
    # A forward in training mode updates BatchNorm's running statistics; every run starts from the same state.
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        probe = model(*inputs.values())
    model.load_state_dict(state)
    out_names = [f"out{i}" for i in range(len(probe) if isinstance(probe, tuple) else 1)]
    with warnings.catch_warnings():  # the TorchScript exporter's deprecation notice, BatchNorm's counter
        warnings.simplefilter("ignore")
        torch.onnx.export(model, tuple(inputs.values()), model_path, dynamo=False, opset_version=opset,
                          training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                          keep_initializers_as_inputs=False, input_names=names, output_names=out_names)
    model.load_state_dict(state)

    exported = onnx.load(model_path)
    inits = {i.name for i in exported.graph.initializer}
    params = dict(model.named_parameters())
    missing = [p for p in params if p not in inits]
    if missing:
        raise SystemExit(f"{name}: parameters not exported as initializers of the same name: {missing}")

    leaves = {k: v.clone().requires_grad_(v.is_floating_point()) for k, v in inputs.items()}
    outs = model(*leaves.values())
    outs = list(outs) if isinstance(outs, tuple) else [outs]
    labels = torch.randint(0, outs[0].shape[-1], outs[0].shape[:-1], generator=gen)
    loss = _loss(outs[0], labels)
    wrt = list(params.items()) + [(k, v) for k, v in leaves.items() if v.requires_grad]
    grads = torch.autograd.grad(loss, [outs[0]] + [v for _, v in wrt], retain_graph=True)
    fixtures = {f"input/{k}": v for k, v in inputs.items()}
    fixtures.update({f"output/{i}": o for i, o in enumerate(outs)})
    fixtures["output_grad/0"] = grads[0]
    fixtures.update({f"grad/{k}": g for (k, _), g in zip(wrt, grads[1:])})

    target = torch.randn(outs[0].shape, generator=gen)
    mse = F.mse_loss(outs[0], target)
    fixtures["mse_target"] = target
    fixtures.update({f"mse_grad/{k}": g for k, g in zip(params, torch.autograd.grad(mse, list(params.values())))})

    container = onnx.helper.make_model(onnx.helper.make_graph(
        [], f"{name}_fixtures", [], [],
        [numpy_helper.from_array(v.detach().numpy(), k) for k, v in fixtures.items()]))
    fixtures_path = outdir / f"{name}.fixtures.onnx"
    onnx.save(container, fixtures_path)
    return model_path, fixtures_path


def load_fixtures(path):
    return {i.name: numpy_helper.to_array(i) for i in onnx.load(path).graph.initializer}


def relative_error(ours, ref):
    """Largest elementwise difference over the reference's largest magnitude (the test's 1e-4 criterion)."""
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    assert ours.shape == ref.shape, (ours.shape, ref.shape)
    scale = np.abs(ref).max()
    diff = np.abs(ours - ref).max()
    return diff / scale if scale > 0 else diff


def run_gradient_graph_in_ort(gradient_model, fixtures):
    """Checks the gradient graph and runs it in onnxruntime; returns {weight: gradient}."""
    import onnxruntime as ort
    m = onnx.load(gradient_model)
    onnx.checker.check_model(m, full_check=True)
    sess = ort.InferenceSession(str(gradient_model), providers=["CPUExecutionProvider"])
    feeds = {i.name: fixtures["mse_target" if i.name == "target" else f"input/{i.name}"] for i in sess.get_inputs()}
    out = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    return {k[:-len("_grad")]: v for k, v in out.items() if k.endswith("_grad")}


def check_ort(gradient_model, fixtures_path, ours_dir, tolerance=1e-4):
    fixtures = load_fixtures(fixtures_path)
    grads = run_gradient_graph_in_ort(gradient_model, fixtures)
    bad = []
    for name, g in grads.items():
        ours = np.load(pathlib.Path(ours_dir) / f"{name}.npy")
        for what, ref in (("our executor", ours), ("torch", fixtures[f"mse_grad/{name}"])):
            e = relative_error(g, ref)
            if not e < tolerance:
                bad.append(f"{name}: onnxruntime vs {what}: relative error {e:.3g}")
    if not grads:
        bad.append("the gradient graph has no '<weight>_grad' outputs")
    if bad:
        raise SystemExit("\n".join(bad))
    print(f"onnxruntime: {len(grads)} gradients match our executor and torch")


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--ort":
        check_ort(*sys.argv[2:])
        sys.exit(0)
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    for n in (MODELS if sys.argv[1] == "all" else [sys.argv[1]]):
        generate(n, sys.argv[2])
