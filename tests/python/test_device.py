"""Device selection in every way in (Python API, sklearn estimators, CLI config), and mixed precision from
Python: the loss scale step by step against torch.amp.GradScaler. On a machine without CUDA (not built with it,
or no device visible) the CUDA names must fail with the reason; with a GPU those checks skip, saying so."""
import subprocess
import sys

import numpy as np
import onnx
import pytest
from sklearn.base import clone

import onnxtrain as ot
from conftest import ROOT
from onnxtrain.sklearn import MLPRegressor, OnnxRegressor

sys.path.insert(0, str(ROOT / "examples"))
from make_mlp import make_mlp  # noqa: E402

SIZES = [4, 8, 1]
SYNTAX = 'expected "cpu", "cuda", "cuda:N"'
needs_missing_cuda = pytest.mark.skipif(ot.cuda_available(),
                                        reason="a CUDA device is present; the missing-CUDA errors cannot be observed")


@pytest.fixture(scope="module")
def model():
    return make_mlp(SIZES, seed=1)


def data(n=16, seed=0, scale=1.0):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (n, SIZES[0])).astype(np.float32)
    y = np.sin(x.sum(axis=1, keepdims=True)).astype(np.float32)
    return x * np.float32(scale), y


def test_device_names_are_checked_by_parse_device(model):
    assert ot.TrainingSession(model, device="cpu").infer({"x": data()[0]})[0].shape == (16, 1)
    assert ot.TrainingSession(model, device=ot.Device.CPU).config.device == "cpu"
    for bad in ["gpu", "cuda:x", "CUDA:0", "cuda:-1"]:
        with pytest.raises(ot.OnnxtrainError, match=SYNTAX):
            ot.TrainingSession(model, device=bad)
    with pytest.raises(TypeError, match="device"):
        ot.TrainingSession(model, device=0)


@needs_missing_cuda
@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:3", ot.Device.CUDA])
def test_python_api_names_what_is_missing(model, device):
    why = ot.cuda_unavailable_reason()
    assert why
    with pytest.raises(ot.OnnxtrainError) as e:
        ot.TrainingSession(model, device=device)
    assert "requested, but " + why in str(e.value)
    with pytest.raises(ot.OnnxtrainError) as e:
        ot.ForwardBackwardSession(model, device=device)
    assert why in str(e.value)


def test_guarded_device_trains_as_the_cpu_does(model):
    # The guarded test device (docs/gpu.md): its memory faults when host code touches it, so a whole train_step,
    # the scalar state and the weights crossing the edge from Python prove the binding goes through the edge.
    x, y = data(16)
    cpu = ot.TrainingSession(model, device="cpu", optimizer="adam", learning_rate=0.01)
    dev = ot.TrainingSession(model, device=ot.Device.GUARDED, optimizer="adam", learning_rate=0.01)
    assert dev.config.device == "guarded"
    for _ in range(3):
        feeds = {"x": x, cpu.target_name: y}
        a, b = cpu.train_step(feeds), dev.train_step(feeds)
        assert abs(a - b) <= 1e-5 * (1 + abs(a))
    assert dev.step == cpu.step == 3
    dev.learning_rate = 0.5
    assert dev.learning_rate == 0.5
    for name, w in cpu.weights().items():
        np.testing.assert_allclose(dev.weights()[name], w, rtol=1e-5, atol=1e-6)


