"""Train a model with a data-dependent loop: a torch.jit.script module whose `while` refines a hidden state until
it saturates (at most 6 times), exported to ONNX as a Loop whose condition the body computes. onnxtrain
differentiates the Loop (its backward is a Loop of its own, docs/gradients.md "Control flow"), trains it with
Adam, and exports a model that onnxruntime runs.

    python examples/python/train_control_flow.py OUT_DIR
"""
import io
import pathlib
import sys
import warnings

import numpy as np
import torch
from torch import nn

import onnxtrain as ot


class Refine(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp, self.step, self.out = nn.Linear(4, 16), nn.Linear(16, 16), nn.Linear(16, 1)

    def forward(self, x):
        h = torch.tanh(self.inp(x))
        i = 0
        while bool(h.abs().mean() < 0.9) and i < 6:  # how many times depends on the data and the weights
            h = torch.tanh(self.step(h) + h)
            i += 1
        return self.out(h)


def export(module):
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(torch.jit.script(module), (torch.zeros(32, 4),), f, opset_version=17, dynamo=False,
                          input_names=["x"], output_names=["y"], dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
    return f.getvalue()


def main(out_dir):
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((512, 4)).astype(np.float32)
    y = (np.sin(x[:, :1]) + x[:, 1:2] * x[:, 2:3]).astype(np.float32)

    session = ot.TrainingSession(export(Refine()), loss="mse", optimizer="adam", learning_rate=1e-2)
    losses = []
    for epoch in range(15):
        for i in range(0, len(x), 32):
            losses.append(session.train_step({"x": x[i:i + 32], session.target_name: y[i:i + 32]}))
    (pred,) = session.infer({"x": x})
    print(f"steps={session.step} first_loss={losses[0]:.4f} last_loss={losses[-1]:.4f} "
          f"mse={float(np.mean((pred - y) ** 2)):.4f}")
    session.export_inference(out / "trained.onnx")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "control_flow_out")
