#!/usr/bin/env python3
"""Builds the tables of benchmarks/run.sh from one results folder and writes <folder>/results.json.

  report.py RESULTS_DIR [--load-start "a b c"] [--load-end "a b c"] [--command "..."]

Input: <system>_<workload>_t<threads>_r<round>.jsonl (result records: the shared harness's format, plus
peak_rss_mb), the per-step losses of each process's untimed reference run (.losses.txt or .losses.npy) and
peak_t<threads>.jsonl (peak_gemm.py). Systems: onnxtrain, torch (PyPI), torch113 (Debian), ort, sklearn, and
base (run.sh's BASELINE: another onnxtrain build, named by $BENCH_BASELINE_REV), compared like a peer.

Correctness comes first: a peer's speed is compared only if its losses agree with onnxtrain's (same data,
weights, hyper-parameters, batch order), in every round:
- early curve: the first 10 per-step losses, max |onnxtrain - peer| / mean |peer loss| <= 1e-4 (the shared
  README: early steps agree to ~1e-5 relative; normalising by the mean keeps W4's near-zero batch-1 losses
  from dominating);
- final loss over the whole data set: relative difference <= FINAL_TOL[workload]. Later steps drift with the
  order of float32 summation: torch's own 1- vs 2-thread curves differ by up to 2e-2 late in W1, and W2's
  nesterov momentum amplifies rounding chaotically (README.md, w2_float64_check.py), hence its wider bound.
Otherwise the cell says "loss mismatch" and no ratio is given: a fast wrong answer is not a result.
"""
import argparse
import glob
import json
import os
import platform
import re
import statistics
import subprocess
import time

import numpy as np

RATE = {"w1": ("train_samples_per_s", "samples/s", True), "w2": ("train_samples_per_s", "samples/s", True),
        "w3": ("train_tokens_per_s", "tokens/s", True), "w4": ("us_per_step", "µs/step", False),
        "w1sgd": ("train_samples_per_s", "samples/s", True), "w1sk": ("train_samples_per_s", "samples/s", True),
        "w5": ("train_tokens_per_s", "tokens/s", True)}
FINAL_TOL = {"w1": 2e-2, "w1sgd": 2e-2, "w2": 1e-1, "w3": 1e-3, "w4": 1e-3, "w1sk": 5e-2, "w5": 1e-3}
EARLY_STEPS, EARLY_TOL = 10, 1e-4
# W1-sk's "steps" are the 5 per-epoch values of loss_curve_ (half MSE averaged over an epoch). Both estimators
# start from the same Glorot draw and shuffle alike, but Adam's epsilon sits differently (onnxtrain/sklearn/_mlp.py)
# and 2560 float32 steps drift like W1's curves do: measured 4e-3 on the curve and 2.1e-2 on the final MSE
# (0.02330 vs 0.02281, 1 thread), hence bounds wider than W1's.
EARLY_TOL_OF = {"w1sk": 1e-2}
PEERS = [("torch", "PyTorch eager (PyPI)"), ("torch113", "PyTorch 1.13 (Debian)"),
         ("ort", "onnxruntime-training"), ("sklearn", "scikit-learn")]


def train_flops(w):
    """Floating-point operations of one training step's matrix products per sample (W1) or token (W3): forward
    multiply-adds x 3 (forward, input gradient, weight gradient), less the input gradient of W1's first layer,
    which nothing needs. Elementwise work is left out, so this is a GEMM-only count (a lower bound)."""
    if w in ("w1", "w1sgd"):
        layers = [(64, 256), (256, 256), (256, 1)]
        macs = 3 * sum(i * o for i, o in layers) - 64 * 256
        return 2 * macs
    if w == "w3":
        d, ff, seq, vocab, n_layers = 128, 512, 64, 1000, 2
        per_layer = 4 * d * d + 2 * d * ff + 2 * seq * d  # Q,K,V,out projections; FF; QK^T and AV
        return 2 * 3 * (n_layers * per_layer + d * vocab)
    return None


