"""The thin binding (onnxtrain.TrainingSession, ForwardBackwardSession, the spec classes): results against an
independent numpy reference, every way a model comes in, checkpoints, errors, threads and the GIL, stubs."""
import ast
import collections
import copy
import pathlib
import pickle
import sys
import threading

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import onnxtrain as ot
from onnxtrain import _onnxtrain
from conftest import ROOT
from mlp_reference import mlp_loss_and_grads

sys.path.insert(0, str(ROOT / "examples"))
from make_mlp import make_mlp  # noqa: E402

SIZES = [5, 16, 3]


@pytest.fixture(scope="module")
def model():
    return make_mlp(SIZES, seed=1)


@pytest.fixture(scope="module")
def model_path(model, tmp_path_factory):
    p = tmp_path_factory.mktemp("m") / "mlp.onnx"
    onnx.save(model, p)
    return p


def batch(n=32, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, SIZES[0])).astype(np.float32)
    y = rng.standard_normal((n, SIZES[-1])).astype(np.float32)
    return x, y


def test_gradients_match_numpy_reference(model):
    s = ot.TrainingSession(model, loss="mse")
    x, y = batch()
    loss, grads = s.gradients({"x": x, s.target_name: y})
    ref_loss, ref_grads = mlp_loss_and_grads(model, x, y)
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    assert set(grads) == set(ref_grads) == set(s.trainable)
    for k in grads:
        np.testing.assert_allclose(grads[k], ref_grads[k], rtol=1e-4, atol=1e-6, err_msg=k)


def test_sgd_step_is_w_minus_lr_g(model):
    s = ot.TrainingSession(model, optimizer="sgd", learning_rate=0.05)
    x, y = batch()
    before = s.weights()
    _, g = s.gradients({"x": x, "target": y})
    loss = s.train_step(x=x, target=y)  # keyword feeds
    assert loss == pytest.approx(mlp_loss_and_grads(model, x, y)[0], rel=1e-5)
    for k, w in s.weights().items():
        np.testing.assert_allclose(w, before[k] - 0.05 * g[k], rtol=1e-5, atol=1e-7, err_msg=k)
    assert s.step == 1 and s.learning_rate == pytest.approx(0.05)


def test_every_model_form_gives_the_same_session(model, model_path):
    x, y = batch()
    losses = []
    for m in [model, model.SerializeToString(), bytearray(model.SerializeToString()), str(model_path), model_path]:
        s = ot.TrainingSession(m, optimizer="adam", learning_rate=1e-2)
        losses.append([s.train_step({"x": x, "target": y}) for _ in range(3)])
    assert all(l == losses[0] for l in losses), losses


def test_feeds_are_read_not_written_and_any_layout_works(model):
    x, y = batch()
    x_copy = x.copy()
    s1 = ot.TrainingSession(model)
    s2 = ot.TrainingSession(model)
    wide = np.zeros((x.shape[0], 2 * x.shape[1]), np.float32)
    wide[:, ::2] = x
    strided = wide[:, ::2]                               # not C-contiguous: copied once
    readonly = np.frombuffer(x.tobytes(), np.float32).reshape(x.shape)  # read-only, read in place
    assert not strided.flags.c_contiguous and not readonly.flags.writeable
    a = s1.train_step({"x": x, "target": y})
    b = s2.train_step({"x": strided, "target": y})
    np.testing.assert_array_equal(x, x_copy)
    assert a == b
    assert s1.infer({"x": readonly})[0].tolist() == s2.infer({"x": x})[0].tolist()
    # Lists are converted to the expected dtype.
    assert s1.infer({"x": x.tolist()})[0].tolist() == s1.infer({"x": x})[0].tolist()


