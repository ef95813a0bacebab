// The plan-time part of GatherGrad and SumToShape (gather_grad.h), shared by the CPU and CUDA kernels.
#include "executor/ops/gather_grad.h"

#include <string>

#include "executor/ops/kernel_util.h"
#include "graph/error.h"

namespace onnxtrain::ops {
namespace {

std::string dims_text(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// The target shape input: int64 or int32, known at plan time (Shape of a tensor, folded), no negative dims.
std::vector<int64_t> target_shape(const PrepareContext& ctx, size_t i) {
  const KernelInput& s = required_input(ctx, i, "shape");
  if (s.shape.size() != 1) ctx.fail("input " + std::to_string(i) + " (shape) must be 1-D, got rank " +
                                    std::to_string(s.shape.size()));
  std::vector<int64_t> v = ints_of(ctx, ctx.constant_input(i), "input " + std::to_string(i) + " (shape)");
  for (int64_t d : v)
    if (d < 0) ctx.fail("input " + std::to_string(i) + " (shape) " + dims_text(v) + " has a negative dim");
  return v;
}

}  // namespace

GatherGradGeometry prepare_gather_grad(PrepareContext& ctx) {
  const KernelInput& dy = required_input(ctx, 0, "dY");
  const KernelInput& ind = required_input(ctx, 1, "indices");
  const std::vector<int64_t> shape = target_shape(ctx, 2);
  // Required (not defaulted to 0): the function body reads it by reference and has no default to fall back on.
  if (!ctx.node.has_attr("axis")) ctx.fail("attribute 'axis' (Gather's axis) is required");
  const auto rank = static_cast<int64_t>(shape.size());
  if (rank == 0) ctx.fail("the data shape must have rank >= 1 (Gather's data), got a scalar");
  const int64_t axis = normalize_axis(ctx, ctx.node.attr_int("axis", 0), rank);
  GatherGradGeometry g;
  std::vector<int64_t> expect;  // Gather's output shape: shape[:axis] + indices.shape + shape[axis+1:]
  for (int64_t i = 0; i < rank; ++i) {
    if (i < axis) g.outer *= shape[i];
    if (i > axis) g.inner *= shape[i];
    if (i == axis) expect.insert(expect.end(), ind.shape.begin(), ind.shape.end());
    else expect.push_back(shape[i]);
  }
  for (int64_t d : ind.shape) g.m *= d;
  if (dy.shape != expect)
    ctx.fail("dY has shape " + dims_text(dy.shape) + ", but Gather of data " + dims_text(shape) + " with indices " +
             dims_text(ind.shape) + " along axis " + std::to_string(axis) + " gives " + dims_text(expect));
  g.n = shape[axis];
  set_output(ctx, 0, dy.dtype, shape);
  if (ind.dtype != DType::Int64 && ind.dtype != DType::Int32)
    ctx.fail("unsupported types: dY " + dtype_name(dy.dtype) + " (float32, float64), indices " +
             dtype_name(ind.dtype) + " (int32, int64)");
  return g;
}

SumToShapeAxes prepare_sum_to_shape(PrepareContext& ctx) {
  const KernelInput& dy = required_input(ctx, 0, "dY");
  const std::vector<int64_t> shape = target_shape(ctx, 1);
  const size_t r = dy.shape.size();
  auto mismatch = [&] {
    ctx.fail("the target shape " + dims_text(shape) + " does not broadcast to dY's shape " + dims_text(dy.shape));
  };
  if (shape.size() > r) mismatch();
  const size_t lead = r - shape.size();
  SumToShapeAxes s;
  for (size_t a = 0; a < r; ++a) {
    const bool reduce = a < lead || (shape[a - lead] == 1 && dy.shape[a] != 1);
    if (!reduce && dy.shape[a] != shape[a - lead]) mismatch();
    if (reduce) s.axes.push_back(static_cast<int64_t>(a));
    s.kept.push_back(reduce ? 1 : dy.shape[a]);
  }
  set_output(ctx, 0, dy.dtype, shape);
  return s;
}

}  // namespace onnxtrain::ops
