// The plan-time part of the binary, ternary and variadic elementwise ops (elementwise.h), shared by the CPU and
// CUDA kernels.
#include "executor/ops/elementwise.h"

#include <string>

#include "executor/broadcast.h"
#include "executor/ops/kernel_util.h"
#include "graph/error.h"

namespace onnxtrain::ops {
namespace {

void expect_arity(PrepareContext& ctx, size_t min_inputs, size_t max_inputs) {
  size_t n = ctx.inputs.size();
  if (n < min_inputs || n > max_inputs)
    ctx.fail("expected " + (min_inputs == max_inputs ? std::to_string(min_inputs)
                                                      : std::to_string(min_inputs) + ".." + std::to_string(max_inputs)) +
             " inputs, got " + std::to_string(n));
  for (size_t i = 0; i < n; ++i)
    if (!ctx.inputs[i].present()) ctx.fail("input " + std::to_string(i) + " is required");
  if (ctx.outputs.size() != 1) ctx.fail("expected 1 output, got " + std::to_string(ctx.outputs.size()));
}

void expect_same_dtype(PrepareContext& ctx, size_t first, size_t last) {
  for (size_t i = first + 1; i <= last; ++i)
    if (ctx.inputs[i].dtype != ctx.inputs[first].dtype)
      ctx.fail("inputs " + std::to_string(first) + " and " + std::to_string(i) + " must have the same dtype, got " +
               dtype_name(ctx.inputs[first].dtype) + " and " + dtype_name(ctx.inputs[i].dtype));
}

// The multidirectional broadcast of all inputs; sets output 0 and returns the input shapes.
InputShapes broadcast_output(PrepareContext& ctx, DType out_dtype) {
  InputShapes shapes;
  for (const KernelInput& in : ctx.inputs) shapes.push_back(in.shape);
  auto out = broadcast_shapes(shapes);
  if (!out) ctx.fail("input shapes " + shapes_string(shapes) + " are not broadcastable (ONNX multidirectional broadcasting)");
  set_output(ctx, 0, out_dtype, *out);
  return shapes;
}

// Pow's operand dtypes: the ones both backends instantiate, for the base and the exponent alike.
bool pow_dtype(DType t) {
  return t == DType::Float32 || t == DType::Float64 || t == DType::Int64 || t == DType::Int32;
}

}  // namespace

InputShapes prepare_binary(PrepareContext& ctx, bool bool_out) {
  expect_arity(ctx, 2, 2);
  expect_same_dtype(ctx, 0, 1);
  const DType t = ctx.inputs[0].dtype;
  return broadcast_output(ctx, bool_out ? DType::Bool : t);
}

InputShapes prepare_pow(PrepareContext& ctx) {
  expect_arity(ctx, 2, 2);
  const DType tx = ctx.inputs[0].dtype, ty = ctx.inputs[1].dtype;
  InputShapes shapes = broadcast_output(ctx, tx);
  if (!pow_dtype(tx) || !pow_dtype(ty)) ctx.fail("unsupported dtypes " + dtype_name(tx) + " ^ " + dtype_name(ty));
  return shapes;
}

InputShapes prepare_where(PrepareContext& ctx) {
  expect_arity(ctx, 3, 3);
  if (ctx.inputs[0].dtype != DType::Bool) ctx.fail("condition must be bool, got " + dtype_name(ctx.inputs[0].dtype));
  expect_same_dtype(ctx, 1, 2);
  return broadcast_output(ctx, ctx.inputs[1].dtype);
}

InputShapes prepare_variadic(PrepareContext& ctx) {
  expect_arity(ctx, 1, 1 << 20);
  expect_same_dtype(ctx, 0, ctx.inputs.size() - 1);
  return broadcast_output(ctx, ctx.inputs[0].dtype);
}

}  // namespace onnxtrain::ops