def test_outputs_own_their_memory(model):
    s = ot.TrainingSession(model)
    x, _ = batch()
    (out,) = s.infer({"x": x})
    assert out.dtype == np.float32 and out.shape == (32, SIZES[-1])
    assert not out.flags.owndata and out.base is not None  # wraps the native tensor, no copy
    w = s.get_weight("fc1.weight")
    w[:] = 0  # a copy: the session is unaffected
    assert np.abs(s.get_weight("fc1.weight")).sum() > 0
    (again,) = s.infer({"x": x})
    np.testing.assert_array_equal(out, again)


def test_set_weights_round_trip(model):
    s = ot.TrainingSession(model)
    w = {k: np.full_like(v, 0.5) for k, v in s.weights().items()}
    s.set_weights(w)
    for k, v in s.weights().items():
        np.testing.assert_array_equal(v, w[k])
    s.set_weight("fc2.bias", [1.0, 2.0, 3.0])  # a list takes the weight's dtype
    np.testing.assert_array_equal(s.get_weight("fc2.bias"), np.array([1, 2, 3], np.float32))


def test_inference_export_runs_in_onnxruntime(model, tmp_path):
    s = ot.TrainingSession(model, optimizer="nesterov", learning_rate=0.01)
    x, y = batch()
    for _ in range(5):
        s.train_step({"x": x, "target": y})
    exported = s.export_inference()
    assert isinstance(exported, onnx.ModelProto)
    onnx.checker.check_model(exported, full_check=True)
    s.export_inference(tmp_path / "out.onnx")
    ours = s.infer({"x": x})[0]
    for m in [exported.SerializeToString(), str(tmp_path / "out.onnx")]:
        theirs = ort.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
    # The original model's predictions differ: the export carries the trained weights.
    original = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert np.abs(original - ours).max() > 1e-3


@pytest.mark.parametrize("form", ["path", "bytes", "proto"])
def test_checkpoint_resumes_bit_for_bit(model, tmp_path, form):
    x, y = batch()
    cfg = dict(loss="huber", optimizer="adam", learning_rate=1e-2, schedule=ot.ScheduleSpec(kind="cosine", total_steps=10),
               penalty=ot.Elastic(1e-4, 1e-3))
    full = ot.TrainingSession(model, **cfg)
    part = ot.TrainingSession(model, **cfg)
    for _ in range(3):
        full.train_step({"x": x, "target": y})
        part.train_step({"x": x, "target": y})
    path = tmp_path / "ck.onnx"
    part.save_checkpoint(path)
    source = {"path": path, "bytes": path.read_bytes(), "proto": onnx.load(path)}[form]
    resumed = ot.TrainingSession.from_checkpoint(source)
    assert resumed.step == 3 and resumed.input_names == ["x"] and resumed.output_names == ["y"]
    for _ in range(4):
        assert resumed.train_step({"x": x, "target": y}) == full.train_step({"x": x, "target": y})
    for k, v in full.weights().items():
        np.testing.assert_array_equal(resumed.get_weight(k), v)
    np.testing.assert_array_equal(resumed.state("fc1.weight.exp_avg"), full.state("fc1.weight.exp_avg"))
    assert "optim.step" in full.state_names
    assert full.checkpoint().training_info  # as a ModelProto


def test_forward_backward_session_matches_training_gradients(model):
    x, y = batch()
    fb = ot.ForwardBackwardSession(model.SerializeToString(), inputs_requiring_grad=["x"])
    (pred,) = fb.run_forward({"x": x})
    np.testing.assert_allclose(pred, ot.TrainingSession(model).infer({"x": x})[0], rtol=1e-6)
    grads = fb.run_backward([2 * (pred - y) / pred.size])  # d mean((p - y)^2) / dp
    _, ref = ot.TrainingSession(model, loss="mse").gradients({"x": x, "target": y})
    for k in ref:
        np.testing.assert_allclose(grads[k], ref[k], rtol=1e-4, atol=1e-7, err_msg=k)
    assert grads["x"].shape == x.shape
    zeros = fb.run_backward([None])
    assert all(not v.any() for v in zeros.values())
    assert fb.output_names == ["y"] and fb.inputs_requiring_grad == ["x"]
    with pytest.raises(TypeError, match="gradient of output 'y': expected dtype float32"):
        fb.run_backward([np.zeros(pred.shape, np.float64)])


