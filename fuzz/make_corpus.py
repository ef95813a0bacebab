"""Regenerates the seed corpus in fuzz/corpus/ (small valid inputs the fuzzers mutate).

    .venv/bin/python fuzz/make_corpus.py BUILD_DIR [config]   # BUILD_DIR holds examples/train_mlp and cli/onnxtrain;
                                                              # "config": only the config parser's seeds

Seeds: the graph tests' models (tests/graph/make_models.py), small MLPs (examples/make_mlp.py), a tiny CNN,
trainable checkpoints written by examples/train_mlp with different optimizers, and for the config parser the
example configs, the reference config (`onnxtrain config`) and broken configs (CONFIG_SEEDS below). Crash
reproducers that libFuzzer finds are added next to these by hand (named crash-*), and are never regenerated away.
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
corpus = {name: os.path.join(here, "corpus", name) for name in ("load_model", "gradients", "checkpoint", "config")}
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


# Config parser seeds: text, then optional NUL-separated `--set` overrides (fuzz/fuzz_config.cpp). The broken
# ones each hit one error path of cli/config.cpp.
BASE = "model: m.onnx\ndata:\n  train: t.npz\n"
CONFIG_SEEDS = {
    "minimal.yaml": BASE,
    "overrides.yaml": BASE + "\0train.batch_size=7\0schedule.kind=cosine\0optimizer.groups=[{match: [a], learning_rate: 0.1}]",
    "full.yaml": BASE + """trainable: ["head.*"]
frozen: [body.weight]
optimizer:
  kind: adamw
  learning_rate: 3e-4
  weight_decay: null
  groups:
    - {match: ["head.bias"], learning_rate: 0.1, weight_decay: 0}
loss: {kind: cross_entropy, label_smoothing: 0.1, ignore_index: null, class_weights: [1, 2.5]}
data:
  train: [a.npy, b.npy]
  inputs: {x: [c1, c2], z: zz}
  target: label
  validation_split: 0.2
  csv_delimiter: ";"
train: {epochs: 3, metrics: [loss, accuracy], batch_size: 16}
early_stopping: {patience: 2, metric: val_accuracy, mode: max}
schedule: {kind: step, step_size: 10, gamma: 0.5}
checkpoint: {every: 100, keep_last: 0}
log: {file: m.jsonl, format: jsonl, every: 10, progress: lines}
""",
    "bad-negative-lr.yaml": BASE + "optimizer:\n  learning_rate: -1\n",
    "bad-zero-batch.yaml": BASE + "train: {batch_size: 0, epochs: -1}\n",
    "bad-momentum.yaml": BASE + "optimizer: {kind: sgd, momentum: 1.5}\n",
    "bad-nan.yaml": BASE + "loss: {class_weights: [.nan, .inf]}\noptimizer: {learning_rate: .nan}\n",
    "bad-type.yaml": BASE + "data:\n  shuffle: maybe\n  inputs: [x]\noptimizer: 3\n",
    "bad-unknown-key.yaml": BASE + "optimiser:\n  learnig_rate: 0.1\nepochs: 3\n",
    "bad-group.yaml": BASE + "optimizer:\n  groups:\n    - {match: [a], lr: 0.1}\n    - 7\n",
    "bad-yaml.yaml": "model: [unclosed\n",
    "bad-top.yaml": "- a\n- b\n",
    "bad-anchor.yaml": "model: &m m.onnx\ndata: {train: *m, target: *undefined}\n",
    "bad-complex-key.yaml": BASE + "? [a, b]\n: c\ndata:\n  inputs: {? {k: v} : x}\n",
    "bad-override.yaml": BASE + "\0train.epoch=3\0=x\0a..b=1\0model",
}
for name, text in CONFIG_SEEDS.items():
    put(["config"], name, text.encode())
put(["config"], "example-digits.yaml", open(os.path.join(root, "examples/digits/config.yaml"), "rb").read())
reference = subprocess.run([os.path.join(build, "cli/onnxtrain"), "config"], check=True, capture_output=True).stdout
put(["config"], "reference.yaml", reference.replace(b"model: null", b"model: m.onnx").replace(b"  train: null", b"  train: t.npz"))
if sys.argv[2:] == ["config"]:  # only the config seeds (no models, no checkpoints)
    sys.exit(0)

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

