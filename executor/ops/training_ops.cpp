#include "executor/ops/training_ops.h"

#include <string>

#include "executor/ops/kernel_util.h"

namespace onnxtrain::ops {
namespace {

// Attributes the spec marks required have no default; we refuse the node rather than guess one.
double required_float(const PrepareContext& ctx, const char* name) {
  if (!ctx.node.has_attr(name)) ctx.fail(std::string("missing required attribute '") + name + "'");
  return ctx.node.attr_float(name, 0.0f);
}

// Checks R, T and the n groups of `per_group` tensors; sets every output to its X's dtype and shape.
// Returns n.
size_t prepare_groups(PrepareContext& ctx, size_t per_group, DType& dtype) {
  const size_t nin = ctx.inputs.size();
  if (nin < 2 + per_group || (nin - 2) % per_group != 0)
    ctx.fail("expected inputs R, T, then " + std::to_string(per_group) + " groups of n tensors (n >= 1), got " +
             std::to_string(nin) + " inputs");
  const size_t n = (nin - 2) / per_group;
  const KernelInput& r = ctx.inputs[0];
  const KernelInput& t = ctx.inputs[1];
  if (r.dtype != DType::Float32 && r.dtype != DType::Float64)
    ctx.fail("input 0 (R) must be float32 or float64, got " + dtype_name(r.dtype));
  if (numel_of(r.shape) != 1) ctx.fail("input 0 (R) must be a scalar, got shape " + shape_string(r.shape));
  if (t.dtype != DType::Int64) ctx.fail("input 1 (T) must be int64, got " + dtype_name(t.dtype));
  if (numel_of(t.shape) != 1) ctx.fail("input 1 (T) must be a scalar, got shape " + shape_string(t.shape));
  const size_t outs_per_group = per_group - 1;  // G has no output
  if (ctx.outputs.size() != n * outs_per_group)
    ctx.fail("expected " + std::to_string(n * outs_per_group) + " outputs for " + std::to_string(n) +
             " optimized tensors, got " + std::to_string(ctx.outputs.size()));
  dtype = ctx.inputs[2].dtype;
  if (dtype != DType::Float32 && dtype != DType::Float64)
    ctx.fail("optimized tensors must be float32 or float64, got " + dtype_name(dtype) + " for input 2");
  for (size_t i = 0; i < n; ++i) {
    const KernelInput& x = ctx.inputs[2 + i];
    for (size_t k = 0; k < per_group; ++k) {
      const size_t idx = 2 + k * n + i;
      const KernelInput& in = ctx.inputs[idx];
      if (!in.present()) ctx.fail("input " + std::to_string(idx) + " is missing");
      if (in.dtype != dtype)
        ctx.fail("input " + std::to_string(idx) + " is " + dtype_name(in.dtype) + ", expected " + dtype_name(dtype) +
                 " like input 2");
      // The spec speaks of broadcasting, but a tensor, its gradient and its state always share a shape in
      // practice; anything else is almost surely a wiring mistake.
      if (in.shape != x.shape)
        ctx.fail("input " + std::to_string(idx) + " has shape " + shape_string(in.shape) + ", expected " +
                 shape_string(x.shape) + " like the tensor it belongs to (input " + std::to_string(2 + i) + ")");
    }
    for (size_t k = 0; k < outs_per_group; ++k) {
      ctx.outputs[k * n + i].dtype = dtype;
      ctx.outputs[k * n + i].shape = x.shape;
    }
  }
  return n;
}

}  // namespace

PreviewUpdate<PreviewMomentumAttrs> prepare_preview_momentum(PrepareContext& ctx) {
  PreviewUpdate<PreviewMomentumAttrs> u{};
  u.attrs.alpha = required_float(ctx, "alpha");
  u.attrs.beta = required_float(ctx, "beta");
  u.attrs.norm = required_float(ctx, "norm_coefficient");
  if (!ctx.node.has_attr("mode")) ctx.fail("missing required attribute 'mode' (\"standard\" or \"nesterov\")");
  const std::string mode = ctx.node.attr_string("mode", "");
  if (mode != "standard" && mode != "nesterov")
    ctx.fail("attribute 'mode' is \"" + mode + "\", expected \"standard\" or \"nesterov\"");
  u.attrs.nesterov = mode == "nesterov";
  u.n = prepare_groups(ctx, 3, u.dtype);
  return u;
}

PreviewUpdate<PreviewAdamAttrs> prepare_preview_adam(PrepareContext& ctx) {
  const Node& n = ctx.node;
  PreviewUpdate<PreviewAdamAttrs> u{};
  // Defaults are the schema's (float32 values, as ONNX stores them).
  u.attrs = {n.attr_float("alpha", 0.9f), n.attr_float("beta", 0.999f), n.attr_float("epsilon", 1e-6f),
             n.attr_float("norm_coefficient", 0.0f), n.attr_float("norm_coefficient_post", 0.0f)};
  u.n = prepare_groups(ctx, 4, u.dtype);
  return u;
}

PreviewUpdate<PreviewAdagradAttrs> prepare_preview_adagrad(PrepareContext& ctx) {
  const Node& n = ctx.node;
  PreviewUpdate<PreviewAdagradAttrs> u{};
  u.attrs = {n.attr_float("decay_factor", 0.0f), n.attr_float("epsilon", 1e-6f), n.attr_float("norm_coefficient", 0.0f)};
  u.n = prepare_groups(ctx, 3, u.dtype);
  return u;
}

}  // namespace onnxtrain::ops