def test_training_session_run_forward_backward_on_its_own_weights(model):
    x, y = batch()
    s = ot.TrainingSession(model, loss="mse", optimizer="sgd", learning_rate=0.1, inputs_requiring_grad=["x"])
    for _ in range(2):  # the second round runs after a train_step: it must see the updated weights
        (pred,) = s.run_forward({"x": x})
        np.testing.assert_allclose(pred, s.infer({"x": x})[0], rtol=1e-6)
        grads = s.run_backward([2 * (pred - y) / pred.size])  # d mean((p - y)^2) / dp
        _, ref = mlp_loss_and_grads(_with_weights(model, s.weights()), x, y)
        assert set(grads) == set(ref) | {"x"}
        for k in ref:
            np.testing.assert_allclose(grads[k], ref[k], rtol=1e-4, atol=1e-6, err_msg=k)
        assert grads["x"].shape == x.shape and grads["x"].any()
        s.train_step({"x": x, s.target_name: y})
    assert all(not v.any() for v in s.run_backward([None]).values())


def _with_weights(model, weights):
    m = copy.deepcopy(model)
    for init in m.graph.initializer:
        if init.name in weights:
            init.CopyFrom(onnx.numpy_helper.from_array(weights[init.name], init.name))
    return m


# Errors name what is wrong.
@pytest.mark.parametrize("feeds, exc, message", [
    (lambda x, y: {"x": x.astype(np.float64), "target": y}, TypeError, r"input 'x': expected dtype float32, got float64"),
    (lambda x, y: {"x": x}, ValueError, r"input 'target': missing"),
    (lambda x, y: {"x": x[:, :3], "target": y}, ValueError, r"input 'x': expected shape \[batch,5\], got \[32,3\]"),
    (lambda x, y: {"x": x, "target": y, "z": y}, ValueError, r"input 'z': is not an input"),
    (lambda x, y: {"x": "text", "target": y}, TypeError, r"input 'x'"),
    (lambda x, y: [x, y], TypeError, r"train_step: expected a dict"),
])
def test_bad_feeds(model, feeds, exc, message):
    s = ot.TrainingSession(model)
    x, y = batch()
    with pytest.raises(exc, match=message):
        s._s.train_step(feeds(x, y))


def test_bad_configuration_and_models(model, tmp_path):
    with pytest.raises(ValueError, match="loss.kind: unknown value 'hinge'"):
        ot.TrainingSession(model, loss="hinge")
    with pytest.raises(ot.OnnxtrainError, match="optimizer.kind: unknown optimizer 'rmsprop'"):
        ot.TrainingSession(model, optimizer="rmsprop")
    with pytest.raises(ValueError, match="trainable 'nope': is not an initializer"):
        ot.TrainingSession(model, trainable=["nope"])
    with pytest.raises(ValueError, match="missing.onnx"):
        ot.TrainingSession(tmp_path / "missing.onnx")
    with pytest.raises(ValueError, match="<bytes>"):
        ot.TrainingSession(b"not a model")
    with pytest.raises(TypeError, match="model: expected a path, bytes or onnx.ModelProto, got int"):
        ot.TrainingSession(3)
    with pytest.raises(TypeError, match="LossSpec: unknown option 'dleta'; expected one of: kind"):
        ot.LossSpec(kind="huber", dleta=1.0)
    with pytest.raises(TypeError, match="OptimizerSpec.momentum: cannot take 'high'"):
        ot.OptimizerSpec(momentum="high")
    with pytest.raises(ValueError, match="device 'tpu': expected \"cpu\", \"cuda\", \"cuda:N\""):
        ot.TrainingSession(model, device="tpu")
    s = ot.TrainingSession(model)
    with pytest.raises(TypeError, match="weight 'fc1.bias': expected dtype float32, got float64"):
        s.set_weight("fc1.bias", np.zeros(16))
    with pytest.raises(ValueError, match="fc1.bias"):
        s.set_weight("fc1.bias", np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="optimizer state 'x': does not exist"):
        s.state("x")


