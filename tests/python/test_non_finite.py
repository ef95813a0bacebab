"""The sklearn estimators report a non-finite step clearly (issue 12, docs/reliability.md): the error names the
step and the tensor that went NaN/Inf, and the update of that step is not applied."""
import numpy as np
import pytest

import onnxtrain
from onnxtrain.sklearn import MLPClassifier, MLPRegressor


def _diverging_data():
    rng = np.random.RandomState(0)
    X = rng.randn(64, 4).astype(np.float32)
    return X, X.sum(axis=1) * 1e30  # squared error overflows float32 on the first step


def test_regressor_names_the_step_and_the_tensor():
    X, y = _diverging_data()
    est = MLPRegressor(hidden_layer_sizes=(8,), max_iter=3, random_state=0)
    with pytest.raises(onnxtrain.OnnxtrainError) as info:
        est.fit(X, y)
    msg = str(info.value)
    assert "training step 1" in msg and "optimizer step 1" in msg
    assert "'loss'" in msg and "not finite" in msg and "was not applied" in msg


def test_classifier_with_an_overflowing_learning_rate_names_the_tensor():
    rng = np.random.RandomState(1)
    X = (rng.randn(64, 4) * 1e18).astype(np.float32)
    y = rng.randint(0, 3, size=64)
    est = MLPClassifier(hidden_layer_sizes=(8,), max_iter=5, learning_rate_init=1e20, random_state=0)
    with pytest.raises(onnxtrain.OnnxtrainError) as info:
        est.fit(X, y)
    msg = str(info.value)
    assert "training step" in msg and "not finite" in msg
    assert "'loss'" in msg or "gradient of" in msg


# on_non_finite="skip" ---------------------------------------------------------------------------------------------
# A skipped step applies nothing, so a run that skips a batch must equal (bit for bit) a run that never saw it.

import sys
import warnings

from conftest import ROOT

sys.path.insert(0, str(ROOT / "examples"))
from make_mlp import make_mlp  # noqa: E402

SIZES = [4, 8, 1]


def _batches(n_batches=5, rows=6, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((rows, SIZES[0])).astype(np.float32),
             rng.standard_normal((rows, SIZES[-1])).astype(np.float32)) for _ in range(n_batches)]


def _session(**kw):
    return onnxtrain.TrainingSession(make_mlp(SIZES, seed=3), loss="mse", optimizer="adam", learning_rate=0.01, **kw)


def _poison(x):
    x = x.copy()
    x[2, 1] = np.inf
    return x


def test_session_skip_counts_warns_and_equals_a_run_without_the_batch():
    batches = _batches()
    bad = 2  # the third train_step call
    s = _session(on_non_finite="skip")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i, (x, y) in enumerate(batches):
            loss = s.train_step({"x": _poison(x) if i == bad else x, s.target_name: y})
            assert np.isnan(loss) == (i == bad)
    skips = [w for w in caught if issubclass(w.category, onnxtrain.NonFiniteStepWarning)]
    assert len(skips) == 1, [str(w.message) for w in caught]
    assert issubclass(onnxtrain.NonFiniteStepWarning, RuntimeWarning)
    msg = str(skips[0].message)
    assert "skipped step #1: training step 3 (optimizer step 3): the loss went non-finite" in msg, msg
    assert skips[0].filename == __file__  # points at the caller's train_step
    assert s.skipped_steps == 1 and s.step == 4 and s.train_step_calls == 5
    assert "training step 3" in s.last_skip_reason

    ref = _session()
    for i, (x, y) in enumerate(batches):
        if i != bad:
            ref.train_step({"x": x, ref.target_name: y})
    for name, w in ref.weights().items():
        assert np.array_equal(w, s.get_weight(name)), name
    for name in ref.state_names:  # Adam's moments and the step counter
        assert np.array_equal(ref.state(name), s.state(name)), name


