"""TrainingSession.train_epoch (the native epoch loop the estimators' fit uses) against the per-batch Python loop
it replaced: the same batches, sample weights and steps must give the same weights."""
import signal
import warnings

import numpy as np
import onnx
import pytest
import scipy.sparse as sp
from onnx import TensorProto, helper, numpy_helper
from sklearn.datasets import make_classification, make_regression
from sklearn.exceptions import ConvergenceWarning

import onnxtrain
from onnxtrain.sklearn import MLPClassifier, MLPRegressor, OnnxRegressor

warnings.filterwarnings("ignore", category=ConvergenceWarning)


def _weights(est):
    return est.coefs_ + est.intercepts_


# Sparse X takes the estimators' Python loop (batch by batch, densified), dense X the native epoch: identical
# batches and feeds, so identical steps. float32 sums can differ in the last bit only where the feeds do; they do
# not here, but 1 ulp-level tolerance keeps the test about semantics, not about summation order.
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("params", [
    dict(solver="adam", batch_size=37),
    dict(solver="adam", batch_size=50, alpha=0.01, shuffle=False),
    dict(solver="sgd", momentum=0.9, batch_size=64, learning_rate="invscaling"),
    dict(solver="sgd", early_stopping=True, validation_fraction=0.2, learning_rate="adaptive", batch_size=40),
    dict(solver="adam", batch_size=30, weighted=True),
], ids=["adam-partial-batch", "adam-l2-noshuffle", "sgd-invscaling", "sgd-early-stopping", "weighted"])
@pytest.mark.parametrize("kind", ["regressor", "multiclass", "binary"])
def test_native_epoch_matches_python_loop(dtype, params, kind):
    params = dict(params)
    weighted = params.pop("weighted", False)
    if kind == "regressor":
        X, y = make_regression(n_samples=301, n_features=12, n_targets=2, noise=0.1, random_state=0)
        y = y / np.abs(y).max()
        Est = MLPRegressor
    else:
        X, y = make_classification(n_samples=301, n_features=12, n_informative=6, random_state=0,
                                   n_classes=3 if kind == "multiclass" else 2)
        Est = MLPClassifier
    X = X.astype(dtype)
    sw = np.random.default_rng(1).uniform(0.2, 2.0, len(X)) if weighted else None
    kw = dict(hidden_layer_sizes=(16, 8), max_iter=5, random_state=4, **params)
    native = Est(**kw).fit(X, y, sample_weight=sw)
    python = Est(**kw).fit(sp.csr_matrix(X), y, sample_weight=sw)
    assert native.n_iter_ == python.n_iter_
    tol = dict(rtol=1e-6, atol=1e-7) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-14)
    for a, b in zip(_weights(native), _weights(python)):
        assert a.dtype == dtype
        np.testing.assert_allclose(a, b, **tol)
    # The reported loss adds the L2 term from squares summed natively in float64 (numpy's float32 dot before).
    np.testing.assert_allclose(native.loss_curve_, python.loss_curve_, rtol=1e-6)
    if params.get("early_stopping"):
        np.testing.assert_allclose(native.validation_scores_, python.validation_scores_, rtol=1e-6)


def test_partial_fit_uses_the_native_epoch_too():
    X, y = make_regression(n_samples=200, n_features=5, random_state=2)
    a, b = MLPRegressor(hidden_layer_sizes=(8,), random_state=0), MLPRegressor(hidden_layer_sizes=(8,), random_state=0)
    for _ in range(3):
        a.partial_fit(X, y)
        b.partial_fit(sp.csr_matrix(X), y)
    for wa, wb in zip(_weights(a), _weights(b)):
        np.testing.assert_allclose(wa, wb, rtol=1e-12, atol=1e-14)


