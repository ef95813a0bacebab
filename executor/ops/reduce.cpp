// The plan-time part of the reductions, ArgMax/ArgMin, CumSum and TopK (reduce.h), shared by the CPU and CUDA
// kernels.
#include "executor/ops/reduce.h"

#include <algorithm>
#include <string>

#include "executor/ops/kernel_util.h"
#include "graph/error.h"

namespace onnxtrain::ops {
namespace {

// The reductions' and ArgMax/ArgMin's axis check. CumSum and TopK call the shared normalize_axis (rank >= 1).
int64_t reduce_axis(const PrepareContext& ctx, int64_t axis, int64_t rank, const char* what) {
  // A scalar accepts axis 0 (reducing it is the identity), as onnx's reference does.
  if (axis < -rank || axis >= std::max<int64_t>(rank, 1))
    ctx.fail(std::string(what) + " " + std::to_string(axis) + " is out of range for an input of rank " +
             std::to_string(rank));
  return axis < 0 ? axis + rank : axis;
}

AxisSplit split_at(const std::vector<int64_t>& shape, size_t axis) {
  AxisSplit s;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i < axis) s.outer *= shape[i];
    if (i > axis) s.inner *= shape[i];
  }
  s.n = shape[axis];
  return s;
}

}  // namespace

ReduceAxes prepare_reduce(PrepareContext& ctx, int64_t axes_input_since) {
  if (ctx.inputs.empty() || !ctx.inputs[0].present()) ctx.fail("input 0 (data) is required");
  const Node& node = ctx.node;
  const KernelInput& x = ctx.inputs.at(0);
  const int64_t rank = static_cast<int64_t>(x.shape.size());
  const bool keepdims = node.attr_int("keepdims", 1) != 0;
  const bool noop_if_empty = ctx.opset >= axes_input_since && node.attr_int("noop_with_empty_axes", 0) != 0;

  std::vector<int64_t> axes;
  if (ctx.opset >= axes_input_since) {
    if (ctx.inputs.size() > 1 && ctx.inputs[1].present()) axes = ints_of(ctx, ctx.constant_input(1), "axes");
  } else {
    axes = node.attr_ints("axes");
  }
  ReduceAxes r;
  r.reduced.assign(static_cast<size_t>(rank), false);
  if (axes.empty()) {
    if (noop_if_empty) r.identity = true;
    else std::fill(r.reduced.begin(), r.reduced.end(), true);
  }
  for (int64_t a : axes) {
    int64_t ax = reduce_axis(ctx, a, rank, "axis");
    if (rank == 0) continue;
    if (r.reduced[static_cast<size_t>(ax)]) ctx.fail("axis " + std::to_string(a) + " is repeated in axes");
    r.reduced[static_cast<size_t>(ax)] = true;
  }
  std::vector<int64_t> out_shape;
  for (int64_t i = 0; i < rank; ++i) {
    if (!r.reduced[static_cast<size_t>(i)]) out_shape.push_back(x.shape[static_cast<size_t>(i)]);
    else if (keepdims) out_shape.push_back(1);
  }
  if (r.identity) out_shape = x.shape;
  set_output(ctx, 0, x.dtype, out_shape);
  return r;
}

ArgAttrs prepare_arg(PrepareContext& ctx) {
  if (ctx.inputs.empty() || !ctx.inputs[0].present()) ctx.fail("input 0 (data) is required");
  const KernelInput& x = ctx.inputs[0];
  const int64_t rank = static_cast<int64_t>(x.shape.size());
  if (rank == 0) ctx.fail("input must have rank >= 1");
  const int64_t axis = reduce_axis(ctx, ctx.node.attr_int("axis", 0), rank, "axis");
  const bool keepdims = ctx.node.attr_int("keepdims", 1) != 0;
  ArgAttrs a;
  a.select_last = ctx.opset >= 12 && ctx.node.attr_int("select_last_index", 0) != 0;
  const int64_t n = x.shape[static_cast<size_t>(axis)];
  if (n == 0) ctx.fail("cannot take the arg-extremum over an empty axis " + std::to_string(axis));
  std::vector<int64_t> out_shape;
  for (int64_t i = 0; i < rank; ++i) {
    int64_t d = x.shape[static_cast<size_t>(i)];
    if (i != axis) out_shape.push_back(d);
    else if (keepdims) out_shape.push_back(1);
  }
  a.split = split_at(x.shape, static_cast<size_t>(axis));
  set_output(ctx, 0, DType::Int64, out_shape);
  return a;
}

CumSumAttrs prepare_cumsum(PrepareContext& ctx) {
  const KernelInput& x = required_input(ctx, 0, "x");
  required_input(ctx, 1, "axis");
  const std::vector<int64_t> axis_v = ints_of(ctx, ctx.constant_input(1), "axis");
  if (axis_v.size() != 1) ctx.fail("axis must hold one value, got " + std::to_string(axis_v.size()));
  const int64_t rank = static_cast<int64_t>(x.shape.size());
  if (rank == 0) ctx.fail("x must have rank >= 1");
  const auto axis = static_cast<size_t>(normalize_axis(ctx, axis_v[0], rank));
  CumSumAttrs a;
  a.split = split_at(x.shape, axis);
  a.exclusive = ctx.node.attr_int("exclusive", 0) != 0;
  a.reverse = ctx.node.attr_int("reverse", 0) != 0;
  set_output(ctx, 0, x.dtype, x.shape);
  return a;
}

TopKAttrs prepare_topk(PrepareContext& ctx) {
  const KernelInput& x = required_input(ctx, 0, "X");
  required_input(ctx, 1, "K");
  const std::vector<int64_t> kv = ints_of(ctx, ctx.constant_input(1), "K");
  if (kv.size() != 1) ctx.fail("K must hold one value");
  const int64_t rank = static_cast<int64_t>(x.shape.size());
  if (rank == 0) ctx.fail("X must have rank >= 1");
  const auto axis = static_cast<size_t>(normalize_axis(ctx, ctx.node.attr_int("axis", -1), rank));
  TopKAttrs a;
  a.k = kv[0];
  const int64_t n = x.shape[axis];
  if (a.k < 0 || a.k > n)
    ctx.fail("K = " + std::to_string(a.k) + " is out of range for an axis of size " + std::to_string(n));
  a.split = split_at(x.shape, axis);
  std::vector<int64_t> shape = x.shape;
  shape[axis] = a.k;
  set_output(ctx, 0, x.dtype, shape);
  if (ctx.outputs.size() > 1) set_output(ctx, 1, DType::Int64, shape);
  a.largest = ctx.opset < 11 || ctx.node.attr_int("largest", 1) != 0;
  return a;
}

}  // namespace onnxtrain::ops
