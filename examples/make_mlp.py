"""Writes a ReLU MLP as an ONNX inference model, the way torch.onnx.export lays out nn.Linear layers.

    python examples/make_mlp.py out.onnx --sizes 64 256 256 1 [--opset 18] [--seed 0]

Weights follow nn.Linear's default initialisation (uniform in +-1/sqrt(fan_in)); the batch dim is symbolic.
"""
import argparse

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def make_mlp(sizes, opset=18, seed=0):
    rng = np.random.default_rng(seed)
    inits, nodes = [], []
    x = "x"
    for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        bound = 1.0 / np.sqrt(fan_in)
        w = rng.uniform(-bound, bound, size=(fan_out, fan_in)).astype(np.float32)
        b = rng.uniform(-bound, bound, size=(fan_out,)).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"fc{i+1}.weight"), numpy_helper.from_array(b, f"fc{i+1}.bias")]
        last = i == len(sizes) - 2
        h = "y" if last else f"fc{i+1}_out"
        nodes.append(helper.make_node("Gemm", [x, f"fc{i+1}.weight", f"fc{i+1}.bias"], [h], name=f"fc{i+1}", transB=1))
        if not last:
            nodes.append(helper.make_node("Relu", [h], [f"relu{i+1}_out"], name=f"relu{i+1}"))
            h = f"relu{i+1}_out"
        x = h
    graph = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", sizes[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", sizes[-1]])],
        initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="onnxtrain-examples")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--sizes", type=int, nargs="+", default=[64, 256, 256, 1])
    p.add_argument("--opset", type=int, default=18)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    onnx.save(make_mlp(a.sizes, a.opset, a.seed), a.out)
    print(a.out)


if __name__ == "__main__":
    main()
