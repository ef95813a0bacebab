"""Replicas from Python (docs/replicas.md): TrainingSession(replicas=N) and the estimators' replicas parameter take
the steps of one session on the whole batch (in float64 up to rounding, ~1e-15), and bad arguments are clear."""
import os

import numpy as np
import pytest

import onnxtrain as ot
from onnxtrain.sklearn import MLPClassifier, MLPRegressor

from conftest import ROOT  # noqa: F401  (puts the build's package first on sys.path)


def _data(n=301, d=10, dtype=np.float64, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d)).astype(dtype)
    return X, (np.sin(X[:, 0]) + X[:, 1] ** 2).astype(dtype)


@pytest.mark.parametrize("replicas", [2, 3])
def test_session_steps_match_one_session_in_float64(replicas):
    X, y = _data(n=61)
    model = MLPRegressor(hidden_layer_sizes=(16,), max_iter=1, random_state=0).fit(X, y).model_
    one = ot.TrainingSession(model, loss="mse", optimizer="adam", learning_rate=0.01)
    many = ot.TrainingSession(model, loss="mse", optimizer="adam", learning_rate=0.01, replicas=replicas)
    assert (one.replicas, many.replicas) == (1, replicas)
    feeds = {one.input_names[0]: X, one.target_name: y.reshape(-1, 1)}
    for _ in range(5):  # 61 rows: unequal parts, weighted by their row counts
        assert many.train_step(feeds) == pytest.approx(one.train_step(feeds), rel=1e-6)
    for name, w in one.weights().items():
        np.testing.assert_allclose(many.get_weight(name), w, rtol=1e-12, atol=1e-14, err_msg=name)
    # Writes reach every replica: after set_weight and a learning-rate change the steps still agree.
    w0 = one.trainable[0]
    for s in (one, many):
        s.set_weight(w0, np.zeros_like(one.get_weight(w0)))
        s.learning_rate = 0.003
    assert many.train_step(feeds) == pytest.approx(one.train_step(feeds), rel=1e-6)
    for name, w in one.weights().items():
        np.testing.assert_allclose(many.get_weight(name), w, rtol=1e-12, atol=1e-14, err_msg=name)
    # Replicas are one process, as the CLI and the Trainer count them: no communicator, rank 0 of 1.
    assert (many.communicator, many.rank, many.world_size) == (None, 0, 1)
    assert many.step == one.step and many.state_names == one.state_names


def test_estimators_fit_the_same_model_with_replicas():
    X, y = _data()
    sw = np.random.default_rng(1).uniform(0.5, 2.0, len(X))
    params = dict(hidden_layer_sizes=(32,), batch_size=64, max_iter=15, random_state=0, alpha=1e-3)
    one = MLPRegressor(**params).fit(X, y, sample_weight=sw)
    two = MLPRegressor(**params, replicas=2).fit(X, y, sample_weight=sw)
    assert two._session.replicas == 2
    np.testing.assert_allclose(two.loss_curve_, one.loss_curve_, rtol=1e-6)
    np.testing.assert_allclose(two.predict(X), one.predict(X), rtol=1e-9, atol=1e-9)

    labels = (X[:, 0] > 0).astype(int) + (X[:, 1] > 0)
    one = MLPClassifier(**params).fit(X, labels)
    three = MLPClassifier(**params, replicas=3).fit(X, labels)
    np.testing.assert_allclose(three.loss_curve_, one.loss_curve_, rtol=1e-6)
    np.testing.assert_allclose(three.predict_proba(X), one.predict_proba(X), rtol=1e-9, atol=1e-9)


def test_checkpoint_of_replicas_resumes_anywhere(tmp_path):
    X, y = _data(n=64, dtype=np.float32)
    model = MLPRegressor(hidden_layer_sizes=(16,), max_iter=1, random_state=0).fit(X, y).model_
    s = ot.TrainingSession(model, loss="mse", optimizer="adam", replicas=2)
    feeds = {s.input_names[0]: X, s.target_name: y.reshape(-1, 1)}
    for _ in range(3):
        s.train_step(feeds)
    s.save_checkpoint(tmp_path / "ckpt.onnx")
    alone = ot.TrainingSession.from_checkpoint(tmp_path / "ckpt.onnx")
    again = ot.TrainingSession.from_checkpoint(tmp_path / "ckpt.onnx", replicas=2)
    assert alone.step == again.step == 3 and again.replicas == 2
    for name, w in s.weights().items():
        np.testing.assert_array_equal(alone.get_weight(name), w)
    assert again.train_step(feeds) == s.train_step(feeds)  # same replicas, same parts: same bits