def test_default_device_comes_from_the_environment(model, python_env, tmp_path):
    # ONNXTRAIN_DEVICE sets the device of every configuration that names none; an explicit device wins.
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    code = ("import onnxtrain as ot, sys; from onnxtrain.sklearn import MLPRegressor\n"
            "print(ot.TrainingSession(sys.argv[1]).config.device, ot.TrainingSession(sys.argv[1], device='cpu').config.device,"
            " ot.make_config().device, MLPRegressor().device)")
    env = dict(python_env, ONNXTRAIN_DEVICE="guarded")
    out = subprocess.run([sys.executable, "-c", code, str(path)], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["guarded", "cpu", "guarded", "None"]
    env.pop("ONNXTRAIN_DEVICE")
    out = subprocess.run([sys.executable, "-c", code, str(path)], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["cpu", "cpu", "cpu", "None"]


def test_estimators_take_a_device_parameter(model):
    est = MLPRegressor(hidden_layer_sizes=(4,), max_iter=2, device="cuda:1")
    assert est.get_params()["device"] == "cuda:1"
    assert clone(est).device == "cuda:1"
    est.set_params(device="cpu")
    x, y = data(32)
    est.fit(x, y.ravel())  # on the CPU
    assert OnnxRegressor(model, device="cuda:0").get_params()["device"] == "cuda:0"


@needs_missing_cuda
@pytest.mark.parametrize("make", [lambda m: MLPRegressor(hidden_layer_sizes=(4,), max_iter=2, device="cuda:0"),
                                  lambda m: OnnxRegressor(m, max_iter=2, device="cuda:0")])
def test_estimators_name_what_is_missing(model, make):
    x, y = data(32)
    with pytest.raises(ot.OnnxtrainError) as e:
        make(model).fit(x, y.ravel())
    assert "device 'cuda:0' requested, but " + ot.cuda_unavailable_reason() in str(e.value)


@needs_missing_cuda
def test_cli_config_names_file_line_and_what_is_missing(model, build_dir, tmp_path):
    onnx.save(model, tmp_path / "m.onnx")
    x, y = data(32)
    np.savez(tmp_path / "d.npz", x=x, y=y)
    cfg = tmp_path / "run.yaml"
    cfg.write_text("model: m.onnx\ndata:\n  train: d.npz\ndevice: cuda:0\n")
    r = subprocess.run([str(build_dir / "cli" / "onnxtrain"), "train", str(cfg)], capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    assert f"{cfg}:4: device 'cuda:0' requested, but {ot.cuda_unavailable_reason()}" in r.stderr


def test_mixed_precision_scale_matches_torch_grad_scaler(model):
    torch = pytest.importorskip("torch")
    overflow = [False, False, False, True, False, False, False, True, True, False, False, False, False]
    s = ot.TrainingSession(model, loss="mse", optimizer="sgd", learning_rate=0.01,
                           mixed_precision={"dtype": "float16", "init_scale": 16.0, "growth_interval": 3})
    assert s.loss_scale == 16.0
    lin = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(lin.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=16.0, growth_interval=3)
    for i, o in enumerate(overflow):
        x, y = data(seed=i, scale=1e5 if o else 1.0)  # 1e5 is beyond float16: the step overflows
        before = s.weights()
        s.train_step({"x": x, s.target_name: y})
        opt.zero_grad()
        loss = lin(torch.ones(1, 2)).pow(2).sum() * (float("inf") if o else 1.0)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        assert s.loss_scale == scaler.get_scale(), i
        if o:
            for k, v in before.items():
                np.testing.assert_array_equal(s.weights()[k], v, err_msg=f"step {i}: {k} changed on an overflow")
    assert s.overflow_steps == sum(overflow)
    assert s.step == len(overflow) - sum(overflow)


def test_mixed_precision_config_forms():
    assert ot.make_mixed_precision(None).dtype == "none"
    assert ot.make_mixed_precision("bfloat16").dtype == "bfloat16"
    spec = ot.make_mixed_precision({"dtype": "float16", "growth_interval": 10})
    assert (spec.dtype, spec.growth_interval, spec.init_scale) == ("float16", 10, 65536.0)
    with pytest.raises(TypeError, match="mixed_precision"):
        ot.make_mixed_precision(3)


def test_cli_trains_in_mixed_precision_and_resumes(model, build_dir, tmp_path):
    onnx.save(model, tmp_path / "m.onnx")
    x, y = data(256)
    np.savez(tmp_path / "d.npz", x=x, y=y)
    cfg = tmp_path / "run.yaml"
    cfg.write_text("model: m.onnx\ndata:\n  train: d.npz\ntrain: {epochs: 2, batch_size: 16}\n"
                   "mixed_precision: {dtype: float16, growth_interval: 10}\nlog: {progress: none}\n")
    cli = str(build_dir / "cli" / "onnxtrain")
    r = subprocess.run([cli, "train", str(cfg)], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    ckpt = sorted((tmp_path / "runs" / "run" / "checkpoints").glob("step-*.onnx"))[-1]
    s = ot.TrainingSession.from_checkpoint(str(ckpt))
    assert "mixed_precision.loss_scale" in s.state_names
    # 32 batches: each one an optimizer step or a counted overflow (2^16 starts above what float16 holds here).
    assert s.step + s.overflow_steps == 32 and s.overflow_steps >= 1
    assert s.loss_scale in [2.0 ** k for k in range(10, 18)]
    exported = onnx.load(tmp_path / "runs" / "run" / "model.onnx")
    assert [n.op_type for n in exported.graph.node] == [n.op_type for n in model.graph.node]  # no casts left
    r = subprocess.run([cli, "resume", str(ckpt), "--set", "train.epochs=3"], capture_output=True, text=True,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr
