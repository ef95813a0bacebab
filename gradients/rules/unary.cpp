// Gradients of ops whose kernels are the unary family (executor/cpu/unary.cpp, executor/cuda/unary.cu): Clip.
// The other unary ops' rules are still in elementwise.cpp and activation.cpp (docs/executor.md, "Families").
#include <optional>

#include "gradients/rule.h"
#include "gradients/rules/util.h"

namespace onnxtrain {

namespace {

Expr zero_of(RuleContext& c, const Expr& like) { return scalar(c.builder(), like.dtype(), 0.0); }

void clip_rule(RuleContext& c) {
  // y = min(max(x, lo), hi): x passes its gradient where lo <= x <= hi.
  GraphBuilder& b = c.builder();
  Expr x = c.X(0), dy = c.dY(0), zero = zero_of(c, dy);
  std::optional<Expr> lo, hi;
  if (c.opset() < 11) {
    if (c.node().has_attr("min")) lo = scalar(b, x.dtype(), c.node().attr_float("min", 0));
    if (c.node().has_attr("max")) hi = scalar(b, x.dtype(), c.node().attr_float("max", 0));
  } else {
    if (c.has_input(1)) lo = c.X(1);
    if (c.has_input(2)) hi = c.X(2);
  }
  // min and max are non-differentiable in the ONNX schema: only x gets a gradient.
  Expr g = dy;
  if (lo) g = where(less(x, *lo), zero, g);
  if (hi) g = where(greater(x, *hi), zero, g);
  c.set_dX(0, g);
}

}  // namespace

void register_unary_rules(GradientRegistry& r) {
  r.add("Clip", clip_rule);
}

}  // namespace onnxtrain
