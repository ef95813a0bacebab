"""Every example in examples/python/ runs (the sklearn ones are run by test_sklearn_*.py, which check what they
print); this file runs the rest and checks their results."""
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import onnxruntime as ort

from conftest import ROOT

EXAMPLES = ROOT / "examples" / "python"


def test_every_example_has_a_test():
    tests = "".join(p.read_text() for p in (ROOT / "tests" / "python").glob("test_*.py"))
    for example in EXAMPLES.glob("*.py"):
        assert f'"{example.name}"' in tests, f"{example.name} is not run by any test"


def test_train_session_example(python_env, tmp_path):
    out = subprocess.run([sys.executable, EXAMPLES / "train_session.py", tmp_path], check=True, capture_output=True,
                         text=True, env=python_env).stdout
    fields = dict(part.split("=") for part in out.split())
    assert int(fields["steps"]) == 400
    assert float(fields["last_loss"]) < float(fields["first_loss"]) / 5, out
    x = np.random.default_rng(1).standard_normal((64, 8)).astype(np.float32)
    y = np.sin(x[:, :1]) + 0.5 * x[:, 1:2] ** 2
    (pred,) = ort.InferenceSession(str(pathlib.Path(tmp_path) / "trained.onnx"),
                                   providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert np.mean((pred - y) ** 2) < 0.25  # the exported model generalises to fresh samples


def test_train_replicas_example(python_env, tmp_path):
    out = subprocess.run([sys.executable, EXAMPLES / "train_replicas.py", tmp_path], check=True, capture_output=True,
                         text=True, env=python_env).stdout
    fields = dict(part.split("=") for part in out.split() if "=" in part and not part.startswith("replicas"))
    assert float(fields["largest_relative_gap"]) < 1e-3, out  # float rounding, not a different step
    assert fields["resumed_step"] == "192" and fields["resumed_weights_equal"] == "True", out


def test_train_control_flow_example(python_env, tmp_path):
    # A torch while loop (a Loop whose condition its body computes) trains, and the exported model runs in
    # onnxruntime to the same predictions.
    pytest.importorskip("torch")
    out = subprocess.run([sys.executable, EXAMPLES / "train_control_flow.py", tmp_path], check=True,
                         capture_output=True, text=True, env=python_env).stdout
    fields = dict(part.split("=") for part in out.split())
    assert int(fields["steps"]) == 240
    assert float(fields["last_loss"]) < float(fields["first_loss"]) / 5, out
    rng = np.random.default_rng(0)
    x = rng.standard_normal((512, 4)).astype(np.float32)
    y = np.sin(x[:, :1]) + x[:, 1:2] * x[:, 2:3]
    (pred,) = ort.InferenceSession(str(pathlib.Path(tmp_path) / "trained.onnx"),
                                   providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert abs(float(np.mean((pred - y) ** 2)) - float(fields["mse"])) < 1e-3, out
