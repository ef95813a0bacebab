// The plan-time part of the activations (activation.h), shared by the CPU and CUDA kernels.
#include "executor/ops/activation.h"

#include <string>
#include <vector>

#include "executor/broadcast.h"
#include "executor/ops/kernel_util.h"
#include "graph/error.h"

namespace onnxtrain::ops {

void prepare_activation(PrepareContext& ctx) {
  if (ctx.inputs.empty() || !ctx.inputs[0].present()) ctx.fail("input 0 is required");
  if (ctx.inputs.size() != 1) ctx.fail("expected 1 input, got " + std::to_string(ctx.inputs.size()));
  if (ctx.outputs.size() != 1) ctx.fail("expected 1 output, got " + std::to_string(ctx.outputs.size()));
  set_output(ctx, 0, ctx.inputs[0].dtype, ctx.inputs[0].shape);
}

SeluOp prepare_selu(PrepareContext& ctx) {
  const SeluOp op = selu_op(ctx.node);
  prepare_activation(ctx);
  return op;
}

CeluOp prepare_celu(PrepareContext& ctx) {
  const CeluOp op = celu_op(ctx.node);
  if (op.alpha == 0.0f) ctx.fail("attribute 'alpha' must not be 0 (Celu divides by it)");
  prepare_activation(ctx);
  return op;
}

HardSigmoidOp prepare_hard_sigmoid(PrepareContext& ctx) {
  const HardSigmoidOp op = hard_sigmoid_op(ctx.node);
  prepare_activation(ctx);
  return op;
}

ThresholdedReluOp prepare_thresholded_relu(PrepareContext& ctx) {
  const ThresholdedReluOp op = thresholded_relu_op(ctx.node);
  prepare_activation(ctx);
  return op;
}

GeluAttrs prepare_gelu(PrepareContext& ctx) {
  const std::string a = ctx.node.attr_string("approximate", "none");
  if (a != "none" && a != "tanh") ctx.fail("attribute 'approximate' must be \"none\" or \"tanh\", got \"" + a + "\"");
  prepare_activation(ctx);
  return {a == "tanh"};
}

void prepare_prelu(PrepareContext& ctx) {
  if (ctx.inputs.size() != 2 || !ctx.inputs[0].present() || !ctx.inputs[1].present())
    ctx.fail("expected 2 inputs (X, slope)");
  if (ctx.outputs.size() != 1) ctx.fail("expected 1 output, got " + std::to_string(ctx.outputs.size()));
  const KernelInput& x = ctx.inputs[0];
  const KernelInput& slope = ctx.inputs[1];
  if (slope.dtype != x.dtype)
    ctx.fail("slope must have X's dtype " + dtype_name(x.dtype) + ", got " + dtype_name(slope.dtype));
  const std::vector<std::vector<int64_t>> shapes = {x.shape, slope.shape};
  auto b = broadcast_shapes(shapes);
  if (!b || *b != x.shape)
    ctx.fail("slope of shape " + shape_string(slope.shape) + " does not broadcast to X's shape " +
             shape_string(x.shape));
  set_output(ctx, 0, x.dtype, x.shape);
}

HardmaxLanes prepare_hardmax(PrepareContext& ctx) {
  prepare_activation(ctx);
  const KernelInput& x = ctx.inputs[0];
  const auto rank = static_cast<int64_t>(x.shape.size());
  const bool coerce = ctx.opset < 13;
  if (rank == 0) ctx.fail("input must have rank >= 1, got a scalar");
  const int64_t axis = normalize_axis(ctx, ctx.node.attr_int("axis", coerce ? 1 : -1), rank);
  HardmaxLanes l;
  for (int64_t d = 0; d < axis; ++d) l.outer *= x.shape[d];
  l.len = x.shape[axis];
  for (int64_t d = axis + 1; d < rank; ++d) (coerce ? l.len : l.inner) *= x.shape[d];
  return l;
}

}  // namespace onnxtrain::ops