def test_onnx_estimator_native_epoch_matches_python_loop():
    rng = np.random.default_rng(0)
    w = rng.normal(size=(6, 1)).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "lin",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1])],
                          [numpy_helper.from_array(w, "w")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    X = rng.normal(size=(150, 6)).astype(np.float32)
    y = X @ rng.normal(size=6) + 0.1
    kw = dict(optimizer="adam", learning_rate=0.01, batch_size=32, max_iter=4, random_state=0)
    a = OnnxRegressor(model, **kw).fit(X, y)
    b = OnnxRegressor(model, **kw).fit(sp.csr_matrix(X), y)
    wa = numpy_helper.to_array(a.model_.graph.initializer[0])
    wb = numpy_helper.to_array(b.model_.graph.initializer[0])
    np.testing.assert_allclose(wa, wb, rtol=1e-6)
    np.testing.assert_allclose(a.loss_curve_, b.loss_curve_, rtol=1e-6)


def _mlp_session(dtype=np.float32, sample_weight=True):
    rng = np.random.default_rng(0)
    elem = TensorProto.FLOAT if dtype == np.float32 else TensorProto.DOUBLE
    w1 = rng.normal(0, 0.5, (4, 8)).astype(dtype)
    w2 = rng.normal(0, 0.5, (8, 1)).astype(dtype)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
         helper.make_node("MatMul", ["r", "w2"], ["y"])], "mlp",
        [helper.make_tensor_value_info("x", elem, ["N", 4])], [helper.make_tensor_value_info("y", elem, ["N", 1])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    return onnxtrain.TrainingSession(model, loss=onnxtrain.LossSpec(kind="square", sample_weight=sample_weight),
                                     optimizer="adam", learning_rate=0.01)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_train_epoch_is_the_train_step_loop(dtype):
    rng = np.random.default_rng(5)
    X = rng.normal(size=(50, 4)).astype(dtype)
    Y = rng.normal(size=(50, 1)).astype(dtype)
    raw = rng.uniform(0.5, 2, 50).astype(dtype)
    order = rng.permutation(50)
    a, b = _mlp_session(dtype), _mlp_session(dtype)
    target = a.target_name
    sw_feed = next(f for f in a.feed_names if f not in a.input_names and f != target)
    r = a.train_epoch({"x": X, target: Y}, 16, order=order, sample_weight=raw, sample_weight_feed=sw_feed,
                      squares_of=["w2"])
    losses, squares = [], []
    for start in range(0, 50, 16):
        idx = order[start:start + 16]
        w = raw[idx]
        squares.append(float(np.sum(b.get_weight("w2").astype(np.float64) ** 2)))
        scaled = (w * (len(idx) / np.sum(w.astype(np.float64)))).astype(dtype)
        losses.append(b.train_step({"x": X[idx], target: Y[idx], sw_feed: scaled}))
    assert r["rows"].tolist() == [16, 16, 16, 2]
    np.testing.assert_allclose(r["weight_sum"], [np.sum(raw[order[s:s + 16]].astype(np.float64)) for s in range(0, 50, 16)],
                               rtol=1e-6)
    np.testing.assert_allclose(r["loss"], losses, rtol=1e-6)
    np.testing.assert_allclose(r["squares"], squares, rtol=1e-12)
    assert a.step == b.step == 4
    for name in ("w1", "w2"):
        np.testing.assert_allclose(a.get_weight(name), b.get_weight(name), rtol=1e-6 if dtype == np.float32 else 1e-12)


def test_train_epoch_in_order_without_weights_reads_views():
    rng = np.random.default_rng(6)
    X = rng.normal(size=(40, 4)).astype(np.float32)
    Y = rng.normal(size=(40, 1)).astype(np.float32)
    a, b = _mlp_session(sample_weight=False), _mlp_session(sample_weight=False)
    r = a.train_epoch({"x": X, a.target_name: Y}, 15)
    expected = [b.train_step({"x": X[s:s + 15], b.target_name: Y[s:s + 15]}) for s in range(0, 40, 15)]
    assert r["rows"].tolist() == [15, 15, 10]
    assert r["squares"].size == 0
    np.testing.assert_array_equal(r["loss"], np.float32(expected))
    np.testing.assert_array_equal(a.get_weight("w1"), b.get_weight("w1"))


def test_train_epoch_bad_input_names_what_is_wrong():
    s = _mlp_session()
    X = np.zeros((10, 4), np.float32)
    Y = np.zeros((10, 1), np.float32)
    t = s.target_name
    sw_feed = next(f for f in s.feed_names if f not in s.input_names and f != t)
    with pytest.raises(ValueError, match=r"data: every array needs one row per sample.*'target' 9, 'x' 10"):
        s.train_epoch({"x": X, t: Y[:9]}, 4, sample_weight_feed=sw_feed)
    with pytest.raises(ValueError, match=r"order\[2\].*row 10 is out of range \[0, 10\)"):
        s.train_epoch({"x": X, t: Y}, 4, order=[0, 1, 10], sample_weight_feed=sw_feed)
    with pytest.raises(TypeError, match="order: expected a 1-D array of integer row indices"):
        s.train_epoch({"x": X, t: Y}, 4, order=np.arange(10.0), sample_weight_feed=sw_feed)
    with pytest.raises(ValueError, match="batch_size.*at least 1, got 0"):
        s.train_epoch({"x": X, t: Y}, 0, sample_weight_feed=sw_feed)
    with pytest.raises(ValueError, match="sample_weight_feed 'nope'.*not a feed of this session"):
        s.train_epoch({"x": X, t: Y}, 4, sample_weight_feed="nope")
    with pytest.raises(ValueError, match="sample_weight.*expected 10 float32 or float64 values"):
        s.train_epoch({"x": X, t: Y}, 4, sample_weight=np.ones(3), sample_weight_feed=sw_feed)
    with pytest.raises(ValueError, match="weight 'x'.*not a trainable weight"):
        s.train_epoch({"x": X, t: Y}, 4, sample_weight_feed=sw_feed, squares_of=["x"])
    with pytest.raises(TypeError, match="input 'x': expected dtype float32"):
        s.train_epoch({"x": X.astype(np.float64), t: Y}, 4, sample_weight_feed=sw_feed)
    with pytest.raises(ValueError, match="input 'sample_weight'.*missing|missing.*sample_weight"):
        s.train_epoch({"x": X, t: Y}, 4)
    assert s.step == 0  # every refusal came before the first step


def test_ctrl_c_stops_a_native_epoch_as_it_stopped_the_python_loop(monkeypatch):
    # The Ctrl-C arrives at step 1000 of the epoch, while train_epoch runs without the GIL (interrupt_at_step:
    # what the SIGINT handler does, at a known step, so no timer races the epoch on a fast or a loaded machine);
    # the estimator warns and keeps the weights trained so far (scikit-learn's rule).
    rng = np.random.default_rng(0)
    X = rng.normal(size=(5000, 4))
    y = X.sum(axis=1)
    native = onnxtrain.TrainingSession.train_epoch
    monkeypatch.setattr(onnxtrain.TrainingSession, "train_epoch",
                        lambda self, *a, **k: native(self, *a, **dict(k, interrupt_at_step=1000)))
    est = MLPRegressor(hidden_layer_sizes=(4,), batch_size=1, max_iter=1, shuffle=False, random_state=0)
    # Python keeps SIGINT ignored when it started with it ignored (a job a shell put in the background, as a
    # stress script does); PyErr_SetInterrupt then does nothing. Install the usual handler for this test.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.warns(UserWarning, match="Training interrupted by user"):
            est.fit(X, y)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert est.n_iter_ == 0  # the epoch did not finish
    assert est._session.step == 1000  # the steps before the Ctrl-C, and none after
    assert np.all(np.isfinite(est.predict(X[:5])))
