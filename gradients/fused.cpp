#include "gradients/fused.h"

namespace onnxtrain {

namespace {

Node op(std::string name, std::string type, std::vector<std::string> in, std::string out,
        std::map<std::string, Attribute> attrs = {}) {
  Node n;
  n.name = std::move(name);
  n.op_type = std::move(type);
  n.inputs = std::move(in);
  n.outputs = {std::move(out)};
  n.attributes = std::move(attrs);
  return n;
}

// A float constant cast to Y's element type (CastLike, opset 15+), so one body serves every float type.
void constant_like_y(Function& f, const std::string& name, float v) {
  f.nodes.push_back(op(name + "_f", "Constant", {}, name + "_f", {{"value", TensorData::scalar<float>(v)}}));
  f.nodes.push_back(op(name, "CastLike", {name + "_f", "Y"}, name));
}

Function make(const std::string& name, const std::string& doc) {
  Function f;
  f.name = name;
  f.domain = kFusedGradDomain;
  f.inputs = {"dY", "Y"};
  f.outputs = {"dX"};
  f.opset_imports = {{"", 17}};
  f.doc = doc;
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

  // The axis is the last one: the kernels take an `axis` attribute, but a body cannot refer to attributes
  // (the IR has no attribute references), so the rules emit these ops only with the default axis=-1.
  auto last_axis = [](Function& f) {
    const int64_t minus_one = -1;
    TensorData axes = TensorData::from<int64_t>({1}, std::span<const int64_t>(&minus_one, 1));
    f.nodes.push_back(op("axes", "Constant", {}, "axes", {{"value", std::move(axes)}}));
  };
  Function softmax = make("SoftmaxGrad",
                          "Gradient of Softmax (opset 13+, last axis) from its output: "
                          "dX = Y * (dY - ReduceSum(dY * Y, axis=-1, keepdims=1)).");
  last_axis(softmax);
  softmax.nodes.push_back(op("dy_y", "Mul", {"dY", "Y"}, "dy_y"));
  softmax.nodes.push_back(op("dot", "ReduceSum", {"dy_y", "axes"}, "dot", {{"keepdims", int64_t{1}}}));
  softmax.nodes.push_back(op("centered", "Sub", {"dY", "dot"}, "centered"));
  softmax.nodes.push_back(op("dX", "Mul", {"Y", "centered"}, "dX"));
  out.push_back(std::move(softmax));

  Function log_softmax = make("LogSoftmaxGrad",
                              "Gradient of LogSoftmax (opset 13+, last axis) from its output: "
                              "dX = dY - Exp(Y) * ReduceSum(dY, axis=-1, keepdims=1).");
  last_axis(log_softmax);
  log_softmax.nodes.push_back(op("total", "ReduceSum", {"dY", "axes"}, "total", {{"keepdims", int64_t{1}}}));
  log_softmax.nodes.push_back(op("probs", "Exp", {"Y"}, "probs"));
  log_softmax.nodes.push_back(op("scaled", "Mul", {"probs", "total"}, "scaled"));
  log_softmax.nodes.push_back(op("dX", "Sub", {"dY", "scaled"}, "dX"));
  out.push_back(std::move(log_softmax));

  // LayerNormalizationGrad(dY, X, Scale, Mean, InvStdDev) -> (dX, dScale, dBias), last axis only (as above, a
  // body cannot read the axis attribute). Mean and InvStdDev come in, so epsilon is not needed either.
  Function ln;
  ln.name = "LayerNormalizationGrad";
  ln.domain = kFusedGradDomain;
  ln.inputs = {"dY", "X", "Scale", "Mean", "InvStdDev"};
  ln.outputs = {"dX", "dScale", "dBias"};
  ln.opset_imports = {{"", 17}};
  ln.doc = "Gradient of LayerNormalization (axis=-1) given its Mean and InvStdDev: with xhat = (X - Mean) * "
           "InvStdDev and g = dY * Scale, dX = InvStdDev * (g - mean(g) - xhat * mean(g * xhat)), "
           "dScale = sum over rows of dY * xhat, dBias = sum over rows of dY.";
  {
    const int64_t zero = 0;
    auto& nodes = ln.nodes;
    // Means as ReduceSum / D: ReduceSum takes its axes as an input at every opset from 13, while ReduceMean's
    // moved from an attribute to an input at 18, and a body runs at its caller's opset, whichever that is.
    last_axis(ln);
    nodes.push_back(op("d_int", "Shape", {"X"}, "d_int", {{"start", int64_t{-1}}}));
    nodes.push_back(op("d", "CastLike", {"d_int", "dY"}, "d"));
    auto mean_last = [&](const std::string& in, const std::string& out) {
      nodes.push_back(op(out + "_sum", "ReduceSum", {in, "axes"}, out + "_sum", {{"keepdims", int64_t{1}}}));
      nodes.push_back(op(out, "Div", {out + "_sum", "d"}, out));
    };
    nodes.push_back(op("centered", "Sub", {"X", "Mean"}, "centered"));
    nodes.push_back(op("xhat", "Mul", {"centered", "InvStdDev"}, "xhat"));
    nodes.push_back(op("g", "Mul", {"dY", "Scale"}, "g"));
    mean_last("g", "mean_g");
    nodes.push_back(op("g_xhat", "Mul", {"g", "xhat"}, "g_xhat"));
    mean_last("g_xhat", "mean_g_xhat");
    nodes.push_back(op("proj", "Mul", {"xhat", "mean_g_xhat"}, "proj"));
    nodes.push_back(op("g_centered", "Sub", {"g", "mean_g"}, "g_centered"));
    nodes.push_back(op("g_orth", "Sub", {"g_centered", "proj"}, "g_orth"));
    nodes.push_back(op("dX", "Mul", {"InvStdDev", "g_orth"}, "dX"));
    // Rows are every axis but the last, whatever X's rank: flatten to (rows, D) and sum axis 0.
    nodes.push_back(op("rows_axis", "Constant", {}, "rows_axis",
                       {{"value", TensorData::from<int64_t>({1}, std::span<const int64_t>(&zero, 1))}}));
    nodes.push_back(op("dy_xhat", "Mul", {"dY", "xhat"}, "dy_xhat"));
    nodes.push_back(op("dy_xhat_2d", "Flatten", {"dy_xhat"}, "dy_xhat_2d", {{"axis", int64_t{-1}}}));
    nodes.push_back(op("dScale", "ReduceSum", {"dy_xhat_2d", "rows_axis"}, "dScale", {{"keepdims", int64_t{0}}}));
    nodes.push_back(op("dy_2d", "Flatten", {"dY"}, "dy_2d", {{"axis", int64_t{-1}}}));
    nodes.push_back(op("dBias", "ReduceSum", {"dy_2d", "rows_axis"}, "dBias", {{"keepdims", int64_t{0}}}));
  }
  out.push_back(std::move(ln));

  return out;
}

}  // namespace onnxtrain
