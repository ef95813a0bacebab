"""benchmarks/report.py: a peer's speed is compared only when its losses agree with onnxtrain's, ratios follow
the metric's direction (µs/step: lower is better), and results.json states the machine, threads and versions."""
import json
import os
import subprocess
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REPORT = os.path.join(REPO, "benchmarks", "report.py")


def write_run(d, system, w, value, final, losses, metric="train_samples_per_s"):
    base = os.path.join(d, f"{system}_{w}_t2_r1")
    recs = [{"workload": w, "peer": system, "threads": 2, "metric": metric, "value": value},
            {"workload": w, "peer": system, "threads": 2, "metric": "final_train_loss", "value": final,
             "versions": {"lib": "1.0"}},
            {"workload": w, "peer": system, "threads": 2, "metric": "peak_rss_mb", "value": 100.0}]
    with open(base + ".jsonl", "w") as f:
        f.write("\n".join(json.dumps(r) for r in recs) + "\n")
    np.save(base + ".losses.npy", np.asarray(losses, np.float32))


def run_report(d, env=None):
    out = subprocess.run([sys.executable, REPORT, str(d), "--load-start", "1 2 3", "--load-end", "4 5 6"],
                         capture_output=True, text=True, check=True, env=env).stdout
    with open(os.path.join(d, "results.json")) as f:
        return out, json.load(f)


def test_agreeing_losses_give_ratios_in_the_metrics_direction(tmp_path):
    curve = np.linspace(1.0, 0.1, 50)
    write_run(tmp_path, "onnxtrain", "w1", 300.0, 0.0420, curve)
    write_run(tmp_path, "torch", "w1", 100.0, 0.0421, curve * (1 + 1e-6))
    write_run(tmp_path, "onnxtrain", "w4", 2.0, 0.0203, curve, metric="us_per_step")
    write_run(tmp_path, "ort", "w4", 50.0, 0.0203, curve, metric="us_per_step")
    with open(tmp_path / "peak_t2.jsonl", "w") as f:
        f.write(json.dumps({"workload": "gemm-2048", "peer": "torch.matmul", "metric": "fp32_GFLOP_per_s",
                            "value": 100.0}) + "\n")
    out, doc = run_report(tmp_path)
    assert "**3.00×**" in out and "**25.00×**" in out
    rows = {(r["workload"], r["system"]): r for r in doc["rows"]}
    assert rows[("w1", "torch")]["loss_check"]["ok"]
    assert abs(rows[("w4", "ort")]["ratio"] - 25.0) < 1e-9
    # W1's GEMM work: 460288 flop per sample, against the 100 GFLOP/s peak.
    assert abs(rows[("w1", "onnxtrain")]["gflops"] - 300.0 * 460288 / 1e9) < 1e-9
    assert abs(rows[("w1", "onnxtrain")]["pct_of_gemm_peak"] - 100 * 300.0 * 460288 / 1e9 / 100.0) < 1e-9
    assert doc["machine"]["load_avg_start"] == "1 2 3" and doc["threads"] == [2]
    assert doc["versions"]["torch"] == {"lib": "1.0"}


def test_the_openmp_wait_policy_is_recorded(tmp_path):
    # It moves 2-thread speeds by up to 2x on a shared machine, so an entry without it cannot be compared.
    curve = np.linspace(1.0, 0.1, 50)
    write_run(tmp_path, "onnxtrain", "w1", 300.0, 0.0420, curve)
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    out, doc = run_report(tmp_path, {**env, "OMP_WAIT_POLICY": "passive"})
    assert doc["machine"]["openmp_env"] == {"OMP_WAIT_POLICY": "passive", "GOMP_SPINCOUNT": "unset"}
    assert "OMP_WAIT_POLICY=passive, GOMP_SPINCOUNT=unset" in out


def test_a_loss_mismatch_is_reported_and_not_timed(tmp_path):
    curve = np.linspace(1.0, 0.1, 50)
    tok = "train_tokens_per_s"
    write_run(tmp_path, "onnxtrain", "w3", 300.0, 0.1146, curve, metric=tok)
    wrong = curve.copy()
    wrong[3] *= 1.01  # one early step off by 1%: a different computation, however fast
    write_run(tmp_path, "ort", "w3", 100.0, 0.1146, wrong, metric=tok)
    write_run(tmp_path, "torch", "w3", 100.0, 0.1200, curve, metric=tok)  # same curve, final loss 5% off
    out, doc = run_report(tmp_path)
    assert out.count("loss mismatch: not compared") == 2
    assert "×**" not in out
    for r in doc["rows"]:
        if r["system"] != "onnxtrain":
            assert not r["loss_check"]["ok"] and "ratio" not in r