def test_session_raise_is_the_default_and_names_the_step():
    (x, y), = _batches(1)
    s = _session()
    assert s._s.skipped_steps == 0
    before = s.weights()
    with pytest.raises(onnxtrain.OnnxtrainError, match=r"training step 1 \(optimizer step 1\): the loss went non-finite"):
        s.train_step({"x": _poison(x), s.target_name: y})
    assert s.skipped_steps == 0 and s.step == 0
    for name, w in before.items():
        assert np.array_equal(w, s.get_weight(name)), name
    with pytest.raises(ValueError, match="on_non_finite: expected 'raise' or 'skip', got 'ignore'"):
        _session(on_non_finite="ignore")
    cfg = onnxtrain.make_config(on_non_finite="skip", check_every_value=True)
    assert cfg.on_non_finite == "skip" and cfg.check_every_value


def test_check_every_value_names_the_first_node():
    (x, y), = _batches(1)
    s = _session(check_every_value=True)
    with pytest.raises(onnxtrain.OnnxtrainError, match=r"training step 1 .*node 'fc1' \(Gemm\)"):
        s.train_step({"x": _poison(x), s.target_name: y})


def test_skip_warnings_are_rate_limited_and_the_count_survives_a_checkpoint(tmp_path):
    (x, y), = _batches(1)
    s = _session(on_non_finite="skip")
    feeds = {"x": _poison(x), s.target_name: y}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(105):
            s.train_step(feeds)
    skips = [str(w.message) for w in caught if issubclass(w.category, onnxtrain.NonFiniteStepWarning)]
    numbers = [int(m.split("#")[1].split(":")[0]) for m in skips]
    assert numbers == list(range(1, 11)) + [100], numbers
    assert "only every 100th skipped step is reported" in skips[9]
    assert s.skipped_steps == 105 and s.step == 0
    s.save_checkpoint(tmp_path / "ckpt.onnx")
    back = onnxtrain.TrainingSession.from_checkpoint(tmp_path / "ckpt.onnx")
    assert back.skipped_steps == 105 and back.train_step_calls == 105
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        back.train_step(feeds)
    assert back.skipped_steps == 106
    assert not caught  # #106: past the first 10 and not a 100th
    assert "training step 106 " in back.last_skip_reason


def _regression_data():
    rng = np.random.RandomState(0)
    X = rng.randn(64, 4).astype(np.float32)
    y = X.sum(axis=1)
    return X, y


