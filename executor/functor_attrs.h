#pragma once
// The functors of executor/functors.h built from a node's attributes, with the ONNX defaults in one place for
// the CPU and CUDA kernels alike.
#include <string>

#include "executor/functors.h"
#include "graph/ir.h"

namespace onnxtrain {

inline LeakyReluOp leaky_relu_op(const Node& n) { return {n.attr_float("alpha", 0.01f)}; }
inline EluOp elu_op(const Node& n) { return {n.attr_float("alpha", 1.0f)}; }
inline SeluOp selu_op(const Node& n) {
  const SeluOp d;
  return {n.attr_float("alpha", d.alpha), n.attr_float("gamma", d.gamma)};
}
inline CeluOp celu_op(const Node& n) { return {n.attr_float("alpha", 1.0f)}; }  // alpha != 0 checked by the factory
inline HardSigmoidOp hard_sigmoid_op(const Node& n) { return {n.attr_float("alpha", 0.2f), n.attr_float("beta", 0.5f)}; }
inline ThresholdedReluOp thresholded_relu_op(const Node& n) { return {n.attr_float("alpha", 1.0f)}; }
inline ModOp mod_op(const Node& n) { return {n.attr_int("fmod", 0) != 0}; }
// Gelu's "approximate" attribute: "none" or "tanh"; anything else is the factory's error to report.
inline bool gelu_uses_tanh(const Node& n) { return n.attr_string("approximate", "none") == "tanh"; }

}  // namespace onnxtrain
