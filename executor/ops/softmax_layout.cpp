// The layout of Softmax, LogSoftmax and their fused gradients (softmax_layout.h), shared by the CPU and CUDA kernels.
#include "executor/ops/softmax_layout.h"

#include <string>

#include "executor/ops/kernel_util.h"
#include "graph/error.h"

namespace onnxtrain::ops {

SoftmaxLayout softmax_layout(const PrepareContext& ctx, const std::vector<int64_t>& shape, int64_t axis,
                                       bool coerce_2d) {
  const auto rank = static_cast<int64_t>(shape.size());
  if (rank == 0) ctx.fail("input must have rank >= 1, got a scalar");
  if (axis < -rank || axis >= rank)
    ctx.fail("axis " + std::to_string(axis) + " is out of range for an input of rank " + std::to_string(rank) + " " +
             shape_string(shape));
  if (axis < 0) axis += rank;
  SoftmaxLayout l;
  for (int64_t d = 0; d < axis; ++d) l.outer *= shape[d];
  l.len = shape[axis];
  for (int64_t d = axis + 1; d < rank; ++d) (coerce_2d ? l.len : l.inner) *= shape[d];
  return l;
}

SoftmaxLayout softmax_layout(const PrepareContext& ctx, bool fused_grad) {
  // The fused ops always have the opset 13 single-axis semantics, whatever the model's ai.onnx opset.
  const bool old = !fused_grad && ctx.opset < 13;
  return softmax_layout(ctx, ctx.inputs[0].shape, ctx.node.attr_int("axis", old ? 1 : -1), old);
}

SoftmaxLayout prepare_softmax(PrepareContext& ctx, bool fused_grad) {
  if (fused_grad) {
    expect_grad_inputs(ctx);
  } else {
    if (ctx.inputs.empty() || !ctx.inputs[0].present()) ctx.fail("input 0 (input) is required");
    if (ctx.outputs.size() != 1) ctx.fail("expected 1 output, got " + std::to_string(ctx.outputs.size()));
  }
  const SoftmaxLayout l = softmax_layout(ctx, fused_grad);
  set_output(ctx, 0, ctx.inputs[0].dtype, ctx.inputs[0].shape);
  return l;
}

}  // namespace onnxtrain::ops
