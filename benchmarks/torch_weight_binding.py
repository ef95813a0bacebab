"""TrainModule: a training step with parameters bound in place (the default) against copying every parameter into
the session with set_weight after each optimizer step (what the wrapper falls back to for strided parameters).

    PYTHONPATH=build/release/python .venv/bin/python benchmarks/torch_weight_binding.py [REPEATS]

Prints the median step time of each, measured alternately in one run, and their ratio.
"""
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

import onnxtrain.torch as ott


def make():
    torch.manual_seed(0)
    return ott.TrainModule(nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                                         nn.Linear(1024, 10)))


def main(repeats):
    torch.set_num_threads(1)
    x, y = torch.randn(32, 512), torch.randint(0, 10, (32,))
    runs = {}
    for mode in (("copied", "bound") if "--reverse" in sys.argv else ("bound", "copied")):
        model = make()
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        F.cross_entropy(model(x), y).backward()  # export
        if mode == "copied":
            compiled = next(iter(model._cache.values()))
            compiled.copied.update(n for _, n in compiled.trainable)
            compiled.versions.clear()
        runs[mode] = (model, opt)
    times = {m: [] for m in runs}
    for _ in range(repeats):
        for mode, (model, opt) in runs.items():
            t0 = time.perf_counter()
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            times[mode].append(time.perf_counter() - t0)
    med = {m: statistics.median(t) for m, t in times.items()}
    params = sum(p.numel() for p in runs["bound"][0].parameters())
    print(f"parameters {params}  bound {med['bound'] * 1e3:.2f} ms/step  copied {med['copied'] * 1e3:.2f} ms/step  "
          f"copied/bound {med['copied'] / med['bound']:.3f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 30)
