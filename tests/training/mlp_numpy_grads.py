"""Independent numpy check of the first step of the MLP end-to-end test.

Reads the model, the batch and onnxtrain's gradients from DIR; recomputes MSE-loss gradients of a
Gemm(transB=1)+ReLU MLP by hand in float64 and exits non-zero when any differs beyond float32 tolerance.
"""
import sys

import numpy as np
import onnx
from onnx import numpy_helper

d = sys.argv[1]
m = onnx.load(f"{d}/mlp.onnx")
W = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in m.graph.initializer}
x = np.load(f"{d}/x.npy").astype(np.float64)
t = np.load(f"{d}/target.npy").astype(np.float64)
layers = sorted({k.split(".")[0] for k in W}, key=lambda s: int(s[2:]))

acts, pre = [x], []
for i, l in enumerate(layers):
    z = acts[-1] @ W[f"{l}.weight"].T + W[f"{l}.bias"]
    pre.append(z)
    acts.append(np.maximum(z, 0) if i < len(layers) - 1 else z)
y = acts[-1]
loss = np.mean((y - t) ** 2)
g = 2 * (y - t) / y.size
ref = {}
for i in reversed(range(len(layers))):
    l = layers[i]
    if i < len(layers) - 1:
        g = g * (pre[i] > 0)
    ref[f"{l}.weight"] = g.T @ acts[i]
    ref[f"{l}.bias"] = g.sum(0)
    g = g @ W[f"{l}.weight"]

ok = True
ours_loss = float(np.load(f"{d}/loss.npy"))
if not np.isclose(ours_loss, loss, rtol=1e-5):
    print(f"loss: onnxtrain {ours_loss} numpy {loss}")
    ok = False
for k, r in ref.items():
    ours = np.load(f"{d}/{k}_grad.npy").astype(np.float64)
    err = np.max(np.abs(ours - r)) / (np.max(np.abs(r)) + 1e-12)
    print(f"{k}: max relative error {err:.2e}")
    if ours.shape != r.shape or err > 1e-4:
        ok = False
sys.exit(0 if ok else 1)