def records(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def metric(recs, name):
    for r in recs:
        if r["metric"] == name:
            return r
    return None


def load_losses(base):
    if os.path.exists(base + ".losses.txt"):
        return np.loadtxt(base + ".losses.txt", dtype=np.float64)
    if os.path.exists(base + ".losses.npy"):
        return np.load(base + ".losses.npy").astype(np.float64)
    return None


def losses_of(base, final_rec):
    """The per-step losses of a process's reference run, or for the scikit-learn estimators (W1-sk) the
    per-epoch loss_curve_ both record."""
    losses = load_losses(base)
    if losses is None and final_rec.get("loss_curve_half_mse"):
        losses = np.asarray(final_rec["loss_curve_half_mse"], dtype=np.float64)
    return losses


def fmt(v):
    return f"{v:.4g}" if v < 1e5 else f"{v:,.0f}"


def loss_check(w, ours, theirs):
    """Worst over the rounds both ran: early-curve and final-loss differences and the verdict."""
    early, curve, final = [], [], []
    for r, o in ours.items():
        p = theirs.get(r)
        if p is None:
            continue
        lo, lp = o["losses"], p["losses"]
        if lo is not None and lp is not None:
            if lo.shape != lp.shape:
                return {"ok": False, "why": f"{lo.shape[0]} vs {lp.shape[0]} steps"}
            scale = np.mean(np.abs(lp))
            early.append(float(np.max(np.abs(lo[:EARLY_STEPS] - lp[:EARLY_STEPS])) / scale))
            curve.append(float(np.max(np.abs(lo - lp)) / scale))
        final.append(abs(o["final"] - p["final"]) / abs(p["final"]))
    if not final:
        return {"ok": False, "why": "no common round"}
    out = {"final_rel_diff": max(final), "final_tol": FINAL_TOL[w]}
    if early:
        out.update(early_curve_diff=max(early), early_tol=EARLY_TOL_OF.get(w, EARLY_TOL), curve_max_diff=max(curve))
    early_tol = EARLY_TOL_OF.get(w, EARLY_TOL)
    ok = out["final_rel_diff"] <= FINAL_TOL[w] and (not early or out["early_curve_diff"] <= early_tol)
    out["ok"] = ok
    if not early:
        out["why"] = "no per-step losses to compare"
        out["ok"] = False
    return out


def collect(out):
    runs = {}  # (w, t) -> system -> round -> {...}
    for p in glob.glob(os.path.join(out, "*_t*_r*.jsonl")):
        m = re.match(r"(\w+?)_(\w+?)_t(\d+)_r(\d+)\.jsonl$", os.path.basename(p))
        if not m:
            continue
        sys_, w, t, r = m.group(1), m.group(2), int(m.group(3)), int(m.group(4))
        recs = records(p)
        name = RATE[w][0]
        rate, fin = metric(recs, name), metric(recs, "final_train_loss")
        if rate is None or fin is None:
            continue  # a failed process; run.sh said so
        rss = metric(recs, "peak_rss_mb")
        runs.setdefault((w, t), {}).setdefault(sys_, {})[r] = {
            "value": rate["value"], "final": fin["value"], "rss": rss["value"] if rss else None,
            "losses": losses_of(p[:-len(".jsonl")], fin), "rec": fin}
    return runs


def peaks(out):
    best = {}
    for p in glob.glob(os.path.join(out, "peak_t*.jsonl")):
        t = int(re.search(r"peak_t(\d+)", p).group(1))
        for r in records(p):
            if r["metric"] == "fp32_GFLOP_per_s" and r["value"] > best.get(t, {}).get("gflops", 0):
                best[t] = {"gflops": r["value"], "lib": r["peer"], "size": r["workload"]}
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--load-start", default="?")
    ap.add_argument("--load-end", default="?")
    ap.add_argument("--command", default="")
    a = ap.parse_args()
    runs, peak = collect(a.out), peaks(a.out)
    if not runs:
        raise SystemExit(f"no results in {a.out}")
    peers = list(PEERS)
    if any("base" in by_sys for by_sys in runs.values()):
        # Another build of onnxtrain (run.sh's BASELINE): its column is the before/after ratio of a change, and
        # its losses must agree with ours like any peer's.
        peers.append(("base", f"onnxtrain {os.environ.get('BENCH_BASELINE_REV', '?')} (baseline)"))
    speed, checks, res, rows_json, versions = [], [], [], [], {}
    for (w, t) in sorted(runs, key=lambda k: (k[1], k[0])):
        name, unit, higher = RATE[w]
        by_sys = runs[(w, t)]
        ours = by_sys.get("onnxtrain", {})
        med = {s: statistics.median(v["value"] for v in rr.values()) for s, rr in by_sys.items()}
        for s, rr in by_sys.items():
            rec = next(iter(rr.values()))["rec"]
            if rec.get("versions"):
                versions[s] = rec["versions"]
        cells = [f"{fmt(med['onnxtrain'])} {unit}" if ours else "not run"]
        for s, label in peers:
            if s not in by_sys:
                cells += ["", ""]
                continue
            row = {"workload": w, "threads": t, "system": s, "metric": name, "unit": unit, "median": med[s],
                   "runs": [v["value"] for _, v in sorted(by_sys[s].items())],
                   "final_train_loss": [v["final"] for _, v in sorted(by_sys[s].items())][-1]}
            opt = by_sys[s][min(by_sys[s])]["rec"].get("optimizer")
            note = " (nesterov in numpy)" if opt and "numpy" in opt else ""
            if not ours:
                cells += [f"{fmt(med[s])} {unit}", "onnxtrain not run"]
                rows_json.append(row)
                continue
            chk = loss_check(w, ours, by_sys[s])
            row["loss_check"] = chk
            if chk["ok"]:
                per = [(ours[r]["value"] / by_sys[s][r]["value"]) if higher else
                       (by_sys[s][r]["value"] / ours[r]["value"]) for r in ours if r in by_sys[s]]
                ratio = med["onnxtrain"] / med[s] if higher else med[s] / med["onnxtrain"]
                row.update(ratio=ratio, ratio_range=[min(per), max(per)])
                cells += [f"{fmt(med[s])} {unit}{note}", f"**{ratio:.2f}×** ({min(per):.2f}-{max(per):.2f})"]
            else:
                cells += [f"{fmt(med[s])} {unit}{note}", "loss mismatch: not compared"]
            rows_json.append(row)
            cv = (f"{chk['early_curve_diff']:.1e} / {chk['curve_max_diff']:.1e}" if "early_curve_diff" in chk
                  else chk.get("why", ""))
            of, pf = list(ours.values())[-1]["final"], list(by_sys[s].values())[-1]["final"]
            checks.append(f"| {w} | {t} | {label}{note} | {of:.6g} | {pf:.6g} | {chk['final_rel_diff']:.1e} "
                          f"(≤{chk['final_tol']:.0e}) | {cv} | {'agree' if chk['ok'] else '**MISMATCH**'} |")
        if ours:
            rows_json.append({"workload": w, "threads": t, "system": "onnxtrain", "metric": name, "unit": unit,
                              "median": med["onnxtrain"], "runs": [v["value"] for _, v in sorted(ours.items())],
                              "final_train_loss": list(ours.values())[-1]["final"]})
        speed.append(f"| {w} | {t} | " + " | ".join(cells) + " |")
        # Resources: peak RSS of each system, GFLOP/s of the GEMM-bound workloads against the measured peak.
        fl = train_flops(w)
        parts = []
        for s in ["onnxtrain"] + [p for p, _ in peers]:
            if s not in by_sys:
                continue
            rss = [v["rss"] for v in by_sys[s].values() if v["rss"]]
            txt = f"{s}: {max(rss):.0f} MiB" if rss else f"{s}: ?"
            for row in rows_json:
                if row["workload"] == w and row["threads"] == t and row["system"] == s:
                    row["peak_rss_mb"] = max(rss) if rss else None
                    if fl and s != "sklearn":
                        g = med[s] * fl / 1e9
                        row["gflops"] = g
                        if t in peak:
                            row["pct_of_gemm_peak"] = 100 * g / peak[t]["gflops"]
                            txt += f", {g:.1f} GFLOP/s ({100 * g / peak[t]['gflops']:.0f}%)"
                        else:
                            txt += f", {g:.1f} GFLOP/s"
            parts.append(txt)
        res.append(f"| {w} | {t} | " + "; ".join(parts) + " |")

    head = "| workload | threads | onnxtrain | " + " | ".join(f"{l} | ratio" for _, l in peers) + " |"
    lines = [head, "|" + "---|" * (3 + 2 * len(peers)), *speed, "",
             "Ratio = onnxtrain speed / peer speed from the medians over the rounds (>1: onnxtrain faster; W4 is "
             "µs/step, so peer time / onnxtrain time); brackets: per-round ratios. Each value is itself the median "
             "of 3 timed runs after warm-up. A ratio is shown only if the losses agree (below).", "",
             "| workload | threads | peer | final loss onnxtrain | final loss peer | final rel. diff (tol) | "
             "first-10-steps / whole-curve max diff ÷ mean loss | losses |", "|---|---|---|---|---|---|---|---|",
             *checks, "",
             "| workload | threads | peak RSS (whole process); GFLOP/s of the matrix products (% of the measured "
             "GEMM peak) |", "|---|---|---|", *res, ""]
    pk = "; ".join(f"{t} thread(s): {p['gflops']:.0f} GFLOP/s ({p['lib']}, {p['size']})" for t, p in sorted(peak.items()))
    # libgomp's wait policy moves every OpenMP-threaded system's 2-thread speed by up to 2x here
    # (docs/performance.md, "Threads on small work"), so each entry states the one it ran under.
    omp_env = {k: os.environ.get(k, "unset") for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    machine = {"cpu": cpu_model(), "cpus": os.cpu_count(), "kernel": platform.release(),
               "load_avg_start": a.load_start, "load_avg_end": a.load_end, "openmp_env": omp_env}
    lines.append(f"Machine: {machine['cpus']} CPUs, {machine['cpu']}, Linux {machine['kernel']}. GEMM peak "
                 f"(best of 5, 2048³/4096³): {pk or 'not measured'}. Load average (1/5/15 min) at start "
                 f"{a.load_start}, at end {a.load_end}. OpenMP: "
                 + ", ".join(f"{k}={v}" for k, v in omp_env.items())
                 + " (unset: libgomp's default, idle workers spin before they sleep).")
    vtxt = "; ".join(f"{s}: " + ", ".join(f"{k} {v}" for k, v in (vv or {}).items()) for s, vv in versions.items()
                     if vv)
    rep = os.environ.get("BENCH_REPLICAS", "1")
    lines.append("onnxtrain's threads: " + (
        "one session on the OpenMP threads." if rep == "1" else
        "as many one-thread replicas as threads (docs/replicas.md) for w1, w2, w3 and w1sk; one session on the "
        "OpenMP threads for w4 (REPLICAS=auto)." if rep == "auto" else
        f"{rep} one-thread replicas (docs/replicas.md)."))
    lines.append(f"Versions: onnxtrain {git_rev()}; {vtxt}.")
    print("\n".join(lines))
    doc = {"command": a.command, "date": time.strftime("%Y-%m-%d %H:%M %Z"), "machine": machine, "replicas": rep,
           "threads": sorted({t for _, t in runs}), "gemm_peak": peak, "onnxtrain": git_rev(), "versions": versions,
           "tolerances": {"early_steps": EARLY_STEPS, "early_tol": EARLY_TOL, "final_tol": FINAL_TOL},
           "rows": rows_json}
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(doc, f, indent=1, default=float)


def git_rev():
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        return subprocess.run(["git", "-C", here, "describe", "--always", "--dirty"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


if __name__ == "__main__":
    main()
