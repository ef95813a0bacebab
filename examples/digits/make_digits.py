"""Writes the digits fine-tuning example: a pretrained classifier as ONNX, and its data, from scikit-learn's
bundled digits dataset (8x8 images, 10 classes; no download).

    python examples/digits/make_digits.py [OUT_DIR]      (default: examples/digits/data)

  OUT_DIR/digits.onnx   pixels[batch, 64] -> Gemm(body) -> Relu -> Gemm(head) -> logits[batch, 10]
  OUT_DIR/train.npz     pixels float32 [N, 64] in [0, 1], label int64 [N]   (fine-tuning rows)
  OUT_DIR/val.npz       the same for validation rows

The body is pretrained with scikit-learn's MLPClassifier on a separate third of the images; the head is then
replaced by a freshly initialised one, as when a pretrained network gets a new output layer. Fine-tuning only the
head (config.yaml: trainable: ["head.*"]) takes validation accuracy from chance to ~95%.
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from sklearn.datasets import load_digits
import warnings

from sklearn.exceptions import ConvergenceWarning
from sklearn.neural_network import MLPClassifier

HIDDEN = 64


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
    os.makedirs(out, exist_ok=True)
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(x))
    pre, train, val = np.split(order, [len(x) // 3, len(x) * 5 // 6])

    warnings.filterwarnings("ignore", category=ConvergenceWarning)  # 300 iterations are plenty for a body
    body = MLPClassifier(hidden_layer_sizes=(HIDDEN,), max_iter=300, random_state=0).fit(x[pre], y[pre])
    rng = np.random.default_rng(1)
    bound = 1.0 / np.sqrt(HIDDEN)  # nn.Linear's default initialisation for the new head
    head_w = rng.uniform(-bound, bound, size=(10, HIDDEN)).astype(np.float32)
    head_b = rng.uniform(-bound, bound, size=(10,)).astype(np.float32)
    inits = [
        numpy_helper.from_array(body.coefs_[0].T.astype(np.float32), "body.weight"),
        numpy_helper.from_array(body.intercepts_[0].astype(np.float32), "body.bias"),
        numpy_helper.from_array(head_w, "head.weight"),
        numpy_helper.from_array(head_b, "head.bias"),
    ]
    nodes = [
        helper.make_node("Gemm", ["pixels", "body.weight", "body.bias"], ["hidden"], name="body", transB=1),
        helper.make_node("Relu", ["hidden"], ["features"], name="relu"),
        helper.make_node("Gemm", ["features", "head.weight", "head.bias"], ["logits"], name="head", transB=1),
    ]
    graph = helper.make_graph(
        nodes, "digits",
        [helper.make_tensor_value_info("pixels", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], producer_name="make_digits.py")
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, os.path.join(out, "digits.onnx"))
    np.savez(os.path.join(out, "train.npz"), pixels=x[train], label=y[train])
    np.savez(os.path.join(out, "val.npz"), pixels=x[val], label=y[val])
    print(f"wrote {out}/digits.onnx, train.npz ({len(train)} rows), val.npz ({len(val)} rows); "
          f"pretraining accuracy of the body with its own head: {body.score(x[val], y[val]):.3f}")


if __name__ == "__main__":
    main()
