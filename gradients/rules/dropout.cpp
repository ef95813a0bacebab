// Gradient of Dropout (kernels: executor/cpu/dropout.cpp, executor/cuda/dropout.cu; LoRA's
// onnxtrain.DropoutMask draws masks only and has no gradient).
#include "gradients/rule.h"
#include "gradients/rules/util.h"

namespace onnxtrain {

namespace {

Expr zero_of(RuleContext& c, const Expr& like) { return scalar(c.builder(), like.dtype(), 0.0); }

void dropout_rule(RuleContext& c) {
  // Inference is the identity; in training y = x * mask / (1 - ratio), read back through the mask output.
  if (c.opset() < 12 || !c.has_input(2)) return c.set_dX(0, c.dY(0));
  if (c.num_outputs() < 2 || c.node().outputs[1].empty())
    c.fail("needs the mask output to differentiate training-mode Dropout (add a second output to the node)");
  GraphBuilder& b = c.builder();
  Expr dy = c.dY(0);
  const DType dt = dy.dtype();
  Expr ratio = c.has_input(1) ? cast(c.X(1), dt) : scalar(b, dt, 0.5);
  // Inference mode (training_mode false at run time) has an all-true mask and no scaling.
  Expr scale = where(c.X(2), 1.0 / (1.0 - ratio), scalar(b, dt, 1.0));
  c.set_dX(0, where(c.Y(1), dy * scale, zero_of(c, dy)));
}

}  // namespace

void register_dropout_rules(GradientRegistry& r) {
  r.add("Dropout", dropout_rule);
}

}  // namespace onnxtrain
