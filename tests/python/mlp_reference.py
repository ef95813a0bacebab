"""Independent numpy reference for a Gemm(transB=1)+ReLU MLP with a mean-squared-error loss, in float64.

As a script it checks the MLP end-to-end test of the C++ suite (tests/training/test_mlp_e2e.cpp):
    python mlp_reference.py DIR
reads DIR/mlp.onnx, x.npy, target.npy, loss.npy and <weight>_grad.npy and exits non-zero on a mismatch.
"""
import sys

import numpy as np
import onnx
from onnx import numpy_helper


def mlp_loss_and_grads(model, x, t):
    """Loss and gradient of every weight, by hand: the layers are fc1, fc2, ... in order."""
    W = {i.name: numpy_helper.to_array(i).astype(np.float64) for i in model.graph.initializer}
    x, t = x.astype(np.float64), t.astype(np.float64)
    layers = sorted({k.split(".")[0] for k in W}, key=lambda s: int(s[2:]))
    acts, pre = [x], []
    for i, l in enumerate(layers):
        z = acts[-1] @ W[f"{l}.weight"].T + W[f"{l}.bias"]
        pre.append(z)
        acts.append(np.maximum(z, 0) if i < len(layers) - 1 else z)
    y = acts[-1]
    loss = np.mean((y - t) ** 2)
    g = 2 * (y - t) / y.size
    grads = {}
    for i in reversed(range(len(layers))):
        l = layers[i]
        if i < len(layers) - 1:
            g = g * (pre[i] > 0)
        grads[f"{l}.weight"] = g.T @ acts[i]
        grads[f"{l}.bias"] = g.sum(0)
        g = g @ W[f"{l}.weight"]
    return loss, grads


def compare(loss, grads, ref_loss, ref_grads, rtol=1e-4):
    """Messages for every disagreement (empty when all agree)."""
    bad = []
    if not np.isclose(loss, ref_loss, rtol=1e-5):
        bad.append(f"loss: {loss} vs reference {ref_loss}")
    for k, r in ref_grads.items():
        ours = np.asarray(grads[k], dtype=np.float64)
        err = np.max(np.abs(ours - r)) / (np.max(np.abs(r)) + 1e-12)
        print(f"{k}: max relative error {err:.2e}")
        if ours.shape != r.shape or err > rtol:
            bad.append(f"{k}: relative error {err:.2e} (shape {ours.shape} vs {r.shape})")
    return bad


def main(d):
    model = onnx.load(f"{d}/mlp.onnx")
    ref_loss, ref = mlp_loss_and_grads(model, np.load(f"{d}/x.npy"), np.load(f"{d}/target.npy"))
    ours = {k: np.load(f"{d}/{k}_grad.npy") for k in ref}
    bad = compare(float(np.load(f"{d}/loss.npy")), ours, ref_loss, ref)
    print("\n".join(bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
