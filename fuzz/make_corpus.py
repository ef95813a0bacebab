"""Regenerates the seed corpus in fuzz/corpus/ (small valid inputs the fuzzers mutate).

    .venv/bin/python fuzz/make_corpus.py BUILD_DIR     # BUILD_DIR holds examples/train_mlp (for checkpoints)

Seeds: the graph tests' models (tests/graph/make_models.py), small MLPs (examples/make_mlp.py), a tiny CNN, and
trainable checkpoints written by examples/train_mlp with different optimizers. Crash reproducers that libFuzzer
finds are added next to these by hand (named crash-*), and are never regenerated away.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
import onnx

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(here)
build = sys.argv[1]
py = sys.executable
corpus = {name: os.path.join(here, "corpus", name) for name in ("load_model", "gradients", "checkpoint")}
for d in corpus.values():
    os.makedirs(d, exist_ok=True)


def put(targets, name, data):
    for t in targets:
        with open(os.path.join(corpus[t], name), "wb") as f:
            f.write(data)


def tiny_cnn():
    rng = np.random.default_rng(0)
    w = nh.from_array(rng.standard_normal((2, 1, 3, 3)).astype(np.float32) * 0.3, "conv.weight")
    b = nh.from_array(np.zeros(2, np.float32), "conv.bias")
    fc = nh.from_array(rng.standard_normal((8, 3)).astype(np.float32) * 0.3, "fc.weight")
    shape = nh.from_array(np.array([0, -1], np.int64), "flat")
    nodes = [h.make_node("Conv", ["x", "conv.weight", "conv.bias"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             h.make_node("Relu", ["c"], ["r"], name="relu"),
             h.make_node("MaxPool", ["r"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
             h.make_node("Reshape", ["p", "flat"], ["f"], name="flatten"),
             h.make_node("MatMul", ["f", "fc.weight"], ["l"], name="fc"),
             h.make_node("Softmax", ["l"], ["y"], name="softmax", axis=-1)]
    g = h.make_graph(nodes, "cnn", [h.make_tensor_value_info("x", T.FLOAT, ["batch", 1, 4, 4])],
                     [h.make_tensor_value_info("y", T.FLOAT, ["batch", 3])], initializer=[w, b, fc, shape])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(m, full_check=True)
    return m.SerializeToString()


with tempfile.TemporaryDirectory() as tmp:
    subprocess.run([py, os.path.join(root, "tests/graph/make_models.py"), tmp], check=True, stdout=subprocess.DEVNULL)
    for f in sorted(os.listdir(tmp)):
        if f.endswith(".onnx") and f != "ext.onnx":  # external data needs a folder; bytes have none
            put(["load_model", "gradients"], f, open(os.path.join(tmp, f), "rb").read())
    for sizes, opset in (("4 8 1", 18), ("3 5 3", 17)):
        path = os.path.join(tmp, "mlp.onnx")
        subprocess.run([py, os.path.join(root, "examples/make_mlp.py"), path, "--sizes", *sizes.split(),
                        "--opset", str(opset)], check=True, stdout=subprocess.DEVNULL)
        put(["load_model", "gradients"], f"mlp_{sizes.replace(' ', '_')}.onnx", open(path, "rb").read())
    put(["load_model", "gradients"], "cnn.onnx", tiny_cnn())
    mlp = os.path.join(tmp, "mlp.onnx")
    subprocess.run([py, os.path.join(root, "examples/make_mlp.py"), mlp, "--sizes", "3", "4", "1"], check=True,
                   stdout=subprocess.DEVNULL)
    for opt in ("sgd", "adam", "adagrad"):
        ckpt = os.path.join(tmp, f"ckpt_{opt}.onnx")
        subprocess.run([os.path.join(build, "examples/train_mlp"), mlp, "--epochs", "1", "--samples", "16",
                        "--batch", "8", "--optimizer", opt, "--checkpoint", ckpt], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        put(["checkpoint", "load_model"], f"ckpt_{opt}.onnx", open(ckpt, "rb").read())
