#!/usr/bin/env python3
"""Builds the markdown table of benchmarks/run.sh from one results folder (onnxtrain_*.jsonl, torch_*.jsonl
and the per-step loss files of every process), printing it to stdout.

Speed ratio = onnxtrain speed / torch speed (>1: onnxtrain faster), from the medians over the rounds; the
range is that of the per-round ratios (each torch process paired with the onnxtrain process right after it).
Loss curves: per-step losses of the untimed reference run of each process, onnxtrain vs torch of the same
round; the worst round is shown.
"""
import glob
import json
import os
import platform
import re
import statistics
import sys

import numpy as np

RATE = {"w1": ("train_samples_per_s", "samples/s", True), "w2": ("train_samples_per_s", "samples/s", True),
        "w3": ("train_tokens_per_s", "tokens/s", True), "w4": ("us_per_step", "µs/step", False),
        "w1sgd": ("train_samples_per_s", "samples/s", True)}


def records(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def metric(recs, name):
    for r in recs:
        if r["metric"] == name:
            return r
    raise SystemExit(f"no {name} record")


def fmt(v):
    return f"{v:.4g}" if v < 1e5 else f"{v:,.0f}"


def main(out):
    runs = {}  # (w, t) -> round -> {"onnxtrain": recs, "torch": recs}
    for p in glob.glob(os.path.join(out, "*.jsonl")):
        m = re.match(r"(onnxtrain|torch)_(\w+?)_t(\d+)_r(\d+)\.jsonl$", os.path.basename(p))
        if m:
            sys_, w, t, r = m.group(1), m.group(2), int(m.group(3)), int(m.group(4))
            runs.setdefault((w, t), {}).setdefault(r, {})[sys_] = records(p)
    if not runs:
        raise SystemExit(f"no results in {out}")
    rows, probes, blas, torch_v = [], [], set(), set()
    for (w, t) in sorted(runs, key=lambda k: (k[1], k[0])):
        name, unit, higher = RATE[w]
        ot_v, to_v, ratios, rel, absn, fin_ot, fin_to = [], [], [], [], [], [], []
        for r, d in sorted(runs[(w, t)].items()):
            if set(d) != {"onnxtrain", "torch"}:
                continue
            a, b = metric(d["onnxtrain"], name)["value"], metric(d["torch"], name)["value"]
            ot_v.append(a)
            to_v.append(b)
            ratios.append(a / b if higher else b / a)
            fin_ot.append(metric(d["onnxtrain"], "final_train_loss")["value"])
            tf = metric(d["torch"], "final_train_loss")
            fin_to.append(tf["value"])
            for k in ("probe_start", "probe_end"):
                g = (tf.get(k) or {}).get("gemm1t_gflops")
                if g:
                    probes.append(g)
            blas.add(tf.get("blas", "?"))
            torch_v.add(tf.get("versions", {}).get("torch", "?"))
            lo = np.loadtxt(os.path.join(out, f"onnxtrain_{w}_t{t}_r{r}_losses.txt"), dtype=np.float64)
            lt = np.load(os.path.join(out, f"torch_{w}_t{t}_r{r}_losses.npy")).astype(np.float64)
            if lo.shape != lt.shape:
                raise SystemExit(f"{w} t{t} r{r}: {lo.shape[0]} onnxtrain steps vs {lt.shape[0]} torch steps")
            diff = np.abs(lo - lt)
            rel.append(float(np.max(diff / np.maximum(np.abs(lt), np.finfo(np.float64).tiny))))
            absn.append(float(np.max(diff) / np.mean(np.abs(lt))))
        if not ratios:
            continue
        mo, mt = statistics.median(ot_v), statistics.median(to_v)
        ratio = mo / mt if higher else mt / mo
        fo, ft = fin_ot[-1], fin_to[-1]
        rows.append(f"| {w} | {t} | {fmt(mo)} {unit} | {fmt(mt)} {unit} | **{ratio:.2f}×** "
                    f"({min(ratios):.2f}-{max(ratios):.2f}, n={len(ratios)}) | {fo:.6g} | {ft:.6g} | "
                    f"{abs(fo - ft) / abs(ft):.1e} | {max(rel):.1e} | {max(absn):.1e} |")
    lines = [
        "| workload | threads | onnxtrain | PyTorch eager | speed ratio (range) | final loss onnxtrain | "
        "final loss torch | final rel. diff | loss curve max rel. diff | max abs. diff / mean loss |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *rows, "",
        f"Speed ratio = onnxtrain speed / PyTorch speed (>1: onnxtrain faster). Machine: {os.cpu_count()} CPUs, "
        f"{cpu_model()}; torch {', '.join(sorted(torch_v))}; torch BLAS {'; '.join(sorted(blas))}; "
        + (f"probe 1-thread sgemm {min(probes)}-{max(probes)} GFLOP/s." if probes else "no GEMM probe."),
    ]
    print("\n".join(lines))


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
    if len(sys.argv) != 2:
        raise SystemExit("usage: report.py RESULTS_DIR")
    main(sys.argv[1])
