"""Replicas: split every batch over one-thread copies of the session (docs/replicas.md). Trains the same MLP
twice on the same batches, once as one session on the OpenMP threads and once as two replicas, and prints both
runs' losses and speeds, then resumes the replicas' checkpoint in a single session.

    python examples/python/train_replicas.py OUT_DIR
"""
import pathlib
import sys
import time

import numpy as np

import onnxtrain as ot

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from make_mlp import make_mlp  # noqa: E402


def train(model, x, y, replicas):
    session = ot.TrainingSession(model, loss="mse", optimizer="adam", learning_rate=1e-3, replicas=replicas)
    start = time.perf_counter()
    for _ in range(3):  # epochs, each in one native call
        result = session.train_epoch({"x": x, session.target_name: y}, batch_size=128)
    seconds = time.perf_counter() - start
    return session, result["loss"], 3 * len(x) / seconds


def main(out_dir):
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8192, 64)).astype(np.float32)
    y = (np.sin(x[:, :1]) + 0.5 * x[:, 1:2] ** 2).astype(np.float32)
    model = make_mlp([64, 256, 256, 1])

    one, one_losses, one_speed = train(model, x, y, replicas=1)
    two, two_losses, two_speed = train(model, x, y, replicas=2)
    # The same steps up to float rounding: the two loss curves agree closely, they are not bit-identical.
    gap = float(np.max(np.abs(two_losses - one_losses) / one_losses))
    print(f"replicas=1 last_loss={one_losses[-1]:.5f} samples_per_s={one_speed:.0f}")
    print(f"replicas=2 last_loss={two_losses[-1]:.5f} samples_per_s={two_speed:.0f}")
    print(f"largest_relative_gap={gap:.2e}")

    # A replicated session's checkpoint is an ordinary one: it resumes alone, or on any number of replicas.
    two.save_checkpoint(out / "replicas.onnx")
    resumed = ot.TrainingSession.from_checkpoint(out / "replicas.onnx")
    same = all(np.array_equal(resumed.get_weight(k), v) for k, v in two.weights().items())
    print(f"resumed_step={resumed.step} resumed_weights_equal={same}")
    return gap, same


if __name__ == "__main__":
    main(sys.argv[1])
