"""memory= (docs/memory.md): activation recomputation trains the same bits as without, in a smaller plan arena;
the recomputing gradient graph is standard ONNX (onnx's full checker); the estimators take the option too."""
import sys

import numpy as np
import onnx
import pytest

import onnxtrain
from conftest import ROOT

sys.path.insert(0, str(ROOT / "examples"))
from make_mlp import make_mlp  # noqa: E402

SIZES = [8, 64, 64, 64, 64, 1]  # five Gemm layers: room for auto to keep some boundaries and recompute the rest


def _train(memory, steps=5):
    s = onnxtrain.TrainingSession(make_mlp(SIZES, seed=1), loss="mse", optimizer="adamw", learning_rate=0.01,
                                  memory=memory)
    rng = np.random.default_rng(0)
    losses = []
    for _ in range(steps):
        x = rng.standard_normal((128, SIZES[0])).astype(np.float32)
        y = rng.standard_normal((128, 1)).astype(np.float32)
        losses.append(s.train_step({"x": x, s.target_name: y}))
    return s, np.array(losses, dtype=np.float32)


def _recomputed(s):
    return [n.name for n in s.export_gradient_model().graph.node if n.name.startswith("recompute/")]


@pytest.mark.parametrize("memory", ["auto", ["*"], {"recompute": ["fc2", "relu*"]}])
def test_same_bits_with_recomputation(memory):
    plain, plain_losses = _train(None)
    re, re_losses = _train(memory)
    assert _recomputed(re), "nothing was recomputed"
    assert not _recomputed(plain)
    np.testing.assert_array_equal(plain_losses.view(np.uint32), re_losses.view(np.uint32))
    for name, w in plain.weights().items():
        np.testing.assert_array_equal(w.view(np.uint32), re.weights()[name].view(np.uint32), err_msg=name)
    # Only auto is asked to save: "*" recomputes the whole chain from x when the backward pass starts (all of it
    # alive at once, as without), and recomputing ReLUs from the kept Gemm outputs keeps as much as it frees.
    if memory == "auto":
        assert 0 < re.arena_bytes < plain.arena_bytes, (re.arena_bytes, plain.arena_bytes)
    onnx.checker.check_model(re.export_gradient_model(), full_check=True)


def test_config_and_errors():
    cfg = onnxtrain.make_config(memory="auto")
    assert cfg.memory.recompute == ["auto"]
    assert onnxtrain.make_config().memory.recompute == []
    assert onnxtrain.make_memory(["fc*", "relu?"]).recompute == ["fc*", "relu?"]
    with pytest.raises(onnxtrain.OnnxtrainError, match="memory.recompute: 'nothing\\*' matches no node"):
        onnxtrain.TrainingSession(make_mlp(SIZES), memory=["nothing*"])
    with pytest.raises(TypeError, match="memory"):
        onnxtrain.make_memory(3)


def test_checkpoint_keeps_the_option(tmp_path):
    s, _ = _train("auto", steps=2)
    s.save_checkpoint(tmp_path / "ck.onnx")
    r = onnxtrain.TrainingSession.from_checkpoint(tmp_path / "ck.onnx")
    assert _recomputed(r)


def test_estimator_takes_memory():
    from onnxtrain.sklearn import OnnxRegressor

    rng = np.random.default_rng(2)
    X = rng.standard_normal((64, SIZES[0])).astype(np.float32)
    y = X[:, 0] - 2 * X[:, 1]
    kw = dict(optimizer="adam", learning_rate=0.01, max_iter=3, batch_size=16, shuffle=False, random_state=0)
    a = OnnxRegressor(make_mlp(SIZES, seed=4), **kw).fit(X, y)
    b = OnnxRegressor(make_mlp(SIZES, seed=4), memory="auto", **kw).fit(X, y)
    assert b.get_params()["memory"] == "auto"
    np.testing.assert_array_equal(a.predict(X), b.predict(X))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_same_bits_with_mixed_precision(dtype):
    def train(memory):
        s = onnxtrain.TrainingSession(make_mlp(SIZES, seed=1), loss="mse", optimizer="adam", learning_rate=0.01,
                                      memory=memory, mixed_precision=dtype)
        rng = np.random.default_rng(0)
        losses = [s.train_step({"x": rng.standard_normal((64, SIZES[0])).astype(np.float32),
                                s.target_name: rng.standard_normal((64, 1)).astype(np.float32)}) for _ in range(4)]
        return s, np.array(losses, dtype=np.float32)

    plain, a = train(None)
    re, b = train("auto")
    assert _recomputed(re)  # the Casts mixed precision inserts are recomputed with the products they feed
    np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))
    for name, w in plain.weights().items():
        np.testing.assert_array_equal(w.view(np.uint32), re.weights()[name].view(np.uint32), err_msg=name)
