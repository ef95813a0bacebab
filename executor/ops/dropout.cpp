// The plan-time part of Dropout and DropoutMask (dropout.h), shared by the CPU and CUDA kernels.
#include "executor/ops/dropout.h"

#include <string>

#include "executor/ops/kernel_util.h"
#include "graph/error.h"

namespace onnxtrain::ops {

DropoutAttrs prepare_dropout(PrepareContext& ctx) {
  const KernelInput& x = required_input(ctx, 0, "data");
  set_output(ctx, 0, x.dtype, x.shape);
  if (ctx.outputs.size() > 1) set_output(ctx, 1, DType::Bool, x.shape);
  // Before opset 12 ratio is an attribute and there is no training mode: the op is the identity.
  const bool inputs_form = ctx.opset >= 12;
  if (!inputs_form && ctx.node.attr_int("is_test", 1) == 0) ctx.fail("is_test=0 (training) is not supported");
  DropoutAttrs a;
  a.has_ratio = inputs_form && has_input(ctx, 1);
  a.has_mode = inputs_form && has_input(ctx, 2);
  if (a.has_mode && ctx.inputs[2].dtype != DType::Bool)
    ctx.fail("training_mode must be bool, got " + dtype_name(ctx.inputs[2].dtype));
  if (ctx.node.has_attr("seed")) {
    const int64_t s = ctx.node.attr_int("seed", 0);
    if (s < 0 || s > 0xffffffffLL) ctx.fail("seed must be in [0, 2^32), got " + std::to_string(s));
    a.seed = static_cast<uint32_t>(s);
  }
  a.fixed_ratio = inputs_form ? 0.5 : ctx.node.attr_float("ratio", 0.5f);
  return a;
}

DropoutMaskAttrs prepare_dropout_mask(PrepareContext& ctx) {
  const KernelInput& x = required_input(ctx, 0, "x");
  const KernelInput& c = required_input(ctx, 1, "counter");
  if (c.dtype != DType::Int64 || !c.shape.empty()) ctx.fail("counter must be an int64 scalar");
  DropoutMaskAttrs a;
  a.ratio = ctx.node.attr_float("ratio", 0.0f);
  if (!(a.ratio >= 0.0 && a.ratio < 1.0)) ctx.fail("ratio must be in [0, 1), got " + std::to_string(a.ratio));
  if (!ctx.node.has_attr("seed")) ctx.fail("needs a seed attribute");
  a.seed = static_cast<uint64_t>(ctx.node.attr_int("seed", 0));
  set_output(ctx, 0, DType::Bool, x.shape);
  return a;
}

}  // namespace onnxtrain::ops