def write_w1sk(d, system, value, final, curve):
    """A W1-sk process as w1_mlp_sklearn.py / w1sk_onnxtrain.py write it: the per-epoch loss_curve_ rides in the
    records, there is no per-step losses file."""
    extra = {"loss_curve_half_mse": list(curve)}
    recs = [{"workload": "w1sk", "peer": system, "threads": 2, "metric": "train_samples_per_s", "value": value, **extra},
            {"workload": "w1sk", "peer": system, "threads": 2, "metric": "final_train_loss", "value": final, **extra}]
    with open(os.path.join(d, f"{system}_w1sk_t2_r1.jsonl"), "w") as f:
        f.write("\n".join(json.dumps(r) for r in recs) + "\n")


def test_w1sk_compares_the_estimators_per_epoch_curves(tmp_path):
    curve = [0.031, 0.021, 0.018, 0.016, 0.0139]
    write_w1sk(tmp_path, "onnxtrain", 240000.0, 0.02330, curve)
    write_w1sk(tmp_path, "sklearn", 80000.0, 0.02281, [v * 1.003 for v in curve])  # as measured: 0.3%, 2.1%
    out, doc = run_report(tmp_path)
    assert "**3.00×**" in out
    row = next(r for r in doc["rows"] if r["system"] == "sklearn")
    assert row["loss_check"]["ok"] and abs(row["loss_check"]["early_curve_diff"] - 0.003 * curve[0] / np.mean(
        [v * 1.003 for v in curve])) < 1e-6

    bad = tmp_path / "bad"
    bad.mkdir()
    write_w1sk(bad, "onnxtrain", 240000.0, 0.02330, curve)
    write_w1sk(bad, "sklearn", 80000.0, 0.02281, [v * 1.05 for v in curve])  # a different training run
    out, doc = run_report(bad)
    assert "loss mismatch: not compared" in out


SHARED_PEERS = os.path.join(os.path.dirname(REPO), "shared", "bench", "peers")


def test_w1sk_onnxtrain_script_records_what_report_reads(tmp_path, python_env):
    import pytest
    if not os.path.isfile(os.path.join(SHARED_PEERS, "bench_data.py")):
        pytest.skip(f"{SHARED_PEERS} not found (the shared benchmark folder)")
    out = tmp_path / "onnxtrain_w1sk_t1_r1.jsonl"
    env = dict(python_env, OMP_NUM_THREADS="1")
    subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "torch_peer.py"),
                    os.path.join(REPO, "benchmarks", "w1sk_onnxtrain.py"), "--threads", "1", "--out", str(out)],
                   env=env, check=True, capture_output=True, text=True)
    recs = {r["metric"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert recs["train_samples_per_s"]["value"] > 0 and recs["peak_rss_mb"]["value"] > 0
    curve = recs["final_train_loss"]["loss_curve_half_mse"]
    assert len(curve) == 5 and curve[-1] < curve[0]
    # Same hyper-parameters as scikit-learn's run: the final MSE lands where sklearn's does (0.0228, measured).
    assert 0.015 < recs["final_train_loss"]["value"] < 0.035


def test_a_baseline_build_is_a_column_named_by_its_commit(tmp_path):
    # run.sh's BASELINE: another onnxtrain build in the same rounds, so a change's before/after is one run.
    curve = np.linspace(1.0, 0.1, 50)
    write_run(tmp_path, "onnxtrain", "w1", 330.0, 0.0420, curve)
    write_run(tmp_path, "base", "w1", 300.0, 0.0420, curve)
    write_run(tmp_path, "onnxtrain", "w4", 4.0, 0.0203, curve, metric="us_per_step")
    write_run(tmp_path, "base", "w4", 5.0, 0.0203, curve, metric="us_per_step")
    out, doc = run_report(tmp_path, {**os.environ, "BENCH_BASELINE_REV": "abc1234"})
    assert "onnxtrain abc1234 (baseline) | ratio" in out.splitlines()[0]
    assert "**1.10×**" in out and "**1.25×**" in out
    rows = {(r["workload"], r["system"]): r for r in doc["rows"]}
    assert abs(rows[("w1", "base")]["ratio"] - 1.1) < 1e-9 and rows[("w1", "base")]["loss_check"]["ok"]


def test_without_a_baseline_there_is_no_baseline_column(tmp_path):
    curve = np.linspace(1.0, 0.1, 50)
    write_run(tmp_path, "onnxtrain", "w1", 330.0, 0.0420, curve)
    out, _ = run_report(tmp_path)
    assert "baseline" not in out
