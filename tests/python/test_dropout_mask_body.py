"""onnxtrain.DropoutMask's standard-ONNX function body (gradients/fused_dropout.cpp) in another runtime.

A checkpoint of a run with LoRA adapter dropout holds the training forward, DropoutMask nodes included, and
carries the op's body as a model-local function: onnx.checker accepts it with full_check, and onnxruntime runs it
to the masks of the documented draw (docs/lora.md, Dropout), recomputed here in numpy uint64, which are also
the masks onnxtrain's own kernel draws.
"""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxtrain as ot

ort = pytest.importorskip("onnxruntime")

U64 = np.uint64


def splitmix64(z):
    """splitmix64 over uint64 arrays, wrapping as uint64 does."""
    with np.errstate(over="ignore"):
        z = z + U64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> U64(30))) * U64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> U64(27))) * U64(0x94D049BB133111EB)
        return z ^ (z >> U64(31))


def reference_mask(seed, counter, ratio, shape):
    """run = splitmix64(splitmix64(seed) ^ counter); element i (row-major) is kept when
    (splitmix64(run + i) >> 11) * 2^-53 >= ratio, the ratio a float32 widened to double."""
    as_u64 = lambda v: np.array([v], dtype=np.int64).view(np.uint64)  # noqa: E731  (two's complement bits)
    run = splitmix64(splitmix64(as_u64(seed)) ^ as_u64(counter))
    with np.errstate(over="ignore"):
        drawn = splitmix64(run + np.arange(int(np.prod(shape)), dtype=np.uint64))
    u = (drawn >> U64(11)).astype(np.float64) * 2.0**-53
    return (u >= float(np.float32(ratio))).reshape(shape)


def test_reference_is_splitmix64():
    # The published first outputs of splitmix64 seeded with 0.
    assert splitmix64(np.array([0], dtype=np.uint64))[0] == 0xE220A8397B1DCDAF
    assert splitmix64(np.array([0x9E3779B97F4A7C15], dtype=np.uint64))[0] == 0x6E789E6AA1B965F4


def mlp(opset=17):
    """x [8, 6] -> MatMul -> Add -> Relu -> MatMul -> y [8, 3]: two weights LoRA adapts (all-linear)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((6, 16)).astype(np.float32) * 0.4, "w1"),
             numpy_helper.from_array(rng.standard_normal(16).astype(np.float32) * 0.1, "b1"),
             numpy_helper.from_array(rng.standard_normal((16, 3)).astype(np.float32) * 0.4, "w2")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["y"])]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 3])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m.SerializeToString()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A LoRA session with adapter dropout after two steps, its adapters' B made large so that a different mask
    would change the outputs plainly, and its checkpoint."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((8, 6)).astype(np.float32)
    t = rng.standard_normal((8, 3)).astype(np.float32)
    adapter = {"kind": "lora", "rank": 2, "alpha": 4, "dropout": 0.4, "seed": 5}
    s = ot.TrainingSession(mlp(), loss="mse", optimizer="adamw", learning_rate=1e-2, adapter=adapter)
    feeds = {"x": x, s.target_name: t}
    for _ in range(2):
        s.train_step(feeds)
    for name in s.trainable:
        if name.endswith("lora_B"):
            s.set_weight(name, rng.standard_normal(s.get_weight(name).shape).astype(np.float32))
    path = tmp_path_factory.mktemp("dropout_body") / "ckpt.onnx"
    s.save_checkpoint(str(path))
    return s, feeds, path


def dropout_nodes(model):
    return [n for n in model.graph.node if n.domain == "onnxtrain" and n.op_type == "DropoutMask"]


def test_checkpoint_carries_the_body_and_passes_the_full_checker(checkpoint):
    s, feeds, path = checkpoint
    m = onnx.load(str(path))
    assert len(dropout_nodes(m)) == 2, "one mask per adapted weight"
    (body,) = [f for f in m.functions if (f.domain, f.name) == ("onnxtrain", "DropoutMask")]
    assert sorted(body.attribute) == ["ratio", "seed"]
    assert {n.domain for n in body.node} == {""}, "a standard-ONNX body"
    assert [(o.domain, o.version) for o in body.opset_import] == [("", 17)], "the model's opset"
    onnx.checker.check_model(m, full_check=True)
    # onnxtrain resumes it with its own kernel, at the same step (gradients() does not advance the counter).
    r = ot.TrainingSession.from_checkpoint(str(path))
    assert r.gradients(feeds)[0] == s.gradients(feeds)[0]


def test_onnxruntime_runs_the_checkpoints_training_forward_with_the_masks_onnxtrain_draws(checkpoint):
    """The checkpoint's main graph is the training forward at its stored step: onnxruntime runs it through the
    body. Its output equals the same graph with each DropoutMask replaced by the numpy reference's mask, and its
    loss is the one onnxtrain computes at that step (gradients() draws at the current counter)."""
    s, feeds, path = checkpoint
    m = onnx.load(str(path))
    counter = int(numpy_helper.to_array(next(i for i in m.graph.initializer if i.name == "lora/dropout/step")))
    assert counter == 2
    run = lambda model: ort.InferenceSession(model.SerializeToString(),  # noqa: E731
                                             providers=["CPUExecutionProvider"]).run(None, {"x": feeds["x"]})[0]
    y_body = run(m)

    shapes = {"x": feeds["x"].shape, "r": (8, 16)}  # each branch's input: the model input, the Relu output
    fixed = onnx.load(str(path))
    masks = 0
    for i, n in enumerate(fixed.graph.node):
        if n.op_type != "DropoutMask":
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        assert attrs["ratio"] == pytest.approx(0.4)
        keep = reference_mask(attrs["seed"], counter, attrs["ratio"], shapes[n.input[0]])
        assert 0 < keep.mean() < 1, "a mask that keeps or drops everything would agree vacuously"
        fixed.graph.node[i].CopyFrom(helper.make_node("Constant", [], [n.output[0]],
                                                      value=numpy_helper.from_array(keep)))
        masks += 1
    assert masks == 2
    np.testing.assert_array_equal(y_body, run(fixed))

    loss, _ = s.gradients(feeds)
    ort_loss = float(np.mean((y_body.astype(np.float64) - feeds[s.target_name]) ** 2))
    assert ort_loss == pytest.approx(loss, rel=1e-5)


def one_node_model(body, shape, seed, ratio):
    """DropoutMask alone, with the body a checkpoint carries, at the checkpoint's opsets."""
    node = helper.make_node("DropoutMask", ["x", "counter"], ["mask"], domain="onnxtrain", seed=seed, ratio=ratio)
    g = helper.make_graph([node], "dropout_mask",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape)),
                           helper.make_tensor_value_info("counter", TensorProto.INT64, [])],
                          [helper.make_tensor_value_info("mask", TensorProto.BOOL, list(shape))])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("onnxtrain", 1)],
                          functions=[body] if body is not None else None)
    m.ir_version = 8
    return m


