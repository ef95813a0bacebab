#pragma once
// The one builder of the fused gradient ops' function bodies (gradients/fused*.cpp), and the bodies each file
// contributes to fused_grad_functions(). Internal to gradients/.
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "gradients/fused.h"
#include "graph/ir.h"

namespace onnxtrain::fused_body {

// AttributeProto type codes, which an attribute reference must carry.
inline constexpr int32_t kFloat = 1, kInt = 2, kString = 3, kInts = 7;

// An attribute a body node takes from the calling node by reference (ONNX ref_attr_name): the node's
// attribute `attr` gets the caller's attribute `caller`, of AttributeProto type `type`.
struct Ref {
  std::string attr, caller;
  int32_t type;
};

// A fused-domain function importing ai.onnx opset 17; `attributes` are those its body reads by reference.
inline Function function(std::string name, std::vector<std::string> inputs, std::vector<std::string> outputs,
                         std::string doc, std::vector<std::string> attributes = {}) {
  Function f;
  f.name = std::move(name);
  f.domain = kFusedGradDomain;
  f.inputs = std::move(inputs);
  f.outputs = std::move(outputs);
  f.attributes = std::move(attributes);
  f.opset_imports = {{"", 17}};
  f.doc = std::move(doc);
  return f;
}

// A single-output body node.
inline Node op(std::string name, std::string type, std::vector<std::string> in, std::string out,
               std::map<std::string, Attribute> attrs = {}, const std::vector<Ref>& refs = {}) {
  Node n;
  n.name = std::move(name);
  n.op_type = std::move(type);
  n.inputs = std::move(in);
  n.outputs = {std::move(out)};
  n.attributes = std::move(attrs);
  for (const Ref& r : refs) n.attribute_refs[r.attr] = {r.caller, r.type};
  return n;
}

// Appends a single-output node named after its output to f; returns the output's name.
inline std::string add(Function& f, std::string type, std::vector<std::string> in, const std::string& out,
                       std::map<std::string, Attribute> attrs = {}, const std::vector<Ref>& refs = {}) {
  f.nodes.push_back(op(out, std::move(type), std::move(in), out, std::move(attrs), refs));
  return out;
}

// A double constant cast to `like`'s element type (CastLike, opset 15+): exact in float64, correctly rounded in
// float32, so a body matches the native kernel in either precision.
inline void constant_like(Function& f, const std::string& name, double v, const std::string& like) {
  f.nodes.push_back(op(name + "_d", "Constant", {}, name + "_d", {{"value", TensorData::scalar<double>(v)}}));
  f.nodes.push_back(op(name, "CastLike", {name + "_d", like}, name));
}

// A 1-D int64 constant (axes, shapes).
inline std::string int64s(Function& f, const std::string& name, const std::vector<int64_t>& v) {
  return add(f, "Constant", {}, name,
             {{"value", TensorData::from<int64_t>({static_cast<int64_t>(v.size())}, std::span(v))}});
}

// A Constant holding the calling node's attribute `caller` of AttributeProto type `type` (kInt, kFloat,
// kString: a scalar; kInts: a 1-D int64 tensor).
inline std::string caller_attribute(Function& f, const std::string& out, const std::string& caller, int32_t type) {
  const char* value = type == kInts     ? "value_ints"
                      : type == kFloat  ? "value_float"
                      : type == kString ? "value_string"
                                        : "value_int";
  return add(f, "Constant", {}, out, {}, {{value, caller, type}});
}

}  // namespace onnxtrain::fused_body

namespace onnxtrain {
// LayerNormalizationGrad and BatchNormalizationGrad (gradients/fused_norm.cpp).
std::vector<Function> fused_norm_functions();
// MaxRoiPoolGrad and GridSampleGrad (gradients/fused_spatial.cpp).
std::vector<Function> fused_spatial_functions();
// RNNGrad, GRUGrad and LSTMGrad (gradients/fused_recurrent.cpp).
std::vector<Function> fused_recurrent_functions();
}  // namespace onnxtrain
