#!/usr/bin/env python3
"""Data-parallel training from Python: launch the same script on N ranks with mpirun (docs/distributed.md).

    examples/make_mlp.py mlp.onnx --sizes 16 32 8 1
    mpirun -np 2 python examples/python/train_mpi.py mlp.onnx --out run --steps 20 --batch 8

Every rank holds the whole model and reads its own shard of each epoch's order (DistributedSampler); the
session averages the ranks' gradients before each optimizer step, so 2 ranks with --batch 8 take the steps
one process takes with --batch 16. Without mpirun the script trains alone. Rank 0 prints and writes
run/checkpoint.onnx, which resumes in any number of processes.
"""
import argparse
import pathlib

import numpy as np

import onnxtrain as ot


def dataset(n=512, features=16, seed=0):
    """Deterministic regression data, the same on every rank (each reads its shard of it)."""
    r = np.random.default_rng(seed)
    x = r.normal(size=(n, features)).astype(np.float32)
    y = (np.sin(x[:, :4]).sum(1, keepdims=True) + 0.1 * x[:, 4:5]).astype(np.float32)
    return x, y


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model")
    p.add_argument("--out", required=True, help="folder for checkpoint.onnx")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=8, help="rows per step on each rank")
    p.add_argument("--seed", type=int, default=7, help="the shuffle's seed: the same on every rank")
    p.add_argument("--dump-weights", action="store_true", help="every rank writes weights_rank<r>.npz (for tests)")
    a = p.parse_args()

    comm = ot.communicator_from_environment()  # MPI's ranks under mpirun, this process alone otherwise
    s = ot.TrainingSession(a.model, loss="mse", optimizer="momentum", learning_rate=0.05, parallel=comm)
    x, y = dataset()
    sampler = ot.DistributedSampler(len(x), comm.rank, comm.size, shuffle=True, seed=a.seed)
    batches = sampler.num_samples // a.batch
    if comm.rank == 0:
        print(f"{comm.size} rank(s) ({comm.backend}), {a.batch} rows per rank per step")
    step = 0
    while step < a.steps:
        sampler.set_epoch(step // batches)
        idx = sampler.indices()
        for b in range(batches):
            if step == a.steps:
                break
            rows = idx[b * a.batch:(b + 1) * a.batch]
            loss = s.train_step({"x": x[rows], s.target_name: y[rows]})  # the loss of every rank's batch
            step += 1
            if comm.rank == 0 and step % 5 == 0:
                print(f"step {step:3d}  loss {loss:.6f}")
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    s.save_checkpoint(out / "checkpoint.onnx")  # rank 0 writes; the others return at once
    if a.dump_weights:
        np.savez(out / f"weights_rank{comm.rank}.npz", **s.weights())
    if comm.rank == 0:
        print(f"wrote {out / 'checkpoint.onnx'}")


if __name__ == "__main__":
    main()
