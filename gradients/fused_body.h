#pragma once
// Building blocks of the fused gradient ops' function bodies (gradients/fused*.cpp), and the bodies each file
// contributes to fused_grad_functions(). Internal to gradients/.
#include <map>
#include <span>
#include <string>
#include <vector>

#include "graph/ir.h"

namespace onnxtrain::fused_body {

// A single-output body node.
inline Node op(std::string name, std::string type, std::vector<std::string> in, std::string out,
               std::map<std::string, Attribute> attrs = {}) {
  Node n;
  n.name = std::move(name);
  n.op_type = std::move(type);
  n.inputs = std::move(in);
  n.outputs = {std::move(out)};
  n.attributes = std::move(attrs);
  return n;
}

// A double constant cast to `like`'s element type (CastLike, opset 15+): exact in float64, correctly rounded in
// float32, so a body matches the native kernel in either precision.
inline void constant_like(Function& f, const std::string& name, double v, const std::string& like) {
  f.nodes.push_back(op(name + "_d", "Constant", {}, name + "_d", {{"value", TensorData::scalar<double>(v)}}));
  f.nodes.push_back(op(name, "CastLike", {name + "_d", like}, name));
}

// A 1-D int64 constant (axes, shapes).
inline void int64s(Function& f, const std::string& name, const std::vector<int64_t>& v) {
  f.nodes.push_back(op(name, "Constant", {}, name,
                       {{"value", TensorData::from<int64_t>({static_cast<int64_t>(v.size())}, std::span(v))}}));
}

}  // namespace onnxtrain::fused_body

namespace onnxtrain {
// LayerNormalizationGrad and BatchNormalizationGrad (gradients/fused_norm.cpp).
std::vector<Function> fused_norm_functions();
}  // namespace onnxtrain
