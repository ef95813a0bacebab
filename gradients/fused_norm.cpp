// Function bodies of the normalisation gradients (gradients/fused.h): LayerNormalizationGrad for any axis and
// BatchNormalizationGrad. Both read the calling node's attributes by reference (ONNX ref_attr_name), so the
// rules always set them: a body has no attribute defaults.
#include "gradients/fused.h"
#include "gradients/fused_body.h"

namespace onnxtrain {

namespace {

using fused_body::int64s;
using fused_body::kInt;
using fused_body::op;

// The three outputs of both, and the one attribute each body reads by reference.
Function make(const std::string& name, std::vector<std::string> inputs, std::string attribute, std::string doc) {
  return fused_body::function(name, std::move(inputs), {"dX", "dScale", "dBias"}, std::move(doc),
                              {std::move(attribute)});
}

// Sums over `axes` with keepdims: ReduceSum takes its axes as an input at every opset from 13, while
// ReduceMean's moved from an attribute to an input at 18, and a body runs at its caller's opset.
void sum_keep(Function& f, const std::string& in, const std::string& axes, const std::string& out) {
  f.nodes.push_back(op(out, "ReduceSum", {in, axes}, out, {{"keepdims", int64_t{1}}}));
}

// LayerNormalizationGrad(dY, X, Scale, Mean, InvStdDev), attribute axis: everything is viewed as the 2-D
// [rows, D] that Flatten at `axis` makes of X, so one body serves every axis.
Function layer_norm_grad() {
  Function f = make("LayerNormalizationGrad", {"dY", "X", "Scale", "Mean", "InvStdDev"}, "axis",
                    "Gradient of LayerNormalization (attribute axis, required) given its Mean and InvStdDev: with "
                    "xhat = (X - Mean) * InvStdDev and g = dY * Scale over each row of the dims from axis on, "
                    "dX = InvStdDev * (g - mean(g) - xhat * mean(g * xhat)), dScale = sum over rows of dY * xhat, "
                    "dBias = sum over rows of dY.");
  auto& n = f.nodes;
  for (const char* v : {"dY", "X", "Mean", "InvStdDev"})
    n.push_back(op(std::string(v) + "_2d", "Flatten", {v}, std::string(v) + "_2d", {}, {{"axis", "axis", kInt}}));
  n.push_back(op("Scale_2d", "Flatten", {"Scale"}, "Scale_2d", {{"axis", int64_t{0}}}));
  int64s(f, "last", {-1});
  int64s(f, "rows_axis", {0});
  n.push_back(op("d_int", "Shape", {"X_2d"}, "d_int", {{"start", int64_t{-1}}}));
  n.push_back(op("d", "CastLike", {"d_int", "dY"}, "d"));
  auto mean_last = [&](const std::string& in, const std::string& out) {
    sum_keep(f, in, "last", out + "_sum");
    n.push_back(op(out, "Div", {out + "_sum", "d"}, out));
  };
  n.push_back(op("centered", "Sub", {"X_2d", "Mean_2d"}, "centered"));
  n.push_back(op("xhat", "Mul", {"centered", "InvStdDev_2d"}, "xhat"));
  n.push_back(op("g", "Mul", {"dY_2d", "Scale_2d"}, "g"));
  mean_last("g", "mean_g");
  n.push_back(op("g_xhat", "Mul", {"g", "xhat"}, "g_xhat"));
  mean_last("g_xhat", "mean_g_xhat");
  n.push_back(op("proj", "Mul", {"xhat", "mean_g_xhat"}, "proj"));
  n.push_back(op("g_centered", "Sub", {"g", "mean_g"}, "g_centered"));
  n.push_back(op("g_orth", "Sub", {"g_centered", "proj"}, "g_orth"));
  n.push_back(op("dX_2d", "Mul", {"InvStdDev_2d", "g_orth"}, "dX_2d"));
  n.push_back(op("x_shape", "Shape", {"X"}, "x_shape"));
  n.push_back(op("dX", "Reshape", {"dX_2d", "x_shape"}, "dX"));
  n.push_back(op("scale_shape", "Shape", {"Scale"}, "scale_shape"));
  n.push_back(op("dy_xhat", "Mul", {"dY_2d", "xhat"}, "dy_xhat"));
  n.push_back(op("dScale_flat", "ReduceSum", {"dy_xhat", "rows_axis"}, "dScale_flat", {{"keepdims", int64_t{0}}}));
  n.push_back(op("dScale", "Reshape", {"dScale_flat", "scale_shape"}, "dScale"));
  n.push_back(op("dBias_flat", "ReduceSum", {"dY_2d", "rows_axis"}, "dBias_flat", {{"keepdims", int64_t{0}}}));
  n.push_back(op("dBias", "Reshape", {"dBias_flat", "scale_shape"}, "dBias"));
  return f;
}

// BatchNormalizationGrad(dY, X, Scale), attribute epsilon: X (N, C, ...) is viewed as (N, C, S) and the batch
// statistics are recomputed over axes (0, 2), as the native kernel does.
Function batch_norm_grad() {
  Function f = make("BatchNormalizationGrad", {"dY", "X", "Scale"}, "epsilon",
                    "Gradient of training-mode BatchNormalization (attribute epsilon, required) through Y, the batch "
                    "statistics recomputed from X: per channel over its M elements, with xc = X - mean and "
                    "rstd = (var + epsilon)^-1/2, dBias = sum dY, dScale = rstd * sum(dY * xc), "
                    "dX = Scale * rstd * (dY - dBias / M - xc * rstd * dScale / M).");
  auto& n = f.nodes;
  int64s(f, "nc_rest", {0, 0, -1});
  int64s(f, "per_channel", {1, -1, 1});
  int64s(f, "flat", {-1});
  int64s(f, "outer", {0, 2});
  n.push_back(op("x3", "Reshape", {"X", "nc_rest"}, "x3"));
  n.push_back(op("dy3", "Reshape", {"dY", "nc_rest"}, "dy3"));
  n.push_back(op("scale3", "Reshape", {"Scale", "per_channel"}, "scale3"));
  fused_body::caller_attribute(f, "eps_f", "epsilon", fused_body::kFloat);
  n.push_back(op("eps", "CastLike", {"eps_f", "X"}, "eps"));
  // M = size(X) / C, exact in int64.
  n.push_back(op("size", "Size", {"X"}, "size"));
  n.push_back(op("channels", "Shape", {"X"}, "channels", {{"start", int64_t{1}}, {"end", int64_t{2}}}));
  n.push_back(op("m_int", "Div", {"size", "channels"}, "m_int"));
  n.push_back(op("m", "CastLike", {"m_int", "X"}, "m"));
  sum_keep(f, "x3", "outer", "sum_x");
  n.push_back(op("mean", "Div", {"sum_x", "m"}, "mean"));
  n.push_back(op("xc", "Sub", {"x3", "mean"}, "xc"));
  n.push_back(op("xc2", "Mul", {"xc", "xc"}, "xc2"));
  sum_keep(f, "xc2", "outer", "sum_xc2");
  n.push_back(op("var", "Div", {"sum_xc2", "m"}, "var"));
  n.push_back(op("var_eps", "Add", {"var", "eps"}, "var_eps"));
  n.push_back(op("std", "Sqrt", {"var_eps"}, "std"));
  n.push_back(op("rstd", "Reciprocal", {"std"}, "rstd"));
  sum_keep(f, "dy3", "outer", "sum_dy");
  n.push_back(op("dy_xc", "Mul", {"dy3", "xc"}, "dy_xc"));
  sum_keep(f, "dy_xc", "outer", "sum_dy_xc");
  n.push_back(op("dBias", "Reshape", {"sum_dy", "flat"}, "dBias"));
  n.push_back(op("dscale3", "Mul", {"sum_dy_xc", "rstd"}, "dscale3"));
  n.push_back(op("dScale", "Reshape", {"dscale3", "flat"}, "dScale"));
  // dX = a * (dY - mean(dY)) - b * xc with a = Scale * rstd, b = a * rstd^2 * mean(dY * xc).
  n.push_back(op("a", "Mul", {"scale3", "rstd"}, "a"));
  n.push_back(op("mean_dy", "Div", {"sum_dy", "m"}, "mean_dy"));
  n.push_back(op("dy_centered", "Sub", {"dy3", "mean_dy"}, "dy_centered"));
  n.push_back(op("mean_dy_xc", "Div", {"sum_dy_xc", "m"}, "mean_dy_xc"));
  n.push_back(op("rstd2", "Mul", {"rstd", "rstd"}, "rstd2"));
  n.push_back(op("a_rstd2", "Mul", {"a", "rstd2"}, "a_rstd2"));
  n.push_back(op("b", "Mul", {"a_rstd2", "mean_dy_xc"}, "b"));
  n.push_back(op("a_dy", "Mul", {"a", "dy_centered"}, "a_dy"));
  n.push_back(op("b_xc", "Mul", {"b", "xc"}, "b_xc"));
  n.push_back(op("dx3", "Sub", {"a_dy", "b_xc"}, "dx3"));
  n.push_back(op("x_shape", "Shape", {"X"}, "x_shape"));
  n.push_back(op("dX", "Reshape", {"dx3", "x_shape"}, "dX"));
  return f;
}

}  // namespace

std::vector<Function> fused_norm_functions() { return {layer_norm_grad(), batch_norm_grad()}; }

}  // namespace onnxtrain
