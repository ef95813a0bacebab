// Gradients of Softmax and LogSoftmax (kernels: executor/cpu/softmax.cpp, executor/cuda/softmax.cu). Over one
// axis they use the fused onnxtrain ops (gradients/fused.h), which read only the forward output, so the input
// can be freed after the forward pass.
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "gradients/fused.h"
#include "gradients/rule.h"
#include "gradients/rules/util.h"

namespace onnxtrain {

namespace {

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

// The fused SoftmaxGrad/LogSoftmaxGrad normalise over one axis (opset 13 semantics), which covers every
// opset 13+ node and the opset 1-12 nodes whose coerced 2-D view has a single axis from `axis` on. They get
// the axis explicitly: their bodies read it by reference and have no default.
std::optional<Expr> fused_softmax(RuleContext& c, const std::string& op, const std::vector<int64_t>& axes) {
  if (axes.size() != 1) return std::nullopt;
  return apply(c.builder(), op, {c.dY(0), c.Y(0)}, c.dY(0).type, {{"axis", axes[0]}}, kFusedGradDomain);
}

}  // namespace

void register_softmax_rules(GradientRegistry& r) {
  r.add("Softmax", [](RuleContext& c) {
    // dx = y * (dy - sum(dy * y))
    Expr y = c.Y(0), dy = c.dY(0);
    const std::vector<int64_t> axes = softmax_axes(c);
    if (auto f = fused_softmax(c, "SoftmaxGrad", axes)) return c.set_dX(0, *f);
    c.set_dX(0, y * (dy - rules::reduce_sum(dy * y, axes, true, c.opset())));
  });
  r.add("LogSoftmax", [](RuleContext& c) {
    // dx = dy - softmax(x) * sum(dy), with softmax(x) = exp(y)
    Expr y = c.Y(0), dy = c.dY(0);
    const std::vector<int64_t> axes = softmax_axes(c);
    if (auto f = fused_softmax(c, "LogSoftmaxGrad", axes)) return c.set_dX(0, *f);
    c.set_dX(0, dy - exp(y) * rules::reduce_sum(dy, axes, true, c.opset()));
  });
}

}  // namespace onnxtrain
