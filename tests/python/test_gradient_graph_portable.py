"""Our gradient graph is plain ONNX: it passes the full checker, and onnxruntime (which knows nothing of
onnxtrain) runs it, inlining the fused-gradient functions, to the gradients an independent numpy computation
gives."""
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort

from conftest import ROOT
from mlp_reference import compare, mlp_loss_and_grads


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
