#include "gradients/fused.h"
#include "gradients/fused_body.h"

#include "formulas/gelu.h"

#include <cmath>
#include <concepts>

namespace onnxtrain {

namespace {

using fused_body::constant_like;
using fused_body::op;

// A float constant cast to Y's element type (CastLike, opset 15+), so one body serves every float type.
void constant_like_y(Function& f, const std::string& name, float v) {
  f.nodes.push_back(op(name + "_f", "Constant", {}, name + "_f", {{"value", TensorData::scalar<float>(v)}}));
  f.nodes.push_back(op(name, "CastLike", {name + "_f", "Y"}, name));
}

// The (dY, Y) -> dX form most of them have.
Function make(const std::string& name, const std::string& doc) {
  return fused_body::function(name, {"dY", "Y"}, {"dX"}, doc);
}

// Evaluates a formula of formulas/ on function-body values: each operation appends one standard ONNX node to the
// body, and each constant T(v) becomes a double constant CastLike'd to the input `like` (so one body serves every
// float type). The body is then the formula the kernels evaluate, in the same order of operations.
class BodyBuilder {
 public:
  BodyBuilder(Function& f, std::string like) : f_(f), like_(std::move(like)) {}
  std::string node(const std::string& type, std::vector<std::string> in) {
    const std::string out = "v" + std::to_string(next_++);
    f_.nodes.push_back(op(out, type, std::move(in), out));
    return out;
  }
  std::string constant(double v) {
    const std::string name = "c" + std::to_string(next_++);
    constant_like(f_, name, v, like_);
    return name;
  }

