"""The thin binding: train an ONNX MLP (written by examples/make_mlp.py) on a synthetic regression with
onnxtrain.TrainingSession, checkpoint it, resume, and export the inference model.

    python examples/python/train_session.py OUT_DIR
"""
import pathlib
import sys

import numpy as np

import onnxtrain as ot

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from make_mlp import make_mlp  # noqa: E402


def main(out_dir):
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((512, 8)).astype(np.float32)
    y = np.sin(x[:, :1]) + 0.5 * x[:, 1:2] ** 2  # a smooth target the MLP can fit

    session = ot.TrainingSession(make_mlp([8, 64, 1]), loss="mse", optimizer="adam", learning_rate=3e-3,
                                 schedule=ot.ScheduleSpec(kind="cosine", total_steps=400))
    losses = []
    for epoch in range(25):
        for i in range(0, len(x), 32):
            losses.append(session.train_step({"x": x[i:i + 32], session.target_name: y[i:i + 32]}))
        if epoch == 9:
            session.save_checkpoint(out / "checkpoint.onnx")
            session = ot.TrainingSession.from_checkpoint(out / "checkpoint.onnx")  # resume exactly where we were
    (pred,) = session.infer({"x": x})
    print(f"steps={session.step} first_loss={losses[0]:.4f} last_loss={losses[-1]:.4f} "
          f"mse={float(np.mean((pred - y) ** 2)):.4f}")
    session.export_inference(out / "trained.onnx")
    return losses, float(np.mean((pred - y) ** 2))


if __name__ == "__main__":
    main(sys.argv[1])
