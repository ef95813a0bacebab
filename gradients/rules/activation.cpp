// Gradients of the activation family (kernels: executor/cpu/activation.cpp, executor/cuda/activation.cu, which
// also hold the fused GeluGrad and GeluTanhGrad this file emits; they read Gelu's input). Relu, Sigmoid, Tanh,
// LeakyRelu, Softplus, Elu (unary kernels): unary.cpp; Softmax and LogSoftmax: softmax.cpp.
#include <cmath>
#include <numbers>
#include <numeric>
#include <optional>
#include <string>

#include "gradients/fused.h"
#include "gradients/rule.h"
#include "gradients/rules/util.h"

namespace onnxtrain {

namespace {

Expr zero(const Expr& a) { return scalar(*a.b, a.dtype(), 0.0); }
Expr positive(const Expr& a) { return greater(a, zero(a)); }
Expr unary(const std::string& op, const Expr& a) { return apply(*a.b, op, {a}, a.type); }

}  // namespace

void register_activation_rules(GradientRegistry& r) {
  // Selu and Celu (and Elu, unary.cpp): for x <= 0 the derivative is (y + alpha * gamma) (resp. y / alpha + 1),
  // and the sign of y tells the branches apart for the usual attributes, so these read only Y.
  r.add("Selu", [](RuleContext& c) {
    const double alpha = c.node().attr_float("alpha", 1.67326319217681884765625f);
    const double gamma = c.node().attr_float("gamma", 1.05070102214813232421875f);
    Expr dy = c.dY(0), y = c.Y(0);
    Expr s = alpha >= 0 && gamma > 0 ? y : c.X(0);
    c.set_dX(0, where(positive(s), dy * gamma, dy * (y + alpha * gamma)));
  });
  r.add("Celu", [](RuleContext& c) {
    // y = alpha * (exp(x / alpha) - 1) for x <= 0, which has the sign of x for either sign of alpha.
    const double alpha = c.node().attr_float("alpha", 1.0f);
    Expr dy = c.dY(0), y = c.Y(0);
    c.set_dX(0, where(positive(y), dy, dy * (y / alpha + 1.0)));
  });
  r.add("Gelu", [](RuleContext& c) {
    // Fused: one pass instead of 11 (erf) or 18 (tanh) elementwise nodes; the bodies in gradients/fused.cpp
    // spell out the derivatives.
    const std::string approx = c.node().attr_string("approximate", "none");
    if (approx != "none" && approx != "tanh")
      c.fail("attribute 'approximate' must be \"none\" or \"tanh\", got \"" + approx + "\"");
    const char* op = approx == "tanh" ? "GeluTanhGrad" : "GeluGrad";
    c.set_dX(0, apply(c.builder(), op, {c.dY(0), c.X(0)}, c.dY(0).type, {}, kFusedGradDomain));
  });
  r.add("HardSigmoid", [](RuleContext& c) {
    // alpha inside the linear piece 0 < y < 1, 0 where it saturates.
    const double alpha = c.node().attr_float("alpha", 0.2f);
    Expr y = c.Y(0), dy = c.dY(0);
    Expr z = zero(dy);
    c.set_dX(0, where(positive(y), where(less(y, scalar(c.builder(), y.dtype(), 1.0)), dy * alpha, z), z));
  });
  r.add("HardSwish", [](RuleContext& c) {
    // y = x * clip(x/6 + 1/2, 0, 1):  0 below -3, 1 above 3, x/3 + 1/2 between.
    Expr x = c.X(0), dy = c.dY(0);
    Expr z = zero(dy);
    c.set_dX(0, where(less(x, scalar(c.builder(), x.dtype(), -3.0)), z,
                      where(greater(x, scalar(c.builder(), x.dtype(), 3.0)), dy, dy * (x / 3.0 + 0.5))));
  });
  r.add("Softsign", [](RuleContext& c) {
    // dy/dx = 1 / (1 + |x|)^2, and 1 - |y| = 1 / (1 + |x|).
    Expr y = c.Y(0);
    Expr g = 1.0 - abs(y);
    c.set_dX(0, c.dY(0) * (g * g));
  });
  r.add("Mish", [](RuleContext& c) {
    // y = x tanh(sp(x)), sp' = sigmoid:  dy/dx = t + x (1 - t^2) sigmoid(x),  t = tanh(softplus(x))
    Expr x = c.X(0);
    Expr t = unary("Tanh", unary("Softplus", x));
    c.set_dX(0, c.dY(0) * (t + x * (1.0 - t * t) * unary("Sigmoid", x)));
  });
  r.add("ThresholdedRelu", [](RuleContext& c) {
    // With alpha >= 0, y > 0 exactly where x > alpha.
    const double alpha = c.node().attr_float("alpha", 1.0f);
    Expr dy = c.dY(0);
    Expr pass = alpha >= 0 ? positive(c.Y(0)) : greater(c.X(0), scalar(c.builder(), c.X(0).dtype(), alpha));
    c.set_dX(0, where(pass, dy, zero(dy)));
  });
  r.add("Shrink", [](RuleContext& c) {
    // y = x -/+ bias outside [-lambd, lambd], 0 inside: slope 1 where |x| > lambd, else 0 (bias only shifts).
    const double lambd = c.node().attr_float("lambd", 0.5f);
    Expr x = c.X(0), dy = c.dY(0);
    c.set_dX(0, where(greater(abs(x), scalar(c.builder(), x.dtype(), lambd)), dy, zero(dy)));
  });
  r.add("PRelu", [](RuleContext& c) {
    // y = x < 0 ? slope * x : x; the engine sums dslope (in X's shape) back to the slope's shape.
    Expr x = c.X(0), dy = c.dY(0);
    Expr neg = less(x, zero(x));
    if (c.needs_dX(0)) c.set_dX(0, where(neg, dy * c.X(1), dy));
    if (c.needs_dX(1)) c.set_dX(1, where(neg, dy * x, zero(dy)));
  });
}

}  // namespace onnxtrain