def test_bad_replicas_are_clear_errors():
    X, y = _data(n=8)
    model = MLPRegressor(hidden_layer_sizes=(4,), max_iter=1, random_state=0).fit(X, y).model_
    for bad in (0, 65, 1.5, True, "2"):
        with pytest.raises(ValueError, match="replicas: expected an integer from 1 to 64"):
            ot.TrainingSession(model, replicas=bad)
    with pytest.raises(ValueError, match="leave config.parallel empty"):
        ot.TrainingSession(model, replicas=2, parallel=ot.Communicator.single() if hasattr(ot.Communicator, "single")
                           else ot.communicator_from_environment())
    with pytest.raises(ValueError, match="replicas"):
        MLPRegressor(replicas=0).fit(X, y)



def test_from_checkpoint_takes_the_distributed_options(tmp_path):
    """Checkpoints do not store ``distributed`` (it belongs to the run, docs/checkpoint.md); from_checkpoint takes
    it again and checks it as the constructor does. Outside mpirun (one rank) the options change nothing, so the
    resume continues bit for bit; under mpirun they reach TrainingSession::from_checkpoint's spec."""
    X, y = _data(n=64, dtype=np.float32)
    model = MLPRegressor(hidden_layer_sizes=(16,), max_iter=1, random_state=0).fit(X, y).model_
    s = ot.TrainingSession(model, loss="mse", optimizer="adam", distributed={"compression": "bfloat16"})
    feeds = {s.input_names[0]: X, s.target_name: y.reshape(-1, 1)}
    s.train_step(feeds)
    s.save_checkpoint(tmp_path / "ckpt.onnx")
    again = ot.TrainingSession.from_checkpoint(tmp_path / "ckpt.onnx",
                                               distributed=ot.DataParallelSpec(compression="bfloat16", overlap=False))
    assert again.train_step(feeds) == s.train_step(feeds)
    with pytest.raises(ValueError, match="distributed.compression: expected one of 'none', 'bfloat16', 'float16'"):
        ot.TrainingSession.from_checkpoint(tmp_path / "ckpt.onnx", distributed={"compression": "int8"})
    with pytest.raises(TypeError, match="unknown option 'bucket'"):
        ot.TrainingSession.from_checkpoint(tmp_path / "ckpt.onnx", distributed={"bucket": 1})


@pytest.mark.skipif(os.environ.get("ONNXTRAIN_DEVICE") == "guarded",
                    reason="gradient compression packs on the host, which the guarded device refuses by design "
                           "(the AllReduceStart kernel says so); the CPU run of this file covers it")
def test_replicas_reduce_with_the_distributed_options_and_resume_with_them(tmp_path):
    """Replicas reduce through the same collectives as mpirun ranks, so ``distributed`` applies to them too: with
    bfloat16 gradient compression their steps differ from uncompressed ones, and a checkpoint (which does not
    store the option) resumes bit for bit when from_checkpoint is given it again, and not without it."""
    X, y = _data(n=64, dtype=np.float32)
    model = MLPRegressor(hidden_layer_sizes=(16,), max_iter=1, random_state=0).fit(X, y).model_
    compressed = {"compression": "bfloat16"}
    s = ot.TrainingSession(model, loss="mse", optimizer="adam", replicas=2, distributed=compressed)
    plain = ot.TrainingSession(model, loss="mse", optimizer="adam", replicas=2)
    feeds = {s.input_names[0]: X, s.target_name: y.reshape(-1, 1)}
    for _ in range(3):
        s.train_step(feeds)
        plain.train_step(feeds)
    assert any(not np.array_equal(plain.get_weight(n), w) for n, w in s.weights().items())
    s.save_checkpoint(tmp_path / "ckpt.onnx")
    again = ot.TrainingSession.from_checkpoint(tmp_path / "ckpt.onnx", replicas=2, distributed=compressed)
    default = ot.TrainingSession.from_checkpoint(tmp_path / "ckpt.onnx", replicas=2)
    expected = s.train_step(feeds)
    assert again.train_step(feeds) == expected
    default.train_step(feeds)
    for name, w in s.weights().items():
        np.testing.assert_array_equal(again.get_weight(name), w)
    assert any(not np.array_equal(default.get_weight(n), w) for n, w in s.weights().items())
