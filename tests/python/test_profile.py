"""TrainingSession(profile=True): train_step's time per step of its plan, as rows and as a text report
(docs/performance.md, "Profiling a step"); training is unchanged by it."""
import sys

import numpy as np

import onnxtrain
from conftest import ROOT

sys.path.insert(0, str(ROOT / "examples"))
from make_mlp import make_mlp  # noqa: E402


def _train(profile):
    s = onnxtrain.TrainingSession(make_mlp([4, 8, 1], seed=3), loss="mse", optimizer="adam", learning_rate=0.01,
                                  profile=profile)
    rng = np.random.default_rng(0)
    for _ in range(5):
        x = rng.standard_normal((6, 4)).astype(np.float32)
        y = rng.standard_normal((6, 1)).astype(np.float32)
        s.train_step({"x": x, s.target_name: y})
    return s


def test_profile_rows_and_report():
    s = _train(True)
    rows = s.profile()
    assert rows and all(r["calls"] == 5 for r in rows), rows
    assert [r["seconds"] for r in rows] == sorted((r["seconds"] for r in rows), reverse=True)
    ops = {r["op"] for r in rows}
    assert "Gemm" in ops and "AdamUpdate" in ops, ops
    report = s.profile_report(top=5)
    assert "AdamUpdate (" in report and report.count("\n") >= 5, report
    plain = _train(False)
    assert plain.profile() == []
    for name, w in plain.weights().items():
        np.testing.assert_array_equal(w, s.weights()[name])