def test_regressor_skip_counts_and_equals_a_fit_without_the_batch():
    X, y = _regression_data()
    y_bad = y.copy()
    y_bad[16:24] = 1e30  # batch 3 of 8 in every epoch: its squared error overflows float32
    kw = dict(hidden_layer_sizes=(8,), max_iter=3, batch_size=8, shuffle=False, random_state=0)
    est = MLPRegressor(on_non_finite="skip", **kw)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        est.fit(X, y_bad)
    skips = [str(w.message) for w in caught if issubclass(w.category, onnxtrain.NonFiniteStepWarning)]
    assert est.n_skipped_steps_ == 3 and len(skips) == 3, skips
    assert "training step 3 (optimizer step 3): the loss went non-finite" in skips[0], skips[0]
    assert "training step 11 (optimizer step 10)" in skips[1], skips[1]

    keep = np.r_[0:16, 24:64]
    ref = MLPRegressor(**kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref.fit(X[keep], y[keep])
    assert ref.n_skipped_steps_ == 0
    for a, b in zip(ref.coefs_ + ref.intercepts_, est.coefs_ + est.intercepts_):
        assert np.array_equal(a, b)
    # The epoch's loss averages the batches that were applied: the reference's, exactly.
    assert est.loss_curve_ == ref.loss_curve_
    # partial_fit keeps counting in the same session.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.partial_fit(X, y_bad)
    assert est.n_skipped_steps_ == 4


def test_estimators_take_on_non_finite_and_raise_by_default():
    from onnxtrain.sklearn import OnnxRegressor

    assert MLPRegressor().get_params()["on_non_finite"] == "raise"
    assert MLPClassifier().get_params()["on_non_finite"] == "raise"
    X, y = _regression_data()
    with pytest.raises(ValueError, match="on_non_finite"):
        MLPRegressor(on_non_finite="ignore", max_iter=1).fit(X, y)
    rng = np.random.RandomState(1)
    Xc = (rng.randn(64, 4) * 1e18).astype(np.float32)
    yc = rng.randint(0, 3, size=64)
    clf = MLPClassifier(hidden_layer_sizes=(8,), max_iter=2, learning_rate_init=1e20, random_state=0,
                        on_non_finite="skip")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clf.fit(Xc, yc)
    assert clf.n_skipped_steps_ >= 1
    onnx_est = OnnxRegressor(make_mlp([4, 8, 1], seed=0), max_iter=2, batch_size=8, shuffle=False,
                             on_non_finite="skip")
    y_bad = y.copy()
    y_bad[0:8] = 1e30
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        onnx_est.fit(X, y_bad)
    assert onnx_est.n_skipped_steps_ == 2
    with pytest.raises(onnxtrain.OnnxtrainError, match="training step 1 "):
        OnnxRegressor(make_mlp([4, 8, 1], seed=0), max_iter=1, batch_size=8, shuffle=False).fit(X, y_bad)


_RANK_SCRIPT = r'''
import sys, warnings
import numpy as np
import onnxtrain as ot
sys.path.insert(0, sys.argv[1])
from make_mlp import make_mlp

out, policy = sys.argv[2], sys.argv[3]
s = ot.TrainingSession(make_mlp([4, 8, 1], seed=3), optimizer="adam", learning_rate=0.01, parallel=True,
                       on_non_finite=policy)
rng = np.random.default_rng(s.rank)  # each rank its own shard
log = []
for step in range(4):
    x = rng.standard_normal((6, 4)).astype(np.float32)
    y = rng.standard_normal((6, 1)).astype(np.float32)
    if step == 1 and s.rank == 1:
        x[0, 0] = np.inf  # only rank 1's batch
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            log.append(repr(s.train_step({"x": x, s.target_name: y})))
    except ot.OnnxtrainError as e:
        log.append("raised: " + str(e).split(" [")[0])
np.savez(f"{out}/rank{s.rank}.npz", skipped=s.skipped_steps, step=s.step, **s.weights())
open(f"{out}/rank{s.rank}.log", "w").write("\n".join(log))
'''


@pytest.mark.parametrize("policy", ["skip", "raise"])
def test_a_nan_on_one_mpi_rank_is_handled_on_every_rank_alike(policy, tmp_path, python_env):
    import shutil
    import subprocess

    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("no mpirun on PATH (install openmpi-bin)")
    script = tmp_path / "rank.py"
    script.write_text(_RANK_SCRIPT)
    env = dict(python_env, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")
    cmd = [mpirun, "-np", "2", "--oversubscribe", "-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS", sys.executable,
           str(script), str(ROOT / "examples"), str(tmp_path), policy]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr
    r0, r1 = (dict(np.load(tmp_path / f"rank{r}.npz")) for r in (0, 1))
    logs = [(tmp_path / f"rank{r}.log").read_text().splitlines() for r in (0, 1)]
    # Rank 0's own batch was finite, yet it sees the NaN in the reduced values and does what rank 1 does.
    for log in logs:
        assert len(log) == 4, log
        if policy == "skip":
            assert log[1] == "nan" and all(v != "nan" for v in log[:1] + log[2:]), log
        else:
            assert log[1] == ("raised: training step 2 (optimizer step 2): the loss (reduced over the data-parallel "
                              "ranks) went non-finite, so the step's update was not applied"), log
    assert int(r0["skipped"]) == int(r1["skipped"]) == (1 if policy == "skip" else 0)
    assert int(r0["step"]) == int(r1["step"]) == 3
    for name in r0:
        assert np.array_equal(r0[name], r1[name]), f"{name}: the ranks must hold the same weights"
        assert np.all(np.isfinite(r0[name])), name
