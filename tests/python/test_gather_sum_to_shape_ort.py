"""onnxtrain.GatherGrad and onnxtrain.SumToShape travel as functions of standard ONNX: a gradient graph that
uses both (an embedding whose rows are broadcast against an input with a symbolic batch dim) passes the full
checker and gives, in onnxruntime, the gradient numpy computes by hand, when the run-time shapes broadcast and
when they do not."""
import subprocess

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper


def embedding_plus_input(path):
    # y = Gather(emb, tokens) + x, tokens ['b', 4], x ['p', 4, 3]: whether the gathered rows were broadcast
    # along the first dim is known only at run time.
    emb = np.arange(30, dtype=np.float32).reshape(10, 3) / 10
    graph = helper.make_graph(
        [helper.make_node("Gather", ["emb", "tokens"], ["e"]), helper.make_node("Add", ["e", "x"], ["y"])], "emb",
        [helper.make_tensor_value_info("tokens", TensorProto.INT64, ["b", 4]),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, ["p", 4, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["q", 4, 3])],
        [numpy_helper.from_array(emb, "emb")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return emb


@pytest.mark.parametrize("batches", [(1, 2), (2, 2)])
def test_gather_grad_and_sum_to_shape_bodies_run_in_onnxruntime(tmp_path, build_dir, batches):
    model, grad_model = tmp_path / "emb.onnx", tmp_path / "grad.onnx"
    emb = embedding_plus_input(model)
    subprocess.run([build_dir / "cli" / "onnxtrain", "gradient-graph", model, "-o", grad_model], check=True)
    m = onnx.load(grad_model)
    onnx.checker.check_model(m, full_check=True)
    assert {"GatherGrad", "SumToShape"} <= {f.name for f in m.functions}

    b, p = batches
    rng = np.random.default_rng(0)
    tokens = np.array([[3, -1, 3, 0], [9, 9, 1, -10]][:b], dtype=np.int64)  # repeated and negative
    x = rng.normal(size=(p, 4, 3)).astype(np.float32)
    target = rng.normal(size=(p, 4, 3)).astype(np.float32)
    sess = ort.InferenceSession(str(grad_model), providers=["CPUExecutionProvider"])
    (target_name,) = [i.name for i in sess.get_inputs() if i.name not in ("tokens", "x")]
    feeds = {"tokens": tokens, "x": x, target_name: target}
    out = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))

    y = emb[tokens].astype(np.float64) + x  # broadcast over the first dim when b == 1
    g = 2 * (y - target) / y.size  # mean((y - t)^2)
    g_rows = g.sum(axis=0, keepdims=True) if b == 1 else g
    want = np.zeros_like(emb, dtype=np.float64)
    np.add.at(want, tokens.reshape(-1) % 10, g_rows.reshape(-1, 3))
    np.testing.assert_allclose(out["emb_grad"], want, rtol=1e-5, atol=1e-7)
