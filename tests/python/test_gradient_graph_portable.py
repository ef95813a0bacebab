"""Our gradient graph is plain ONNX: it passes the full checker, and onnxruntime (which knows nothing of
onnxtrain) runs it, inlining the fused-gradient functions, to the gradients an independent numpy computation
gives."""
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from conftest import ROOT
from mlp_reference import compare, mlp_loss_and_grads
import torch_parity_models


def test_onnxruntime_runs_our_gradient_graph(tmp_path, build_dir):
    model = tmp_path / "mlp.onnx"
    subprocess.run([sys.executable, ROOT / "examples" / "make_mlp.py", model, "--sizes", "8", "16", "16", "1"],
                   check=True, capture_output=True)
    grad_model = tmp_path / "grad.onnx"
    subprocess.run([build_dir / "cli" / "onnxtrain", "gradient-graph", model, "-o", grad_model], check=True)

    m = onnx.load(grad_model)
    onnx.checker.check_model(m, full_check=True)
    assert {f.name for f in m.functions} >= {"ReluGrad"}, "the fused ReluGrad should travel as a function"
    assert all(n.domain in ("", "onnxtrain") for n in m.graph.node)

    rng = np.random.default_rng(0)
    x = rng.normal(size=(5, 8)).astype(np.float32)
    t = rng.normal(size=(5, 1)).astype(np.float32)
    sess = ort.InferenceSession(str(grad_model), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    out = dict(zip(names, sess.run(None, {"x": x, "target": t})))
    ref_loss, ref = mlp_loss_and_grads(onnx.load(model), x, t)
    bad = compare(float(out["loss"]), {k: out[k + "_grad"] for k in ref}, ref_loss, ref)
    assert not bad, bad


def test_unknown_trainable_is_named(tmp_path, build_dir):
    model = tmp_path / "mlp.onnx"
    subprocess.run([sys.executable, ROOT / "examples" / "make_mlp.py", model], check=True, capture_output=True)
    r = subprocess.run([build_dir / "cli" / "onnxtrain", "gradient-graph", model, "-o", tmp_path / "g.onnx",
                        "--trainable", "fc9.weight"], capture_output=True, text=True)
    assert r.returncode == 1
    assert "fc9.weight" in r.stderr and "not an initializer" in r.stderr
    assert not (tmp_path / "g.onnx").exists()


@pytest.mark.parametrize("name", ["cnn", "transformer", "conv1d", "gelu_mlp"])
def test_onnxruntime_runs_torch_models_gradient_graphs(tmp_path, build_dir, name):
    """A CNN (BatchNorm in training mode, a residual block, pooling), a transformer encoder (embeddings, masked
    attention, LayerNorm, Gelu at opset 20) and a 1D-conv model (GELU exported at opset 17 as its Erf formula,
    which the gelu_erf subgraph rule turns into one GeluGrad) and an MLP with both tanh-GELU forms (GeluTanhGrad), exported from torch: `onnxtrain gradient-graph` writes their MSE
    gradient graphs, which pass the full checker and give torch's gradients in onnxruntime. (That our executor
    gives the same is tests/training/test_run_forward_backward_torch.cpp.)"""
    model, fixtures_path = torch_parity_models.generate(name, tmp_path)
    fixtures = torch_parity_models.load_fixtures(fixtures_path)
    params = sorted(k[len("mse_grad/"):] for k in fixtures if k.startswith("mse_grad/"))
    grad_model = tmp_path / "grad.onnx"
    subprocess.run([build_dir / "cli" / "onnxtrain", "gradient-graph", model, "-o", grad_model,
                    "--trainable", ",".join(params)], check=True)
    grads = torch_parity_models.run_gradient_graph_in_ort(grad_model, fixtures)  # full_check inside
    assert sorted(grads) == params
    errors = {k: torch_parity_models.relative_error(g, fixtures[f"mse_grad/{k}"]) for k, g in grads.items()}
    assert max(errors.values()) < 1e-4, errors
