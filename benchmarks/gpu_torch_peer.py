#!/usr/bin/env python3
"""PyTorch eager on a GPU (or the CPU) as the peer of `bench_train` with ONNXTRAIN_DEVICE=cuda:0, for
scripts/gpu_check.sh: the same shared workload (../shared/bench: models.py definitions, the saved initial
weights, bench_data.py's data and SPEC), the same batches and optimizer, the same protocol as bench_train and
peers/torch_harness.py (warm-up -> untimed reference run recording per-step losses -> timed runs from the initial
weights with a fresh optimizer -> median; final loss over the whole data set), printed as bench_train's JSON lines.

  gpu_torch_peer.py --workload w1|w2|w3|w4 [--device cuda] [--repeats 3] [--threads 1] [--losses PATH]
                    [--shared DIR]     (DIR = the shared bench folder, holding peers/ and models/)

Differences from the CPU harness, each because of the device: the data is moved to the device once, before any
timer (batches are views of it, as the CPU peers slice host memory); the timer waits for the device
(torch.cuda.synchronize) before it starts and stops; TF32 is off, as in onnxtrain's cuBLAS calls, so both compute
float32 products. onnxtrain's bench_train instead copies each batch from the host and reads each step's loss
back (train_step returns it), so this peer is the stronger baseline.
"""
import argparse
import json
import os
import resource
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
WARMUP = {"w1": 512, "w2": 20, "w3": 10, "w4": 500}  # the peer scripts' warm-up steps (bench_train's too)
RATE = {"w1": ("train_samples_per_s", "samples/s", 1), "w2": ("train_samples_per_s", "samples/s", 1),
        "w3": ("train_tokens_per_s", "tokens/s", 64), "w4": ("us_per_step", "us/step", 0)}
EVAL_CHUNK = {"w2": 1600, "w3": 200}  # rows per inference call for the final loss, as bench_train


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", required=True, choices=sorted(WARMUP))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--losses", help="write the reference run's per-step losses here, one per line")
    ap.add_argument("--shared", default=os.environ.get("BENCH_SHARED", os.path.join(HERE, "..", "..", "shared", "bench")))
    a = ap.parse_args()
    sys.path.insert(0, os.path.join(os.path.abspath(a.shared), "peers"))
    os.environ.setdefault("BENCH_MODELS_DIR", os.path.join(os.path.abspath(a.shared), "models"))

    import torch
    import torch.nn.functional as F
    import bench_data
    import models

    w = a.workload
    torch.set_num_threads(a.threads)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    S = bench_data.SPEC[w]
    d = bench_data.load(w)
    X, Y = (torch.from_numpy(d[S["data"][k]]).to(dev) for k in ("x", "target"))
    B, steps, o = S["batch"], S["steps"], S["optimizer"]
    if w == "w3":
        def loss_fn(out, t):
            return F.cross_entropy(out.reshape(-1, S["vocab"]), t.reshape(-1))
    elif w == "w2":
        loss_fn = F.cross_entropy
    else:
        loss_fn = F.mse_loss

    def make_opt(p):
        if o["type"] == "Adam":
            return torch.optim.Adam(p, lr=o["lr"], betas=tuple(o["betas"]), eps=o["eps"])
        if o["type"] == "AdamW":
            return torch.optim.AdamW(p, lr=o["lr"], betas=tuple(o["betas"]), eps=o["eps"], weight_decay=o["weight_decay"])
        return torch.optim.SGD(p, lr=o["lr"], momentum=o["momentum"], nesterov=o["nesterov"])

    def run(n, record=False):
        model = models.build(w).to(dev)  # the saved initial weights, every run
        model.train()
        opt = make_opt(model.parameters())
        batches = [(X[i * B:(i + 1) * B], Y[i * B:(i + 1) * B]) for i in range(n)]
        losses = []
        sync()
        t0 = time.perf_counter()
        for x, t in batches:
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), t)
            loss.backward()
            opt.step()
            if record:
                losses.append(loss.item())
        sync()
        return model, time.perf_counter() - t0, losses

    def full_loss(model):
        model.eval()
        chunk = EVAL_CHUNK.get(w, X.shape[0])
        with torch.no_grad():
            total = sum(loss_fn(model(X[i:i + chunk]), Y[i:i + chunk]).double().item() * len(X[i:i + chunk])
                        for i in range(0, X.shape[0], chunk))
        return total / X.shape[0]

    run(WARMUP[w])
    model, ref_s, losses = run(steps, record=True)
    ref_final = full_loss(model)
    if a.losses:
        with open(a.losses, "w") as f:
            f.writelines(f"{v:.9g}\n" for v in losses)
    times = []
    for _ in range(a.repeats):
        model, dt, _ = run(steps)
        times.append(dt)
    final = full_loss(model)

    metric, unit, per = RATE[w]
    vals = [dt / steps * 1e6 for dt in times] if per == 0 else [steps * B * per / dt for dt in times]
    peer = f"pytorch-eager-{dev.type}"
    base = {"workload": w, "peer": peer, "threads": a.threads}
    gpu = torch.cuda.get_device_name(dev) if cuda else "cpu"
    print(json.dumps({**base, "metric": metric, "value": statistics.median(vals), "unit": unit, "runs": vals,
                      "times_s": times, "notes": f"runs {min(vals):.4g}-{max(vals):.4g}; {gpu}; torch {torch.__version__}"}))
    print(json.dumps({**base, "metric": "final_train_loss", "value": final, "unit": "loss", "reference_run_final": ref_final,
                      "first_step_loss": losses[0], "last_step_loss": losses[-1], "ref_run_s": ref_s}))
    print(json.dumps({**base, "metric": "peak_rss_mb", "value": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "unit": "MiB"}))
    if cuda:
        print(json.dumps({**base, "metric": "peak_device_mb", "value": torch.cuda.max_memory_allocated(dev) / 2**20,
                          "unit": "MiB"}))


if __name__ == "__main__":
    main()
