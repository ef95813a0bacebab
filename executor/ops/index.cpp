// The plan-time part of the element and ND gathers and scatters (index.h), shared by the CPU and CUDA kernels.
#include "executor/ops/index.h"

#include <algorithm>
#include <span>
#include <string>
#include <vector>

#include "executor/ops/kernel_util.h"
#include "graph/error.h"

namespace onnxtrain::ops {
namespace {

void expect_index_dtype(const PrepareContext& ctx, const KernelInput& idx, bool allow_int32) {
  if (idx.dtype == DType::Int64 || (allow_int32 && idx.dtype == DType::Int32)) return;
  ctx.fail("indices must be " + std::string(allow_int32 ? "int32 or int64" : "int64") + ", got " +
           dtype_name(idx.dtype));
}

IndexReduction reduction_of(const PrepareContext& ctx) {
  const std::string r = ctx.node.attr_string("reduction", "none");
  if (r == "none") return IndexReduction::None;
  if (ctx.opset >= 16 && r == "add") return IndexReduction::Add;
  if (ctx.opset >= 16 && r == "mul") return IndexReduction::Mul;
  if (ctx.opset >= 18 && r == "max") return IndexReduction::Max;
  if (ctx.opset >= 18 && r == "min") return IndexReduction::Min;
  ctx.fail("reduction '" + r + "' is not valid at opset " + std::to_string(ctx.opset) +
           " (none; add and mul from opset 16; max and min from 18)");
}

struct ScatterInputs {
  const KernelInput& data;
  const KernelInput& indices;
  const KernelInput& updates;
};

ScatterInputs scatter_inputs(const PrepareContext& ctx, bool allow_int32_indices) {
  const KernelInput& data = required_input(ctx, 0, "data");
  const KernelInput& indices = required_input(ctx, 1, "indices");
  const KernelInput& updates = required_input(ctx, 2, "updates");
  expect_index_dtype(ctx, indices, allow_int32_indices);
  if (updates.dtype != data.dtype)
    ctx.fail("updates must have data's dtype " + dtype_name(data.dtype) + ", got " + dtype_name(updates.dtype));
  return {data, indices, updates};
}

// Both element ops walk the indices tensor; the element at coordinate p pairs with data at p with p[axis]
// replaced by the index. Indices may be smaller than data along every axis. Returns the axis.
int64_t elements_axis(const PrepareContext& ctx, const KernelInput& data, const KernelInput& indices) {
  const auto r = static_cast<int64_t>(data.shape.size());
  if (r == 0) ctx.fail("data must have rank >= 1, got a scalar");
  if (indices.shape.size() != data.shape.size())
    ctx.fail("indices " + shape_string(indices.shape) + " must have data's rank " + std::to_string(r) + " (data " +
             shape_string(data.shape) + ")");
  const int64_t axis = normalize_axis(ctx, ctx.node.attr_int("axis", 0), r);
  for (int64_t d = 0; d < r; ++d)
    if (d != axis && indices.shape[d] > data.shape[d])
      ctx.fail("indices " + shape_string(indices.shape) + " is larger than data " + shape_string(data.shape) +
               " along axis " + std::to_string(d) + " (only the indexed axis " + std::to_string(axis) +
               " may differ freely)");
  return axis;
}

}  // namespace

ElementsAttrs prepare_gather_elements(PrepareContext& ctx) {
  const KernelInput& data = required_input(ctx, 0, "data");
  const KernelInput& indices = required_input(ctx, 1, "indices");
  expect_index_dtype(ctx, indices, true);
  elem_size(ctx, data.dtype);
  ElementsAttrs a;
  a.axis = elements_axis(ctx, data, indices);
  ctx.outputs.at(0) = {data.dtype, indices.shape};
  return a;
}

ElementsAttrs prepare_scatter_elements(PrepareContext& ctx) {
  const auto [data, indices, updates] = scatter_inputs(ctx, true);
  if (updates.shape != indices.shape)
    ctx.fail("updates " + shape_string(updates.shape) + " must have the shape of indices " +
             shape_string(indices.shape));
  ElementsAttrs a;
  a.axis = elements_axis(ctx, data, indices);
  a.reduction = reduction_of(ctx);
  ctx.outputs.at(0) = {data.dtype, data.shape};
  return a;
}

NdAttrs prepare_gather_nd(PrepareContext& ctx) {
  const KernelInput& data = required_input(ctx, 0, "data");
  const KernelInput& indices = required_input(ctx, 1, "indices");
  expect_index_dtype(ctx, indices, false);
  elem_size(ctx, data.dtype);
  const auto r = static_cast<int64_t>(data.shape.size());
  const auto q = static_cast<int64_t>(indices.shape.size());
  const int64_t b = ctx.node.attr_int("batch_dims", 0);
  if (r < 1 || q < 1) ctx.fail("data and indices must have rank >= 1");
  if (b < 0 || b >= std::min(r, q))
    ctx.fail("batch_dims " + std::to_string(b) + " must be in [0, min(rank(data), rank(indices)))");
  for (int64_t d = 0; d < b; ++d)
    if (data.shape[d] != indices.shape[d])
      ctx.fail("the first batch_dims dims of data " + shape_string(data.shape) + " and indices " +
               shape_string(indices.shape) + " must be equal");
  const int64_t k = indices.shape.back();
  if (k < 1 || b + k > r)
    ctx.fail("the last dim of indices is " + std::to_string(k) + "; it must be in [1, rank(data) - batch_dims] = [1, " +
             std::to_string(r - b) + "]");
  std::vector<int64_t> out_shape(indices.shape.begin(), indices.shape.end() - 1);
  out_shape.insert(out_shape.end(), data.shape.begin() + b + k, data.shape.end());
  ctx.outputs.at(0) = {data.dtype, out_shape};
  const std::span<const int64_t> ishape(indices.shape);
  NdAttrs a;
  a.batch_dims = b;
  a.k = k;
  a.batches = numel_of(ishape.first(static_cast<size_t>(b)));
  a.tuples = numel_of(ishape.subspan(static_cast<size_t>(b), static_cast<size_t>(q - b - 1)));
  a.slice = numel_of(std::span<const int64_t>(data.shape).subspan(static_cast<size_t>(b + k)));
  return a;
}

NdAttrs prepare_scatter_nd(PrepareContext& ctx) {
  const auto [data, indices, updates] = scatter_inputs(ctx, false);
  const auto r = static_cast<int64_t>(data.shape.size());
  if (indices.shape.empty()) ctx.fail("indices must have rank >= 1, got a scalar");
  const int64_t k = indices.shape.back();
  if (k > r)
    ctx.fail("the last dim of indices " + shape_string(indices.shape) + " is " + std::to_string(k) +
             ", more than data's rank " + std::to_string(r));
  std::vector<int64_t> expected(indices.shape.begin(), indices.shape.end() - 1);
  expected.insert(expected.end(), data.shape.begin() + k, data.shape.end());
  if (updates.shape != expected)
    ctx.fail("updates must have shape " + shape_string(expected) + " (indices.shape[:-1] + data.shape[" +
             std::to_string(k) + ":]), got " + shape_string(updates.shape));
  NdAttrs a;
  a.reduction = reduction_of(ctx);
  ctx.outputs.at(0) = {data.dtype, data.shape};
  a.k = k;
  a.tuples = numel_of(std::span<const int64_t>(indices.shape).first(indices.shape.size() - 1));
  a.slice = numel_of(std::span<const int64_t>(data.shape).subspan(static_cast<size_t>(k)));
  return a;
}

}  // namespace onnxtrain::ops
