// Gradients of activations. Relu, Sigmoid, Tanh, and Softmax/LogSoftmax over the last axis use the fused
// onnxtrain ops (gradients/fused.h), which read only the forward output, so the input can be freed after the
// forward pass.
#include <numeric>

#include "gradients/fused.h"
#include "gradients/rule.h"
#include "gradients/rules/util.h"

namespace onnxtrain {

namespace {

Expr fused(RuleContext& c, const std::string& op) {
  return apply(c.builder(), op, {c.dY(0), c.Y(0)}, c.dY(0).type, {}, kFusedGradDomain);
}

// The axes Softmax/LogSoftmax normalise over: one axis from opset 13; before that the input is coerced to
// 2-D at `axis`, so every axis from there on.
std::vector<int64_t> softmax_axes(RuleContext& c) {
  const bool old = c.opset() < 13;
  int64_t axis = c.node().attr_int("axis", old ? 1 : -1);
  if (!old) return {axis};
  auto rank = c.Y(0).rank();  // Y, not X: reading X would keep it alive for the backward pass
  if (!rank) c.fail("needs the input's rank (opset " + std::to_string(c.opset()) + " Softmax flattens at axis)");
  const auto r = static_cast<int64_t>(*rank);
  if (axis < 0) axis += r;
  if (axis < 0 || axis >= r) c.fail("axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(r));
  std::vector<int64_t> axes(r - axis);
  std::iota(axes.begin(), axes.end(), axis);
  return axes;
}

// The fused SoftmaxGrad/LogSoftmaxGrad are emitted only for the innermost axis (their default, axis=-1):
// their function bodies cannot take an axis attribute (the IR has no attribute references), and the last
// axis is the case that matters (attention, classifiers). Other axes keep the standard-op form.
bool is_last_axis(RuleContext& c, const std::vector<int64_t>& axes) {
  if (axes.size() != 1) return false;
  if (axes[0] == -1) return true;
  auto rank = c.Y(0).rank();  // Y, not X: reading X would keep it alive for the backward pass
  return rank && axes[0] == static_cast<int64_t>(*rank) - 1;
}

}  // namespace

void register_activation_rules(GradientRegistry& r) {
  r.add("Relu", [](RuleContext& c) { c.set_dX(0, fused(c, "ReluGrad")); });
  r.add("Sigmoid", [](RuleContext& c) { c.set_dX(0, fused(c, "SigmoidGrad")); });
  r.add("Tanh", [](RuleContext& c) { c.set_dX(0, fused(c, "TanhGrad")); });
  r.add("LeakyRelu", [](RuleContext& c) {
    const double alpha = c.node().attr_float("alpha", 0.01f);
    Expr x = c.X(0), dy = c.dY(0);
    c.set_dX(0, where(greater(x, scalar(c.builder(), x.dtype(), 0.0)), dy, dy * alpha));
  });
  r.add("Softplus", [](RuleContext& c) {
    // d/dx log(1 + e^x) = sigmoid(x)
    Expr x = c.X(0);
    c.set_dX(0, c.dY(0) * apply(c.builder(), "Sigmoid", {x}, x.type));
  });
  r.add("Softmax", [](RuleContext& c) {
    // dx = y * (dy - sum(dy * y))
    Expr y = c.Y(0), dy = c.dY(0);
    const std::vector<int64_t> axes = softmax_axes(c);
    if (is_last_axis(c, axes)) return c.set_dX(0, fused(c, "SoftmaxGrad"));
    c.set_dX(0, y * (dy - rules::reduce_sum(dy * y, axes, true, c.opset())));
  });
  r.add("LogSoftmax", [](RuleContext& c) {
    // dx = dy - softmax(x) * sum(dy), with softmax(x) = exp(y)
    Expr y = c.Y(0), dy = c.dY(0);
    const std::vector<int64_t> axes = softmax_axes(c);
    if (is_last_axis(c, axes)) return c.set_dX(0, fused(c, "LogSoftmaxGrad"));
    c.set_dX(0, dy - exp(y) * rules::reduce_sum(dy, axes, true, c.opset()));
  });
}

}  // namespace onnxtrain
