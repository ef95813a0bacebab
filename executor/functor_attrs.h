#pragma once
// The functors of executor/functors.h built from a node's attributes, with the ONNX defaults in one place for
// the CPU and CUDA kernels alike.
#include <limits>
#include <string>
#include <utility>

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
// Clip's bounds before opset 11 (float attributes); from 11 on they are inputs read at run time and these
// are the defaults used when an input is absent: the type's whole range.
template <class T> std::pair<T, T> clip_bounds(const Node& n, bool from_inputs) {
  if (from_inputs) return {std::numeric_limits<T>::lowest(), std::numeric_limits<T>::max()};
  return {static_cast<T>(n.attr_float("min", std::numeric_limits<float>::lowest())),
          static_cast<T>(n.attr_float("max", std::numeric_limits<float>::max()))};
}
// Gelu's "approximate" attribute: "none" or "tanh"; anything else is the factory's error to report.
inline bool gelu_uses_tanh(const Node& n) { return n.attr_string("approximate", "none") == "tanh"; }

}  // namespace onnxtrain
