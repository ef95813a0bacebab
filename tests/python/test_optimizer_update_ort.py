"""The optimizer's update ops (onnxtrain.AdamUpdate and its variants, formulas/optimizer_updates.h) travel in
checkpoints as functions of standard ONNX: the bodies a checkpoint carries pass the full checker and, run by
onnxruntime, compute torch's update as numpy writes it out here, bit for bit in float32 and float64."""
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import helper  # noqa: E402

import onnxtrain  # noqa: E402
from test_checkpoint_opsets import batch, relu_mlp  # noqa: E402


def checkpoint(tmp_path, **optimizer):
    s = onnxtrain.TrainingSession(relu_mlp(17), loss="mse", optimizer=onnxtrain.OptimizerSpec(**optimizer))
    x, t = batch(1)
    s.train_step({"x": x, s.target_name: t})
    path = tmp_path / "ckpt.onnx"
    s.save_checkpoint(str(path))
    m = onnx.load(str(path))
    onnx.checker.check_model(m, full_check=True)
    return m


def run_body(function, dtype, feeds):
    """One node calling `function`, as a model of its own, run by onnxruntime with no graph optimisation."""
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    inputs = [helper.make_tensor_value_info(n, elem, list(feeds[n].shape)) for n in function.input]
    outputs = [helper.make_tensor_value_info(n, elem, list(feeds["P"].shape)) for n in function.output]
    node = helper.make_node(function.name, list(function.input), list(function.output), domain=function.domain)
    graph = helper.make_graph([node], "update", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("onnxtrain", 1)],
                              functions=[function])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return dict(zip(function.output, session.run(None, feeds)))


def reference(f, kind, amsgrad):
    """docs/optimizers.md's Adam, element by element in numpy's (IEEE, uncontracted) arithmetic, torch's order."""
    d = f["G"] + f["P"] * f["Decay"] if kind == "l2" else f["G"]
    m = f["M"] * f["Beta1"] + d * f["OneMinusBeta1"]
    v = f["V"] * f["Beta2"] + d * d * f["OneMinusBeta2"]
    out = {"M_new": m, "V_new": v}
    second = v
    if amsgrad:
        second = out["Vmax_new"] = np.maximum(f["Vmax"], v)
    denom = np.sqrt(second) / f["BiasCorrection2Sqrt"] + f["Eps"]
    base = f["P"] * f["Decay"] if kind == "decoupled" else f["P"]
    out["P_new"] = base - f["StepSize"] * m / denom
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kind,amsgrad,op", [("adam", False, "AdamUpdate"), ("adam", True, "AdamAmsgradUpdate"),
                                             ("adamw", False, "AdamWUpdate"), ("adamw", True, "AdamWAmsgradUpdate"),
                                             ("l2", False, "AdamL2Update")])
def test_checkpointed_update_body_runs_in_onnxruntime_as_documented(tmp_path, dtype, kind, amsgrad, op):
    spec = {"adam": dict(kind="adam"), "adamw": dict(kind="adamw", weight_decay=0.01),
            "l2": dict(kind="adam", weight_decay=0.01)}[kind]
    m = checkpoint(tmp_path, amsgrad=amsgrad, learning_rate=1e-3, **spec)
    carried = {f.name: f for f in m.functions if f.domain == "onnxtrain"}
    assert op in carried, sorted(carried)
    function = carried[op]
    rng = np.random.default_rng(3)
    shape = (5, 7)
    feeds = {}
    for name in function.input:
        if name in ("P", "G", "M"):
            feeds[name] = rng.normal(size=shape).astype(dtype)
        elif name in ("V", "Vmax"):
            feeds[name] = rng.uniform(1e-6, 1e-2, size=shape).astype(dtype)
    b1, b2, lr, t = 0.9, 0.999, 1e-3, 3
    scalars = {"Beta1": b1, "OneMinusBeta1": 1 - b1, "Beta2": b2, "OneMinusBeta2": 1 - b2,
               "BiasCorrection2Sqrt": np.sqrt(1 - b2 ** t), "Eps": 1e-8, "StepSize": lr / (1 - b1 ** t),
               "Decay": 0.01 if kind == "l2" else 1 - lr * 0.01}
    for name in function.input:
        if name in scalars:
            feeds[name] = np.array(scalars[name], dtype=dtype)
    assert set(feeds) == set(function.input)
    got = run_body(function, dtype, feeds)
    want = reference(feeds, {"adam": "none", "adamw": "decoupled", "l2": "l2"}[kind], amsgrad)
    assert set(got) == set(want)
    for name, value in want.items():
        assert got[name].dtype == dtype
        np.testing.assert_array_equal(got[name], value, err_msg=name)
