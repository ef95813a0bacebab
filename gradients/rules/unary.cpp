// Gradients of ops whose kernels are the unary family (executor/cpu/unary.cpp, executor/cuda/unary.cu): Neg,
// Identity, Sqrt, Exp, Log, Abs, Reciprocal, Erf, Cast, CastLike, Clip, the activations Relu, Sigmoid, Tanh,
// LeakyRelu, Softplus and Elu, and the trigonometric and hyperbolic functions (Round, their kernels' neighbour,
// is not differentiable). Relu, Sigmoid and Tanh use the fused onnxtrain ops (gradients/fused.h), which read
// only the forward output, so the input can be freed after the forward pass.
#include <cmath>
#include <numbers>
#include <optional>
#include <string>

#include "gradients/fused.h"
#include "gradients/rule.h"
#include "gradients/rules/util.h"

namespace onnxtrain {

namespace {

Expr fused(RuleContext& c, const std::string& op) {
  return apply(c.builder(), op, {c.dY(0), c.Y(0)}, c.dY(0).type, {}, kFusedGradDomain);
}

Expr zero(const Expr& a) { return scalar(*a.b, a.dtype(), 0.0); }
Expr positive(const Expr& a) { return greater(a, zero(a)); }

// The same-typed unary op `op` of a (for the functions Expr has no shorthand for).
Expr unary(const std::string& op, const Expr& a) { return apply(*a.b, op, {a}, a.type); }

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
  r.add("Neg", [](RuleContext& c) { c.set_dX(0, -c.dY(0)); });
  r.add("Identity", [](RuleContext& c) { c.set_dX(0, c.dY(0)); });
  r.add("Sqrt", [](RuleContext& c) { c.set_dX(0, (0.5 * c.dY(0)) / c.Y(0)); });
  r.add("Exp", [](RuleContext& c) { c.set_dX(0, c.dY(0) * c.Y(0)); });
  r.add("Log", [](RuleContext& c) { c.set_dX(0, c.dY(0) / c.X(0)); });
  r.add("Abs", [](RuleContext& c) { c.set_dX(0, c.dY(0) * sign(c.X(0))); });
  r.add("Reciprocal", [](RuleContext& c) {
    // y = 1/x:  dx = -dy / x^2 = -dy * y * y
    c.set_dX(0, -(c.dY(0) * c.Y(0) * c.Y(0)));
  });
  r.add("Erf", [](RuleContext& c) {
    // d/dx erf(x) = 2/sqrt(pi) * exp(-x^2)
    Expr x = c.X(0);
    c.set_dX(0, c.dY(0) * (2.0 / std::sqrt(std::numbers::pi)) * exp(-(x * x)));
  });
  r.add("Cast", [](RuleContext& c) {
    // Only a float-to-float cast carries a gradient; casts to or from integers are piecewise constant.
    if (!is_floating(c.X(0).dtype()) || !is_floating(c.dY(0).dtype())) return;
    c.set_dX(0, cast(c.dY(0), c.X(0).dtype()));
  });
  r.add("CastLike", [](RuleContext& c) {
    // CastLike(dY, X) as a Cast to X's static dtype, so that X need not stay alive for the backward pass;
    // target_type only lends its dtype and gets no gradient.
    const DType x = rules::input_type(c, 0).dtype;
    if (!is_floating(x) || !is_floating(c.dY(0).dtype())) return;
    c.set_dX(0, cast(c.dY(0), x));
  });
  r.add("Clip", clip_rule);
  r.add("Relu", [](RuleContext& c) { c.set_dX(0, fused(c, "ReluGrad")); });
  r.add("Sigmoid", [](RuleContext& c) { c.set_dX(0, fused(c, "SigmoidGrad")); });
  r.add("Tanh", [](RuleContext& c) { c.set_dX(0, fused(c, "TanhGrad")); });
  r.add("LeakyRelu", [](RuleContext& c) {
    const double alpha = c.node().attr_float("alpha", 0.01f);
    // With alpha > 0, y > 0 exactly where x > 0, so only Y is kept for the backward pass.
    Expr s = alpha > 0 ? c.Y(0) : c.X(0), dy = c.dY(0);
    c.set_dX(0, where(positive(s), dy, dy * alpha));
  });
  r.add("Softplus", [](RuleContext& c) {
    // d/dx log(1 + e^x) = sigmoid(x)
    Expr x = c.X(0);
    c.set_dX(0, c.dY(0) * apply(c.builder(), "Sigmoid", {x}, x.type));
  });
  // Elu: for x <= 0 the derivative is y + alpha, and the sign of y tells the branches apart for alpha >= 0, so
  // it reads only Y (as Selu and Celu, activation.cpp).
  r.add("Elu", [](RuleContext& c) {
    const double alpha = c.node().attr_float("alpha", 1.0f);
    Expr dy = c.dY(0), y = c.Y(0);
    Expr s = alpha >= 0 ? y : c.X(0);  // alpha < 0 makes y positive on both branches
    c.set_dX(0, where(positive(s), dy, dy * (y + alpha)));
  });
  // ---- trigonometric and hyperbolic
  r.add("Sin", [](RuleContext& c) { c.set_dX(0, c.dY(0) * unary("Cos", c.X(0))); });
  r.add("Cos", [](RuleContext& c) { c.set_dX(0, -(c.dY(0) * unary("Sin", c.X(0)))); });
  // d tan = 1 + tan^2
  r.add("Tan", [](RuleContext& c) { c.set_dX(0, c.dY(0) * (1.0 + c.Y(0) * c.Y(0))); });
  r.add("Asin", [](RuleContext& c) {
    Expr x = c.X(0);
    c.set_dX(0, c.dY(0) / sqrt(1.0 - x * x));
  });
  r.add("Acos", [](RuleContext& c) {
    Expr x = c.X(0);
    c.set_dX(0, -c.dY(0) / sqrt(1.0 - x * x));
  });
  r.add("Atan", [](RuleContext& c) {
    Expr x = c.X(0);
    c.set_dX(0, c.dY(0) / (1.0 + x * x));
  });
  r.add("Sinh", [](RuleContext& c) { c.set_dX(0, c.dY(0) * unary("Cosh", c.X(0))); });
  r.add("Cosh", [](RuleContext& c) { c.set_dX(0, c.dY(0) * unary("Sinh", c.X(0))); });
  // d asinh = 1/sqrt(x^2 + 1) = 1/cosh(y);  d acosh = 1/sqrt(x^2 - 1) = 1/sinh(y)
  r.add("Asinh", [](RuleContext& c) { c.set_dX(0, c.dY(0) / unary("Cosh", c.Y(0))); });
  r.add("Acosh", [](RuleContext& c) { c.set_dX(0, c.dY(0) / unary("Sinh", c.Y(0))); });
  r.add("Atanh", [](RuleContext& c) {
    Expr x = c.X(0);
    c.set_dX(0, c.dY(0) / (1.0 - x * x));
  });
}

}  // namespace onnxtrain