def onnxtrain_mask(shape, seed, counter, ratio):
    """onnxtrain's native kernel (the model has no function): a session's infer of Cast(mask) * w, w = 1."""
    node = helper.make_node("DropoutMask", ["x", "counter"], ["mask"], domain="onnxtrain", seed=seed, ratio=ratio)
    g = helper.make_graph([node, helper.make_node("Cast", ["mask"], ["maskf"], to=TensorProto.FLOAT),
                           helper.make_node("Mul", ["maskf", "w"], ["y"])], "kernel",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))],
                          [numpy_helper.from_array(np.array([1.0], np.float32), "w"),
                           numpy_helper.from_array(np.array(counter, np.int64), "counter")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("onnxtrain", 1)])
    m.ir_version = 8
    s = ot.TrainingSession(m.SerializeToString(), trainable=["w"], loss="mse")
    (y,) = s.infer({"x": np.zeros(shape, np.float32)})
    return y == 1.0


CASES = [  # shape, seed, counter, ratio
    ((7,), 0, 0, 0.5),
    ((3, 5), 7, 3, 0.3),
    ((2, 3, 4), -1, 41, 0.1),
    ((33, 17), 2**63 - 1, 2**63 - 1, 0.5),
    ((5, 6), -(2**63), 12, 0.0),  # ratio 0 keeps everything
    ((1,), 0x5A17C0DE12345678, 1, 0.999),
    ((64, 50), -3750763034362895579, 20, 0.25),  # FNV-1a's offset basis as int64, as branch seeds are
]


@pytest.mark.parametrize("shape,seed,counter,ratio", CASES)
def test_body_in_onnxruntime_equals_numpy_and_onnxtrains_kernel(checkpoint, shape, seed, counter, ratio):
    _, _, path = checkpoint
    (body,) = [f for f in onnx.load(str(path)).functions if f.name == "DropoutMask"]
    m = one_node_model(body, shape, seed, ratio)
    onnx.checker.check_model(m, full_check=True)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    (mask,) = sess.run(None, {"x": np.zeros(shape, np.float32), "counter": np.array(counter, np.int64)})
    expected = reference_mask(seed, counter, ratio, shape)
    assert mask.dtype == np.bool_ and mask.shape == shape
    np.testing.assert_array_equal(mask, expected)
    np.testing.assert_array_equal(onnxtrain_mask(shape, seed, counter, ratio), expected)
    if ratio == 0.0:
        assert mask.all()
    elif mask.size > 100:
        assert abs((1 - mask.mean()) - ratio) < 0.06, mask.mean()


def test_body_keeps_an_empty_shape(checkpoint):
    _, _, path = checkpoint
    (body,) = [f for f in onnx.load(str(path)).functions if f.name == "DropoutMask"]
    m = one_node_model(body, (2, 0, 3), 11, 0.5)
    (mask,) = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": np.zeros((2, 0, 3), np.float32), "counter": np.array(2, np.int64)})
    assert mask.shape == (2, 0, 3) and mask.dtype == np.bool_
