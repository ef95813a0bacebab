// The plan-time part of the unary elementwise ops and the fused gradients (unary.h), shared by the CPU and CUDA
// kernels.
#include "executor/ops/unary.h"

#include <string>

#include "executor/ops/kernel_util.h"
#include "graph/error.h"

namespace onnxtrain::ops {
namespace {

void expect_one_input(PrepareContext& ctx) {
  if (ctx.inputs.empty() || !ctx.inputs[0].present()) ctx.fail("input 0 is required");
  if (ctx.outputs.size() != 1) ctx.fail("expected 1 output, got " + std::to_string(ctx.outputs.size()));
}

void same_as_input(PrepareContext& ctx, DType out_dtype) { set_output(ctx, 0, out_dtype, ctx.inputs[0].shape); }

bool is_half(DType t) { return t == DType::Float16 || t == DType::BFloat16; }

// The casts between the plain types, both backends' dispatch<float, double, int64_t, int32_t, bool, uint8_t,
// int8_t>.
bool plain_cast_type(DType t) {
  return t == DType::Float32 || t == DType::Float64 || t == DType::Int64 || t == DType::Int32 || t == DType::Bool ||
         t == DType::UInt8 || t == DType::Int8;
}

// The half casts, executor/half.h's half_cast_kernel pairs.
bool half_cast_pair(DType from, DType to) {
  return (from == DType::Float32 && is_half(to)) || (is_half(from) && to == DType::Float32);
}

// Cast to `to`; CastLike (opset 15+) passes the target dtype as its second input instead of an attribute.
CastTypes prepare_cast_to(PrepareContext& ctx, DType to) {
  const DType from = ctx.inputs[0].dtype;
  same_as_input(ctx, to);
  if (from == to) return {from, to};
  if (is_half(from) || is_half(to)) {
    if (!half_cast_pair(from, to))
      ctx.fail("casting " + dtype_name(from) + " to " + dtype_name(to) +
               " is not supported (float16 and bfloat16 cast only to and from float32)");
  } else if (!plain_cast_type(from) || !plain_cast_type(to)) {
    const std::string to_name = dtype_name(to).empty() ? "dtype " + std::to_string(static_cast<int>(to)) : dtype_name(to);
    ctx.fail("casting " + dtype_name(from) + " to " + to_name +
             " is not supported (supported: float32, float64, int64, int32, bool, uint8, int8)");
  }
  return {from, to};
}

}  // namespace

void prepare_unary(PrepareContext& ctx) {
  expect_one_input(ctx);
  same_as_input(ctx, ctx.inputs[0].dtype);
}

LeakyReluOp prepare_leaky_relu(PrepareContext& ctx) {
  prepare_unary(ctx);
  return leaky_relu_op(ctx.node);
}

EluOp prepare_elu(PrepareContext& ctx) {
  prepare_unary(ctx);
  return elu_op(ctx.node);
}

void prepare_identity(PrepareContext& ctx) {
  expect_one_input(ctx);
  if (dtype_size(ctx.inputs[0].dtype) == 0) fail_dtype(ctx);
  same_as_input(ctx, ctx.inputs[0].dtype);
}

CastTypes prepare_cast(PrepareContext& ctx) {
  expect_one_input(ctx);
  if (!ctx.node.has_attr("to")) ctx.fail("attribute 'to' is required");
  return prepare_cast_to(ctx, static_cast<DType>(ctx.node.attr_int("to", 0)));
}

CastTypes prepare_cast_like(PrepareContext& ctx) {
  if (ctx.inputs.size() != 2 || !ctx.inputs[1].present()) ctx.fail("expected 2 inputs (input, target_type)");
  return prepare_cast_to(ctx, ctx.inputs[1].dtype);
}

ClipAttrs prepare_clip(PrepareContext& ctx) {
  expect_one_input(ctx);
  const DType t = ctx.inputs[0].dtype;
  same_as_input(ctx, t);
  ClipAttrs a;
  a.from_inputs = ctx.opset >= 11;
  if (a.from_inputs) {
    if (ctx.inputs.size() > 3) ctx.fail("expected at most 3 inputs, got " + std::to_string(ctx.inputs.size()));
    for (size_t i = 1; i < ctx.inputs.size(); ++i) {
      const KernelInput& b = ctx.inputs[i];
      if (!b.present()) continue;
      if (b.dtype != t)
        ctx.fail(std::string(i == 1 ? "min" : "max") + " must have the input's dtype " + dtype_name(t) + ", got " +
                 dtype_name(b.dtype));
      if (numel_of(b.shape) != 1)
        ctx.fail(std::string(i == 1 ? "min" : "max") + " must be a scalar, got shape " + shape_string(b.shape));
    }
  } else if (t != DType::Float32 && t != DType::Float64) {
    fail_dtype(ctx);  // opset 6-10 is float-only, bounds are float attributes
  }
  return a;
}

void prepare_fused_grad(PrepareContext& ctx) {
  expect_grad_inputs(ctx);
  const KernelInput& dy = ctx.inputs[0];
  set_output(ctx, 0, dy.dtype, dy.shape);
}

}  // namespace onnxtrain::ops
