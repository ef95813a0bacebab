"""Writes a model trained through the ONNX training spec, built with onnx.helper.make_training_info the way
onnx documents it (Gradient op + an ai.onnx.preview.training optimizer), plus a numpy run of the same training.

    python training_info_reference.py DIR adam|momentum

DIR gets model.onnx, the batches x<k>.bin / t<k>.bin (raw float32) of each step, and the expected W.bin, B.bin
after the steps and loss.bin per step (raw float64), computed with onnx's own reference update rules
(onnx.backend.test.case.node) and hand-written gradients.
"""
import pathlib
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.backend.test.case.node.adam import apply_adam
from onnx.backend.test.case.node.momentum import apply_momentum

STEPS, N, FIN, FOUT = 5, 8, 3, 2
DOMAIN = "ai.onnx.preview.training"


def build(kind, rng):
    w0 = rng.normal(size=(FIN, FOUT)).astype(np.float32)
    b0 = rng.normal(size=(FOUT,)).astype(np.float32)
    main = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["XW"]), helper.make_node("Add", ["XW", "B"], ["Y"])], "linear",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", FIN])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", FOUT])],
        [numpy_helper.from_array(w0, "W"), numpy_helper.from_array(b0, "B")])

    # Stale state on purpose: the initialization graph must reset it before the first step.
    stale = {n: rng.normal(size=s).astype(np.float32) for n, s in
             [("V_W", (FIN, FOUT)), ("V_B", (FOUT,)), ("H_W", (FIN, FOUT)), ("H_B", (FOUT,))]}
    state_names = ["V_W", "V_B"] + (["H_W", "H_B"] if kind == "adam" else [])
    alg_inits = [numpy_helper.from_array(np.array(0.1, np.float32), "R"),
                 numpy_helper.from_array(np.array(7, np.int64), "T"),
                 numpy_helper.from_array(np.array(1, np.int64), "one")]
    alg_inits += [numpy_helper.from_array(stale[n], n) for n in state_names]
    nodes = [helper.make_node("Sub", ["Y", "Target"], ["D"]),
             helper.make_node("Mul", ["D", "D"], ["D2"]),
             helper.make_node("ReduceMean", ["D2"], ["Loss"], keepdims=0),
             helper.make_node("Gradient", ["W", "B"], ["dW", "dB"], domain=DOMAIN, xs=["W", "B"], y="Loss"),
             helper.make_node("Add", ["T", "one"], ["T_new"])]
    if kind == "adam":
        nodes.append(helper.make_node("Adam", ["R", "T", "W", "B", "dW", "dB", "V_W", "V_B", "H_W", "H_B"],
                                      ["W_new", "B_new", "V_W_new", "V_B_new", "H_W_new", "H_B_new"], domain=DOMAIN,
                                      alpha=0.9, beta=0.999, epsilon=1e-7, norm_coefficient=0.01))
    else:
        nodes.append(helper.make_node("Momentum", ["R", "T", "W", "B", "dW", "dB", "V_W", "V_B"],
                                      ["W_new", "B_new", "V_W_new", "V_B_new"], domain=DOMAIN,
                                      alpha=0.9, beta=0.5, mode="standard", norm_coefficient=0.01))
    updated = ["W", "B"] + state_names
    algorithm = helper.make_graph(
        nodes, "algorithm", [helper.make_tensor_value_info("Target", TensorProto.FLOAT, ["N", FOUT])],
        [helper.make_tensor_value_info("Loss", TensorProto.FLOAT, [])] +
        [helper.make_tensor_value_info(n + "_new", TensorProto.FLOAT, None) for n in updated] +
        [helper.make_tensor_value_info("T_new", TensorProto.INT64, [])], alg_inits)
    init_nodes = [helper.make_node("Constant", [], ["T0"], value=numpy_helper.from_array(np.array(0, np.int64)))]
    init_nodes += [helper.make_node("Constant", [], [n + "0"], value=numpy_helper.from_array(np.zeros_like(stale[n])))
                   for n in state_names]
    initialization = helper.make_graph(
        init_nodes, "initialization", [],
        [helper.make_tensor_value_info("T0", TensorProto.INT64, [])] +
        [helper.make_tensor_value_info(n + "0", TensorProto.FLOAT, list(stale[n].shape)) for n in state_names])
    ti = helper.make_training_info(algorithm, [(n, n + "_new") for n in updated] + [("T", "T_new")],
                                   initialization, [("T", "T0")] + [(n, n + "0") for n in state_names])
    model = helper.make_model(main, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, 1)])
    model.training_info.append(ti)
    return model, w0, b0


def main():
    out, kind = pathlib.Path(sys.argv[1]), sys.argv[2]
    rng = np.random.default_rng(0 if kind == "adam" else 1)
    model, w, b = build(kind, rng)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, out / "model.onnx")
    w, b = w.astype(np.float64), b.astype(np.float64)
    v_w, v_b, h_w, h_b = np.zeros_like(w), np.zeros_like(b), np.zeros_like(w), np.zeros_like(b)
    t, losses = 0, []
    for k in range(STEPS):
        x = rng.normal(size=(N, FIN)).astype(np.float32)
        tgt = rng.normal(size=(N, FOUT)).astype(np.float32)
        x.tofile(out / f"x{k}.bin")
        tgt.tofile(out / f"t{k}.bin")
        y = x.astype(np.float64) @ w + b
        d = y - tgt
        losses.append(np.mean(d * d))
        dy = 2 * d / d.size
        g_w, g_b = x.T.astype(np.float64) @ dy, dy.sum(0)
        if kind == "adam":
            w, v_w, h_w = apply_adam(0.1, t, w, g_w, v_w, h_w, 0.01, 0.0, 0.9, 0.999, 1e-7)
            b, v_b, h_b = apply_adam(0.1, t, b, g_b, v_b, h_b, 0.01, 0.0, 0.9, 0.999, 1e-7)
        else:
            w, v_w = apply_momentum(0.1, t, w, g_w, v_w, 0.01, 0.9, 0.5)
            b, v_b = apply_momentum(0.1, t, b, g_b, v_b, 0.01, 0.9, 0.5)
        t += 1
    w.tofile(out / "W.bin")
    b.tofile(out / "B.bin")
    np.array(losses).tofile(out / "loss.bin")


if __name__ == "__main__":
    main()
