#!/usr/bin/env python3
"""Runs a peer script of ../shared/bench (PyTorch eager on its shared harness, or w1_mlp_sklearn.py), unchanged,
optionally keeps the per-step losses of its untimed reference run for the onnxtrain comparison, and appends the
process's peak resident memory to its JSONL as one more record (metric peak_rss_mb, same workload/peer/threads
as the script's last record).

  torch_peer.py PEER_SCRIPT.py [--losses OUT.npy] [peer args: --threads N --out RAW.jsonl ...]

The harness can only save those losses (--save-ref) into <models>/reference/, which is the read-only shared
folder; so the save is pointed at a temporary folder instead. models.py is imported first so that the
initial weights still come from the shared models folder.
"""
import atexit
import glob
import json
import os
import resource
import runpy
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PEERS = os.path.normpath(os.path.join(HERE, "..", "..", "shared", "bench", "peers"))


def setup():
    """Puts the shared peers folder on sys.path and handles --losses; returns nothing, edits sys.argv."""
    if not os.path.isfile(os.path.join(PEERS, "torch_harness.py")):
        sys.exit(f"shared benchmark harness not found at {PEERS} (expected ../shared next to the repo)")
    if PEERS not in sys.path:
        sys.path.insert(0, PEERS)
    if "--losses" not in sys.argv:
        return
    i = sys.argv.index("--losses")
    if i + 1 >= len(sys.argv):
        sys.exit("--losses needs a path")
    dest = sys.argv[i + 1]
    del sys.argv[i:i + 2]
    import bench_data
    import models  # noqa: F401  binds the shared MODELS_DIR for the initial weights before the patch below
    tmp = tempfile.mkdtemp(prefix="torch_peer_")
    bench_data.MODELS_DIR = tmp  # torch_harness reads it at call time, for --save-ref only
    sys.argv.append("--save-ref")

    def keep():
        found = glob.glob(os.path.join(tmp, "reference", "*_losses_t*.npy"))
        if found:
            shutil.move(found[0], dest)
        shutil.rmtree(tmp, ignore_errors=True)
    atexit.register(keep)


def record_peak_rss(out):
    """Peak RSS of this whole process (interpreter, libraries, data, warm-up and all runs), like every peer's."""
    try:
        with open(out) as f:
            last = [json.loads(line) for line in f if line.strip()][-1]
    except (OSError, IndexError):
        return  # the script failed before recording anything; its own error says why
    rec = {k: last[k] for k in ("workload", "peer", "threads") if k in last}
    rec.update(metric="peak_rss_mb", value=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, unit="MiB")
    with open(out, "a") as f:
        f.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    script = sys.argv[1]
    sys.argv = [script] + sys.argv[2:]
    setup()
    if "--out" in sys.argv[:-1]:
        atexit.register(record_peak_rss, sys.argv[sys.argv.index("--out") + 1])
    runpy.run_path(script, run_name="__main__")
