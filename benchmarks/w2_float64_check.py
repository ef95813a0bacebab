#!/usr/bin/env python3
"""Is a W2 loss-curve difference float32 noise? W2 (SGD nesterov momentum 0.9) amplifies any rounding
difference from step ~20 on, so onnxtrain and torch drift apart to several % by step 200 even when both are
right. This runs torch in float64 (the "exact" curve), torch in float32, and torch in float32 with the initial
weights scaled by 1 + 1e-7, and prints how far each curve, and onnxtrain's, is from the others.

  /usr/bin/python3 benchmarks/w2_float64_check.py ONNXTRAIN_LOSSES.txt   (bench_train --workload w2 --losses)

onnxtrain is fine if it is as close to float64 as torch float32 is (~20 s on 1 thread)."""
import os
import sys

import numpy as np

PEERS = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "bench",
                                      "peers"))
sys.path.insert(0, PEERS)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from bench_data import SPEC, load  # noqa: E402
from models import build  # noqa: E402


def run(X, L, dtype, scale=0.0):
    S, o = SPEC["w2"], SPEC["w2"]["optimizer"]
    B = S["batch"]
    m = build("w2").to(dtype)
    m.train()
    if scale:
        with torch.no_grad():
            for p in m.parameters():
                p.mul_(1 + scale)
    opt = torch.optim.SGD(m.parameters(), lr=o["lr"], momentum=o["momentum"], nesterov=o["nesterov"])
    out = []
    for i in range(S["steps"]):
        x, y = X[i * B:(i + 1) * B].to(dtype), L[i * B:(i + 1) * B]
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
        out.append(loss.item())
    return np.array(out)


def rel(a, b):
    r = np.abs(a - b) / np.abs(b)
    first = int(np.argmax(r > 1e-4)) if (r > 1e-4).any() else None
    return f"max rel. diff {r.max():.2e} (step {r.argmax()}), first step above 1e-4: {first}"


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    torch.set_num_threads(1)
    d = load("w2")
    X, L = torch.from_numpy(d["w2_X"]), torch.from_numpy(d["w2_labels"])
    f64, f32, f32p = run(X, L, torch.float64), run(X, L, torch.float32), run(X, L, torch.float32, 1e-7)
    ot = np.loadtxt(sys.argv[1]).reshape(-1)
    print("torch float32 vs torch float64:       ", rel(f32, f64))
    print("onnxtrain vs torch float64:           ", rel(ot, f64))
    print("onnxtrain vs torch float32:           ", rel(ot, f32))
    print("torch float32, weights x (1 + 1e-7):  ", rel(f32p, f32))


if __name__ == "__main__":
    main()
