#!/usr/bin/env python3
"""W1 model and data with plain SGD (lr 0.01) on PyTorch eager: MLP 64->256->256->1, MSE, batch 128, 512
steps. The peer of onnxtrain's "w1sgd" (W1 proper uses Adam; w1sgd is kept for older results); otherwise
identical to ../shared/bench/peers/w1_mlp_torch.py and timed by the same shared harness."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_peer  # noqa: E402

torch_peer.setup()  # the shared peers folder on sys.path; --losses OUT.npy

from torch_harness import parse, run_benchmark  # noqa: E402

args = parse(__doc__)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from bench_data import SPEC, load  # noqa: E402

S = SPEC["w1"]
d = load("w1")
X, Y = torch.from_numpy(d["w1_X"]), torch.from_numpy(d["w1_y"])
B, STEPS = S["batch"], S["steps"]
LR = 0.01  # W4's SGD learning rate; W1's Adam lr of 1e-3 would barely move plain SGD in one epoch


def eval_mse(model):
    model.eval()
    with torch.no_grad():
        return F.mse_loss(model(X), Y).item()


run_benchmark(
    args, "w1",
    make_opt=lambda p: torch.optim.SGD(p, lr=LR),
    step_batch=lambda i: (X[i * B:(i + 1) * B], Y[i * B:(i + 1) * B]),
    loss_fn=F.mse_loss, eval_fn=eval_mse, steps=STEPS, warmup_steps=STEPS,
    units_per_step=B, rate_metric="train_samples_per_s", rate_unit="samples/s")