 private:
  Function& f_;
  std::string like_;
  int next_ = 0;
};

// A constant of the formula (its T): folded in double until it meets a value.
struct BodyScalar {
  double v;
  explicit BodyScalar(double x) : v(x) {}
};
struct BodyValue {
  BodyBuilder* b;
  std::string name;
};
BodyScalar operator*(BodyScalar a, BodyScalar c) { return BodyScalar(a.v * c.v); }
BodyValue binary(const char* type, const BodyValue& a, const BodyValue& c) { return {a.b, a.b->node(type, {a.name, c.name})}; }
BodyValue binary(const char* type, BodyScalar a, const BodyValue& c) { return {c.b, c.b->node(type, {c.b->constant(a.v), c.name})}; }
BodyValue binary(const char* type, const BodyValue& a, BodyScalar c) { return {a.b, a.b->node(type, {a.name, a.b->constant(c.v)})}; }
// Only for a body value with another or with a constant, so no other + - * of this file can pick these.
template <class A, class C>
concept BodyOperands = (std::same_as<A, BodyValue> && (std::same_as<C, BodyValue> || std::same_as<C, BodyScalar>)) ||
                       (std::same_as<A, BodyScalar> && std::same_as<C, BodyValue>);
template <class A, class C> requires BodyOperands<A, C> BodyValue operator+(const A& a, const C& c) { return binary("Add", a, c); }
template <class A, class C> requires BodyOperands<A, C> BodyValue operator-(const A& a, const C& c) { return binary("Sub", a, c); }
template <class A, class C> requires BodyOperands<A, C> BodyValue operator*(const A& a, const C& c) { return binary("Mul", a, c); }
struct BodyMath {
  static BodyValue erf(const BodyValue& x) { return {x.b, x.b->node("Erf", {x.name})}; }
  static BodyValue exp(const BodyValue& x) { return {x.b, x.b->node("Exp", {x.name})}; }
  static BodyValue tanh(const BodyValue& x) { return {x.b, x.b->node("Tanh", {x.name})}; }
  static BodyValue square(const BodyValue& x) { return x * x; }
};

// (dY, X) -> dX from a formula of formulas/gelu.h.
template <class Formula> Function gelu_grad_body(const std::string& name, const std::string& doc, Formula formula) {
  Function f = fused_body::function(name, {"dY", "X"}, {"dX"}, doc);
  BodyBuilder b(f, "X");
  const BodyValue dx = formula(BodyValue{&b, "dY"}, BodyValue{&b, "X"});
  f.nodes.back().name = f.nodes.back().outputs[0] = "dX";  // the last operation computed dx
  (void)dx;
  return f;
}

}  // namespace

std::vector<Function> fused_grad_functions() {
  std::vector<Function> out;

  // Where rather than Mul by a mask: an infinite dY where Y <= 0 must give 0, not NaN.
  Function relu = make("ReluGrad", "Gradient of Relu from its output: dX = dY where Y > 0, else 0.");
  constant_like_y(relu, "zero", 0.0f);
  relu.nodes.push_back(op("mask", "Greater", {"Y", "zero"}, "mask"));
  relu.nodes.push_back(op("zero_dy", "CastLike", {"zero", "dY"}, "zero_dy"));
  relu.nodes.push_back(op("dX", "Where", {"mask", "dY", "zero_dy"}, "dX"));
  out.push_back(std::move(relu));

  Function sigmoid = make("SigmoidGrad", "Gradient of Sigmoid from its output: dX = dY * Y * (1 - Y).");
  constant_like_y(sigmoid, "one", 1.0f);
  sigmoid.nodes.push_back(op("one_minus_y", "Sub", {"one", "Y"}, "one_minus_y"));
  sigmoid.nodes.push_back(op("slope", "Mul", {"Y", "one_minus_y"}, "slope"));
  sigmoid.nodes.push_back(op("dX", "Mul", {"dY", "slope"}, "dX"));
  out.push_back(std::move(sigmoid));

  Function tanh = make("TanhGrad", "Gradient of Tanh from its output: dX = dY * (1 - Y * Y).");
  constant_like_y(tanh, "one", 1.0f);
  tanh.nodes.push_back(op("y_squared", "Mul", {"Y", "Y"}, "y_squared"));
  tanh.nodes.push_back(op("slope", "Sub", {"one", "y_squared"}, "slope"));
  tanh.nodes.push_back(op("dX", "Mul", {"dY", "slope"}, "dX"));
  out.push_back(std::move(tanh));

  // GELU's gradients read the forward input: (dY, X) -> dX. Their bodies are formulas/gelu.h's templates, the
  // ones the kernels evaluate.
  out.push_back(gelu_grad_body("GeluGrad",
                               "Gradient of Gelu (approximate='none') from its input: "
                               "dX = dY * (Phi(X) + X * phi(X)), Phi and phi the standard normal CDF and PDF.",
                               [](const BodyValue& dy, const BodyValue& x) {
                                 return formulas::gelu_erf_grad<BodyMath, BodyValue, BodyScalar>(dy, x);
                               }));
  out.push_back(gelu_grad_body("GeluTanhGrad",
                               "Gradient of Gelu (approximate='tanh') from its input: with k = sqrt(2/pi), c = 0.044715 "
                               "and t = tanh(k (X + c X^3)), dX = dY * ((1 + t)/2 + X/2 (1 - t^2) k (1 + 3c X^2)).",
                               [](const BodyValue& dy, const BodyValue& x) {
                                 return formulas::gelu_tanh_grad<BodyMath, BodyValue, BodyScalar>(dy, x);
                               }));

  // The softmax axis comes from the calling node's `axis` attribute by reference (rules always set it): a
  // scalar Constant made 1-D for ReduceSum's axes input.
  auto axis_ref = [](Function& f) {
    f.attributes = {"axis"};
    fused_body::caller_attribute(f, "axis", "axis", fused_body::kInt);
    fused_body::int64s(f, "zero", {0});
    f.nodes.push_back(op("axes", "Unsqueeze", {"axis", "zero"}, "axes"));
  };
  Function softmax = make("SoftmaxGrad",
                          "Gradient of Softmax (opset 13+ semantics, attribute axis, required) from its output: "
                          "dX = Y * (dY - ReduceSum(dY * Y, axis, keepdims=1)).");
  axis_ref(softmax);
  softmax.nodes.push_back(op("dy_y", "Mul", {"dY", "Y"}, "dy_y"));
  softmax.nodes.push_back(op("dot", "ReduceSum", {"dy_y", "axes"}, "dot", {{"keepdims", int64_t{1}}}));
  softmax.nodes.push_back(op("centered", "Sub", {"dY", "dot"}, "centered"));
  softmax.nodes.push_back(op("dX", "Mul", {"Y", "centered"}, "dX"));
  out.push_back(std::move(softmax));

  Function log_softmax = make("LogSoftmaxGrad",
                              "Gradient of LogSoftmax (opset 13+ semantics, attribute axis, required) from its "
                              "output: dX = dY - Exp(Y) * ReduceSum(dY, axis, keepdims=1).");
  axis_ref(log_softmax);
  log_softmax.nodes.push_back(op("total", "ReduceSum", {"dY", "axes"}, "total", {{"keepdims", int64_t{1}}}));
  log_softmax.nodes.push_back(op("probs", "Exp", {"Y"}, "probs"));
  log_softmax.nodes.push_back(op("scaled", "Mul", {"probs", "total"}, "scaled"));
  log_softmax.nodes.push_back(op("dX", "Sub", {"dY", "scaled"}, "dX"));
  out.push_back(std::move(log_softmax));

  // MaxPoolGrad(dY, X) -> dX carries MaxPool's attributes; the body passes them on by reference.
  {
    Function f = make("MaxPoolGrad", "Gradient of MaxPool (with its attributes): each dY is added at its window's "
                                     "first maximum in X, by MaxPool's Indices and ScatterElements(reduction='add'); "
                                     "needs opset 16.");
    f.inputs = {"dY", "X"};
    f.attributes = {"auto_pad", "ceil_mode", "dilations", "kernel_shape", "pads", "strides"};
    Node pool;
    pool.name = "pool";
    pool.op_type = "MaxPool";
    pool.inputs = {"X"};
    pool.outputs = {"pooled", "indices"};
    using fused_body::kInt, fused_body::kInts, fused_body::kString;
    for (const char* a : {"dilations", "kernel_shape", "pads", "strides"}) pool.attribute_refs[a] = {a, kInts};
    pool.attribute_refs["ceil_mode"] = {"ceil_mode", kInt};
    pool.attribute_refs["auto_pad"] = {"auto_pad", kString};
    f.nodes.push_back(std::move(pool));
    constant_like(f, "zero", 0.0, "dY");
    const int64_t minus_one = -1;
    f.nodes.push_back(op("flat", "Constant", {}, "flat",
                         {{"value", TensorData::from<int64_t>({1}, std::span<const int64_t>(&minus_one, 1))}}));
    auto& n = f.nodes;
    n.push_back(op("shape", "Shape", {"X"}, "shape"));
    n.push_back(op("zeros", "Expand", {"zero", "shape"}, "zeros"));
    n.push_back(op("zeros_flat", "Reshape", {"zeros", "flat"}, "zeros_flat"));
    n.push_back(op("indices_flat", "Reshape", {"indices", "flat"}, "indices_flat"));
    n.push_back(op("dy_flat", "Reshape", {"dY", "flat"}, "dy_flat"));
    n.push_back(op("scattered", "ScatterElements", {"zeros_flat", "indices_flat", "dy_flat"}, "scattered",
                   {{"axis", int64_t{0}}, {"reduction", std::string("add")}}));
    n.push_back(op("dX", "Reshape", {"scattered", "shape"}, "dX"));
    out.push_back(std::move(f));
  }
  add_gather_grad_functions(out);

  for (Function& f : fused_norm_functions()) out.push_back(std::move(f));
  for (Function& f : fused_conv_functions()) out.push_back(std::move(f));
  for (Function& f : fused_spatial_functions()) out.push_back(std::move(f));
  for (Function& f : fused_recurrent_functions()) out.push_back(std::move(f));
  out.push_back(dropout_mask_function());  // the training forward's adapter dropout, not a gradient
  return out;
}

std::vector<std::pair<std::string, std::string>> fused_grad_uses() {
  return {{"Relu", "ReluGrad"},
          {"Sigmoid", "SigmoidGrad"},
          {"Tanh", "TanhGrad"},
          {"Softmax", "SoftmaxGrad"},
          {"LogSoftmax", "LogSoftmaxGrad"},
          {"Gelu", "GeluGrad"},
          {"Gelu", "GeluTanhGrad"},
          {"LayerNormalization", "LayerNormalizationGrad"},
          {"BatchNormalization", "BatchNormalizationGrad"},
          {"MaxPool", "MaxPoolGrad"},
          {"Conv", "ConvGrad"},
          {"AveragePool", "AveragePoolGrad"},
          {"Gather", "GatherGrad"},
          {"MaxRoiPool", "MaxRoiPoolGrad"},
          {"GridSample", "GridSampleGrad"},
          {"RNN", "RNNGrad"},
          {"GRU", "GRUGrad"},
          {"LSTM", "LSTMGrad"}};
}

}  // namespace onnxtrain
