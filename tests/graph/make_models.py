"""Writes the ONNX models the graph tests load, built with onnx.helper (the reference producer)."""
import sys

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

out = sys.argv[1]


def save(name, nodes, inputs, outputs, inits=(), opset=17, ir=8, extra_opsets=(), functions=()):
    g = h.make_graph(nodes, name, inputs, outputs, initializer=list(inits))
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)] + list(extra_opsets), ir_version=ir,
                     functions=list(functions), producer_name="make_models.py")
    onnx.checker.check_model(m)
    onnx.save(m, f"{out}/{name}.onnx")


x = h.make_tensor_value_info("x", T.FLOAT, ["batch", 8])
rng = np.random.default_rng(0)
w = nh.from_array(rng.standard_normal((8, 4)).astype(np.float32), "w")
b = nh.from_array(np.zeros((4,), np.float32), "b")
axes = nh.from_array(np.array([1], np.int64), "axes")

# opset 13: ReduceSum takes axes as an input from 13 on.
save("op13", [h.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
              h.make_node("Add", ["h", "b"], ["a"], name="add"),
              h.make_node("Relu", ["a"], ["r"], name="relu"),
              h.make_node("ReduceSum", ["r", "axes"], ["y"], name="sum", keepdims=1)],
     [x], [h.make_tensor_value_info("y", T.FLOAT, ["batch", 1])], [w, b, axes], opset=13, ir=7)

scale = nh.from_array(np.ones((8,), np.float32), "scale")
bias = nh.from_array(np.zeros((8,), np.float32), "bias")
save("op17", [h.make_node("LayerNormalization", ["x", "scale", "bias"], ["n"], name="ln", axis=-1, epsilon=1e-5),
              h.make_node("Relu", ["n"], ["y"], name="relu")],
     [x], [h.make_tensor_value_info("y", T.FLOAT, ["batch", 8])], [scale, bias], opset=17, ir=8)

# opset 18: ReduceMean moved axes from an attribute to an input.
save("op18", [h.make_node("ReduceMean", ["x", "axes"], ["m"], name="mean", keepdims=0),
              h.make_node("Relu", ["m"], ["y"], name="relu")],
     [x], [h.make_tensor_value_info("y", T.FLOAT, ["batch"])], [axes], opset=18, ir=8)

# opset 21 (IR 10): Gelu exists from 20, Cast gained saturate in 19.
save("op21", [h.make_node("Gelu", ["x"], ["g"], name="gelu", approximate="tanh"),
              h.make_node("Cast", ["g"], ["y"], name="cast", to=T.DOUBLE)],
     [x], [h.make_tensor_value_info("y", T.DOUBLE, ["batch", 8])], opset=21, ir=10)

# A subgraph reading an outer value (x) that the If node does not list as an input.
cond = h.make_tensor_value_info("cond", T.BOOL, [])
then_g = h.make_graph([h.make_node("Add", ["x", "x"], ["t"], name="then_add")], "then",
                      [], [h.make_tensor_value_info("t", T.FLOAT, None)])
else_g = h.make_graph([h.make_node("Neg", ["x"], ["e"], name="else_neg")], "else",
                      [], [h.make_tensor_value_info("e", T.FLOAT, None)])
save("if17", [h.make_node("If", ["cond"], ["y"], name="branch", then_branch=then_g, else_branch=else_g)],
     [x, cond], [h.make_tensor_value_info("y", T.FLOAT, ["batch", 8])], opset=17)

# Our own domain: one op with a model-local function body, one that ONNX knows nothing about.
scale_fn = h.make_function(
    "onnxtrain", "Scale2", ["X"], ["Y"],
    [h.make_node("Constant", [], ["two"], value_float=2.0), h.make_node("Mul", ["X", "two"], ["Y"])],
    opset_imports=[h.make_opsetid("", 17)])
save("custom", [h.make_node("Relu", ["x"], ["pre"], name="pre"),
                h.make_node("Scale2", ["pre"], ["s"], name="scale", domain="onnxtrain"),
                h.make_node("Mystery", ["s"], ["m"], name="mystery", domain="onnxtrain"),
                h.make_node("Relu", ["m"], ["y"], name="post")],
     [x], [h.make_tensor_value_info("y", T.FLOAT, [])], opset=17,
     extra_opsets=[h.make_opsetid("onnxtrain", 1)], functions=[scale_fn])

# Not topologically sorted (the checker rejects it; loading without validation then sorting fixes it).
g = h.make_graph([h.make_node("Relu", ["a"], ["y"], name="second"), h.make_node("Neg", ["x"], ["a"], name="first")],
                 "unsorted", [x], [h.make_tensor_value_info("y", T.FLOAT, ["batch", 8])])
onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8), f"{out}/unsorted.onnx")

# External data written by onnx itself: offsets and lengths as onnx computes them.
big = nh.from_array(np.arange(64 * 4, dtype=np.float32).reshape(64, 4), "big")
small = nh.from_array(np.arange(8 * 4, dtype=np.float32).reshape(8, 4), "small")
xe = h.make_tensor_value_info("x", T.FLOAT, ["batch", 64])
ge = h.make_graph([h.make_node("MatMul", ["x", "big"], ["h"], name="mm"),
                   h.make_node("Add", ["h", "small_row"], ["y"], name="add")], "ext", [xe],
                  [h.make_tensor_value_info("y", T.FLOAT, ["batch", 4])],
                  initializer=[big, nh.from_array(np.full((4,), 0.5, np.float32), "small_row")])
me = h.make_model(ge, opset_imports=[h.make_opsetid("", 17)], ir_version=8)
onnx.save(me, f"{out}/ext.onnx", save_as_external_data=True, all_tensors_to_one_file=True, location="ext.bin",
          size_threshold=64)
