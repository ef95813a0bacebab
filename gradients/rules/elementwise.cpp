// Gradients of elementwise arithmetic. Rules return gradients in the broadcast (output) shape; the engine
// sums them back to each input's shape. The one-input maths (Sqrt, Exp, the trigonometric ops, ...) is the unary
// family, unary.cpp.
#include <cmath>
#include <numbers>

#include "gradients/rule.h"
#include "gradients/rules/util.h"

namespace onnxtrain {

namespace {

Expr zero_like(const Expr& a) { return scalar(*a.b, a.dtype(), 0.0); }

// The same-typed unary op `op` of a (for the functions Expr has no shorthand for).
Expr unary(const std::string& op, const Expr& a) { return apply(*a.b, op, {a}, a.type); }

// Max and Min route the gradient to the inputs equal to the result (each tied input gets it in full).
void register_select(GradientRegistry& r, const std::string& op) {
  r.add(op, [](RuleContext& c) {
    for (size_t i = 0; i < c.num_inputs(); ++i)
      if (c.needs_dX(i)) c.set_dX(i, where(equal(c.X(i), c.Y(0)), c.dY(0), zero_like(c.dY(0))));
  });
}

}  // namespace

void register_elementwise_rules(GradientRegistry& r) {
  r.add("Add", [](RuleContext& c) {
    c.set_dX(0, c.dY(0));
    c.set_dX(1, c.dY(0));
  });
  r.add("Sub", [](RuleContext& c) {
    c.set_dX(0, c.dY(0));
    if (c.needs_dX(1)) c.set_dX(1, -c.dY(0));
  });
  r.add("Mul", [](RuleContext& c) {
    if (c.needs_dX(0)) c.set_dX(0, c.dY(0) * c.X(1));
    if (c.needs_dX(1)) c.set_dX(1, c.dY(0) * c.X(0));
  });
  r.add("Div", [](RuleContext& c) {
    // y = a / b:  da = dy / b,  db = -dy * a / b^2 = -(dy * y) / b
    if (c.needs_dX(0)) c.set_dX(0, c.dY(0) / c.X(1));
    if (c.needs_dX(1)) c.set_dX(1, -(c.dY(0) * c.Y(0)) / c.X(1));
  });
  r.add("Sum", [](RuleContext& c) {
    for (size_t i = 0; i < c.num_inputs(); ++i) c.set_dX(i, c.dY(0));
  });
  r.add("Mean", [](RuleContext& c) {
    Expr g = c.dY(0) / static_cast<double>(c.num_inputs());
    for (size_t i = 0; i < c.num_inputs(); ++i) c.set_dX(i, g);
  });
  register_select(r, "Max");
  register_select(r, "Min");
  r.add("Pow", [](RuleContext& c) {
    // y = a^e:  da = dy * e * a^(e-1),  de = dy * y * log(a). The exponent may have another numeric type.
    if (c.needs_dX(0)) {
      Expr e = cast(c.X(1), c.X(0).dtype());
      c.set_dX(0, c.dY(0) * e * pow(c.X(0), e - 1.0));
    }
    if (c.needs_dX(1)) c.set_dX(1, cast(c.dY(0) * c.Y(0) * log(c.X(0)), c.X(1).dtype()));
  });
  r.add("Where", [](RuleContext& c) {
    Expr zero = zero_like(c.dY(0));
    if (c.needs_dX(1)) c.set_dX(1, where(c.X(0), c.dY(0), zero));
    if (c.needs_dX(2)) c.set_dX(2, where(c.X(0), zero, c.dY(0)));
  });
  r.add("Mod", [](RuleContext& c) {
    // fmod=1 (the only form ONNX allows for floats): Y = A - trunc(A / B) * B, so dA = dY and
    // dB = -dY * trunc(A / B), as torch.fmod defines it. ONNX has no Trunc; trunc(A / B) = (A - Y) / B exactly
    // up to rounding, which Round removes. fmod=0 is integer-only, and integers carry no gradient.
    if (c.node().attr_int("fmod", 0) != 1) c.fail("fmod=0 is defined for integer inputs only, which have no gradient");
    c.set_dX(0, c.dY(0));
    if (c.needs_dX(1)) c.set_dX(1, -(c.dY(0) * unary("Round", (c.X(0) - c.Y(0)) / c.X(1))));
  });
}

}  // namespace onnxtrain
