"""The README's example end to end: make an MLP, train it with the C++ example, and check the exported model
with the ONNX checker and onnxruntime (an independent runtime) against onnxtrain's own predictions."""
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort

from conftest import ROOT


def run_ort(path, x):
    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return s.run(None, {"x": x})[0]


def test_trained_model_runs_in_onnxruntime(tmp_path, build_dir):
    model = tmp_path / "mlp.onnx"
    subprocess.run([sys.executable, ROOT / "examples" / "make_mlp.py", model], check=True, capture_output=True)
    out = subprocess.run([build_dir / "examples" / "train_mlp", model, "--epochs", "3", "--samples", "2048",
                          "--out", tmp_path / "trained.onnx", "--dump", tmp_path],
                         check=True, capture_output=True, text=True).stdout
    losses = [float(l.split()[-1]) for l in out.splitlines() if l.startswith("epoch")]
    assert len(losses) == 3 and losses[-1] < losses[0], out

    trained = onnx.load(tmp_path / "trained.onnx")
    onnx.checker.check_model(trained, full_check=True)
    x, y = np.load(tmp_path / "x.npy"), np.load(tmp_path / "y.npy")
    ours = np.load(tmp_path / "pred.npy")
    theirs = run_ort(tmp_path / "trained.onnx", x)
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)
    before = np.mean((run_ort(model, x) - y) ** 2)
    after = np.mean((theirs - y) ** 2)
    assert after < before / 5, (before, after)


def test_bad_model_path_is_a_clear_error(tmp_path, build_dir):
    r = subprocess.run([build_dir / "examples" / "train_mlp", tmp_path / "missing.onnx"], capture_output=True, text=True)
    assert r.returncode == 1
    assert "missing.onnx" in r.stderr


import pytest  # noqa: E402


@pytest.mark.parametrize("options", [
    ["--optimizer", "sgd", "--momentum", "0.9", "--lr", "0.01"],
    ["--optimizer", "adam", "--lr", "0.001", "--schedule", "cosine"],
    ["--optimizer", "adamw", "--lr", "0.001", "--schedule", "linear"],
    ["--optimizer", "adagrad", "--lr", "0.05", "--loss", "huber"],
])
def test_example_trains_with_each_optimizer(tmp_path, build_dir, options):
    model = tmp_path / "mlp.onnx"
    subprocess.run([sys.executable, ROOT / "examples" / "make_mlp.py", model], check=True, capture_output=True)
    out = subprocess.run([build_dir / "examples" / "train_mlp", model, "--epochs", "3", "--samples", "2048", *options],
                         check=True, capture_output=True, text=True).stdout
    losses = [float(l.split()[-1]) for l in out.splitlines() if l.startswith("epoch")]
    assert len(losses) == 3 and losses[-1] < 0.5 * losses[0], out


def test_unknown_optimizer_is_a_clear_error(tmp_path, build_dir):
    model = tmp_path / "mlp.onnx"
    subprocess.run([sys.executable, ROOT / "examples" / "make_mlp.py", model], check=True, capture_output=True)
    r = subprocess.run([build_dir / "examples" / "train_mlp", model, "--optimizer", "adom"], capture_output=True, text=True)
    assert r.returncode == 1
    assert "optimizer.kind" in r.stderr and "adam" in r.stderr
