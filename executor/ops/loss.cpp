// The plan-time part of the loss ops (loss.h), shared by the CPU and CUDA kernels.
#include "executor/ops/loss.h"

#include <vector>

#include "executor/ops/kernel_util.h"
#include "graph/error.h"

namespace onnxtrain::ops {

LossAttrs prepare_loss(PrepareContext& ctx, bool softmax) {
  const KernelInput& x = required_input(ctx, 0, softmax ? "scores" : "input");
  const KernelInput& t = required_input(ctx, 1, softmax ? "labels" : "target");
  if (x.shape.size() < 2) ctx.fail("input must have shape [N, C, d...], got " + shape_string(x.shape));
  std::vector<int64_t> want{x.shape[0]};
  want.insert(want.end(), x.shape.begin() + 2, x.shape.end());
  if (t.shape != want) ctx.fail("target has shape " + shape_string(t.shape) + ", expected " + shape_string(want));
  const int64_t C = x.shape[1];
  if (has_input(ctx, 2)) {
    const KernelInput& w = ctx.inputs[2];
    if (w.dtype != x.dtype) ctx.fail("weight must have the input's dtype " + dtype_name(x.dtype));
    if (w.shape != std::vector<int64_t>{C}) ctx.fail("weight must have shape [" + std::to_string(C) + "], got " + shape_string(w.shape));
  }
  LossAttrs a;
  a.reduction = ctx.node.attr_string("reduction", "mean");
  if (a.reduction != "none" && a.reduction != "sum" && a.reduction != "mean")
    ctx.fail("reduction must be none, sum or mean, got '" + a.reduction + "'");
  if (ctx.node.has_attr("ignore_index")) a.ignore = ctx.node.attr_int("ignore_index", 0);
  set_output(ctx, 0, x.dtype, a.reduction == "none" ? want : std::vector<int64_t>{});
  if (softmax && ctx.outputs.size() > 1) set_output(ctx, 1, x.dtype, x.shape);
  if (t.dtype != DType::Int64 && t.dtype != DType::Int32)
    ctx.fail("target must be int32 or int64, got " + dtype_name(t.dtype));
  a.wide_target = t.dtype == DType::Int64;
  a.n = x.shape[0];
  a.c = C;
  for (size_t i = 2; i < x.shape.size(); ++i) a.d *= x.shape[i];
  return a;
}

}  // namespace onnxtrain::ops
