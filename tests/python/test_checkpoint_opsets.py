"""Checkpoints and gradient graphs of models at older opsets (13, 14): the fused gradient ops' standard-ONNX bodies
need opset 15 and later (CastLike), and a model-local function must import its model's opset. A checkpoint leaves
such a body out and stays checker-valid (onnxtrain resumes it with its own kernels); export_gradient_model refuses,
naming the op and the opset that would do. At opset 16 and later the bodies travel."""
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import onnxtrain  # noqa: E402


def relu_mlp(opset):
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.normal(size=(4, 3)).astype(np.float32), "W1")
    w2 = numpy_helper.from_array(rng.normal(size=(3, 2)).astype(np.float32), "W2")
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W1"], ["a"]), helper.make_node("Relu", ["a"], ["r"]),
         helper.make_node("MatMul", ["r", "W2"], ["y"])],
        "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 2])], [w1, w2])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m.SerializeToString()


def batch(seed):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(8, 4)).astype(np.float32), rng.normal(size=(8, 2)).astype(np.float32)


@pytest.mark.parametrize("opset", [13, 14, 16, 17])
def test_checkpoint_of_an_older_opset_model_passes_the_checker_and_resumes(opset, tmp_path):
    s = onnxtrain.TrainingSession(relu_mlp(opset), loss="mse", optimizer="adam")
    x, t = batch(1)
    s.train_step({"x": x, s.target_name: t})
    path = tmp_path / "ckpt.onnx"
    s.save_checkpoint(str(path))
    ckpt = onnx.load(str(path))
    onnx.checker.check_model(ckpt, full_check=True)
    carried = {f.name for f in ckpt.functions}
    # The optimizer's update op's body needs only opset 13 ops (formulas/optimizer_updates.h): it always travels.
    assert carried == (set() if opset < 15 else {"ReluGrad"}) | {"AdamUpdate"}, carried
    # Resumed, it trains on exactly as the session that saved it.
    r = onnxtrain.TrainingSession.from_checkpoint(str(path))
    x2, t2 = batch(2)
    assert r.train_step({"x": x2, r.target_name: t2}) == s.train_step({"x": x2, s.target_name: t2})


@pytest.mark.parametrize("opset", [13, 14])
def test_gradient_graph_export_at_an_older_opset_names_the_op_and_the_opset_needed(opset):
    s = onnxtrain.TrainingSession(relu_mlp(opset), loss="mse")
    with pytest.raises(onnxtrain.OnnxtrainError, match=r"opset %d.*onnxtrain\.ReluGrad.*needs opset 15 or later.*CastLike"
                       % opset):
        s.export_gradient_model()


def test_gradient_graph_export_at_opset_16_is_checker_valid():
    s = onnxtrain.TrainingSession(relu_mlp(16), loss="mse")
    onnx.checker.check_model(s.export_gradient_model(), full_check=True)