def test_specs_copy_pickle_and_compare():
    o = ot.make_optimizer("nesterov", learning_rate=0.1)
    assert (o.kind, o.nesterov, o.momentum, o.learning_rate) == ("sgd", True, 0.9, 0.1)
    for c in [copy.copy(o), copy.deepcopy(o), pickle.loads(pickle.dumps(o))]:
        assert c == o and c is not o
    c = copy.deepcopy(o)
    c.momentum = 0.5
    assert c != o
    assert ot.PenaltySpec(0.1, 0.2) == ot.Elastic(l1=0.1, l2=0.2)
    assert "delta=0.5" in repr(ot.LossSpec(kind="huber", delta=0.5))
    cfg = ot.make_config(loss={"kind": "square", "half": True}, optimizer="adam", learning_rate=3e-4, penalty=(0, 1e-4))
    assert cfg.loss.half and cfg.optimizer.learning_rate == 3e-4 and cfg.penalty.l2 == 1e-4
    cfg.loss.delta = 2.0  # nested specs are edited in place
    assert cfg.loss.delta == 2.0
    g = ot.ParamGroup(match=["*.bias"], weight_decay=0.0)
    o.groups = [g]
    assert o.groups[0].match == ["*.bias"] and o.groups[0].learning_rate is None
    assert "square" in ot.loss_kinds() and "adamw" in ot.optimizer_kinds() and "adaptive" in ot.schedule_kinds()


def test_concurrent_calls_on_one_session_are_serialised(model):
    s = ot.TrainingSession(model, optimizer="sgd", learning_rate=1e-3)
    x, y = batch()
    errors = []

    def work():
        try:
            for _ in range(20):
                s.train_step({"x": x, "target": y})
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and s.step == 80


def test_gil_is_released_during_native_calls():
    # A thread runs 30 native train_steps from a pure-C pipeline: deque(map(train_step, iterator)). No Python
    # bytecode runs in that thread until the pipeline ends, so the interpreter can only hand this (main) thread
    # the GIL when the native code releases it. Main watches the iterator's remaining length: seeing a value
    # strictly between 30 and 0 means it ran while the pipeline was mid-way, i.e. inside a native call.
    big = make_mlp([256, 512, 512, 1], seed=0)
    s = ot.TrainingSession(big)._s
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((256, 256)).astype(np.float32), "target": np.zeros((256, 1), np.float32)}
    it = iter([feeds] * 30)
    t = threading.Thread(target=lambda: collections.deque(map(s.train_step, it), maxlen=0))
    t.start()
    seen = set()
    while t.is_alive():
        seen.add(it.__length_hint__())
    t.join()
    assert s.step == 30
    assert seen - {0, 30}, seen


def test_stubs_declare_the_native_module():
    stub = pathlib.Path(_onnxtrain.__file__).parent / "_onnxtrain.pyi"
    tree = ast.parse(stub.read_text())
    declared = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    declared |= {t.id for n in tree.body if isinstance(n, ast.AnnAssign) for t in [n.target]}
    public = {n for n in dir(_onnxtrain) if not n.startswith("_")} | {"__version__"}
    assert public <= declared | {"ModelLike", "PathLike"}, public - declared
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    for name in ["TrainingSession", "ForwardBackwardSession", "LossSpec", "OptimizerSpec", "ScheduleSpec"]:
        members = {m.name for m in classes[name].body if isinstance(m, ast.FunctionDef)}
        members |= {m.target.id for m in classes[name].body if isinstance(m, ast.AnnAssign)}
        actual = {m for m in dir(getattr(_onnxtrain, name)) if not m.startswith("_")} - {"to_dict"}
        assert actual <= members | {"to_dict"}, (name, actual - members)
