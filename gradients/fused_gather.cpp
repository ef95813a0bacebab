// Standard-ONNX bodies of onnxtrain.GatherGrad and onnxtrain.SumToShape (native kernels:
// executor/cpu/gather_grad.cpp). Both work out their shapes at run time from their shape input, so one body
// serves every rank, axis and dtype.
#include <limits>

#include "gradients/fused_body.h"

namespace onnxtrain {

namespace {

using fused_body::add;
using fused_body::int64s;

Function gather_grad() {
  Function f = fused_body::function(
      "GatherGrad", {"dY", "indices", "shape"}, {"dX"},
      "Gradient of Gather (axis attribute) with respect to its data, whose shape is `shape`: dY "
      "added into zeros at the gathered positions (repeated indices accumulate; negative ones "
      "count from the end). Viewing data as [outer, n, inner], it is ScatterElements(axis=1, "
      "reduction='add') of dY as [outer, m, inner] with the indices broadcast over outer and "
      "inner, which is exact: only additions of dY's values. Needs opset 16.",
      {"axis"});
  // The axis comes in by reference; normalised at run time against the rank of `shape`.
  fused_body::caller_attribute(f, "axis", "axis", fused_body::kInt);
  int64s(f, "one", {1});
  int64s(f, "zero", {0});
  int64s(f, "flat", {-1});
  int64s(f, "end", {std::numeric_limits<int64_t>::max()});
  add(f, "Size", {"shape"}, "rank");
  add(f, "Add", {"axis", "rank"}, "axis_plus_rank");
  add(f, "Mod", {"axis_plus_rank", "rank"}, "axis_scalar");
  add(f, "Reshape", {"axis_scalar", "one"}, "at");
  add(f, "Add", {"at", "one"}, "after");
  // [outer, n, inner] from shape; ReduceProd over a leading 1 so that empty slices give 1.
  add(f, "Slice", {"shape", "at", "after"}, "n");
  add(f, "Slice", {"shape", "zero", "at"}, "lead");
  add(f, "Slice", {"shape", "after", "end"}, "trail");
  add(f, "Concat", {"one", "lead"}, "one_lead", {{"axis", int64_t{0}}});
  add(f, "Concat", {"one", "trail"}, "one_trail", {{"axis", int64_t{0}}});
  add(f, "ReduceProd", {"one_lead"}, "outer", {{"keepdims", int64_t{1}}});
  add(f, "ReduceProd", {"one_trail"}, "inner", {{"keepdims", int64_t{1}}});
  add(f, "Size", {"indices"}, "m_scalar");
  add(f, "Reshape", {"m_scalar", "one"}, "m");
  add(f, "Concat", {"outer", "n", "inner"}, "data_3d", {{"axis", int64_t{0}}});
  add(f, "Concat", {"outer", "m", "inner"}, "updates_3d", {{"axis", int64_t{0}}});
  add(f, "Concat", {"one", "m", "one"}, "index_3d", {{"axis", int64_t{0}}});
  // allowzero: a 0 in these shapes is an empty dim, not "copy the input's".
  const std::map<std::string, Attribute> allowzero{{"allowzero", int64_t{1}}};
  add(f, "Reshape", {"dY", "updates_3d"}, "dy_3d", allowzero);
  // Negative indices count from the end of the axis.
  add(f, "Reshape", {"indices", "flat"}, "idx_flat");
  add(f, "CastLike", {"n", "indices"}, "n_idx");
  add(f, "CastLike", {"zero", "indices"}, "zero_idx");
  add(f, "Less", {"idx_flat", "zero_idx"}, "negative");
  add(f, "Add", {"idx_flat", "n_idx"}, "wrapped");
  add(f, "Where", {"negative", "wrapped", "idx_flat"}, "idx_pos");
  add(f, "Reshape", {"idx_pos", "index_3d"}, "idx_column", allowzero);
  add(f, "Expand", {"idx_column", "updates_3d"}, "idx_3d");
  add(f, "Constant", {}, "zero_d", {{"value", TensorData::scalar<double>(0.0)}});
  add(f, "CastLike", {"zero_d", "dY"}, "zero_dy");
  add(f, "Expand", {"zero_dy", "data_3d"}, "zeros");
  add(f, "ScatterElements", {"zeros", "idx_3d", "dy_3d"}, "scattered",
      {{"axis", int64_t{1}}, {"reduction", std::string("add")}});
  add(f, "Reshape", {"scattered", "shape"}, "dX", allowzero);
  return f;
}

Function sum_to_shape() {
  Function f = fused_body::function(
      "SumToShape", {"dY", "shape"}, {"dX"},
      "dY summed back to `shape` after numpy broadcasting: over its leading axes and over the axes "
      "where `shape` has 1. For gradients whose broadcast is known only at run time (symbolic dims). "
      "The axes to sum are picked from the shapes with CumSum and a comparison table, so the body "
      "needs no Compress or NonZero; valid from opset 13.");
  int64s(f, "one", {1});
  int64s(f, "zero", {0});
  add(f, "Constant", {}, "zero_s", {{"value_int", int64_t{0}}});
  add(f, "Constant", {}, "one_s", {{"value_int", int64_t{1}}});
  add(f, "Shape", {"dY"}, "dy_shape");
  add(f, "Size", {"dy_shape"}, "dy_rank");
  add(f, "Size", {"shape"}, "rank");
  add(f, "Sub", {"dy_rank", "rank"}, "lead");
  add(f, "Reshape", {"lead", "one"}, "lead_1");
  add(f, "ConstantOfShape", {"lead_1"}, "ones",
      {{"value", TensorData::from<int64_t>({1}, std::span<const int64_t>(std::vector<int64_t>{1}))}});
  // The target with dY's rank: the axes to sum are those where it is 1 (summing a dY axis of size 1 is a copy).
  add(f, "Concat", {"ones", "shape"}, "padded", {{"axis", int64_t{0}}});
  add(f, "Equal", {"padded", "one"}, "is_one_b");
  add(f, "Cast", {"is_one_b"}, "is_one", {{"to", int64_t{static_cast<int64_t>(DType::Int64)}}});
  // axes[k] = the position of the (k+1)-th 1 = how many positions have fewer than k+1 ones up to them.
  add(f, "CumSum", {"is_one", "zero_s"}, "ones_upto");
  add(f, "ReduceSum", {"is_one"}, "count", {{"keepdims", int64_t{0}}});
  add(f, "Range", {"zero_s", "count", "one_s"}, "k");
  add(f, "Add", {"k", "one_s"}, "k_plus_1");
  add(f, "Unsqueeze", {"ones_upto", "one"}, "upto_column");
  add(f, "Unsqueeze", {"k_plus_1", "zero"}, "k_row");
  add(f, "Less", {"upto_column", "k_row"}, "before_b");
  add(f, "Cast", {"before_b"}, "before", {{"to", int64_t{static_cast<int64_t>(DType::Int64)}}});
  add(f, "ReduceSum", {"before", "zero"}, "axes", {{"keepdims", int64_t{0}}});
  // noop_with_empty_axes: nothing broadcast means nothing to sum (empty axes would otherwise sum them all).
  add(f, "ReduceSum", {"dY", "axes"}, "summed", {{"keepdims", int64_t{1}}, {"noop_with_empty_axes", int64_t{1}}});
  add(f, "Range", {"zero_s", "lead", "one_s"}, "lead_axes");
  add(f, "ReduceSum", {"summed", "lead_axes"}, "dX", {{"keepdims", int64_t{0}}, {"noop_with_empty_axes", int64_t{1}}});
  return f;
}

}  // namespace

void add_gather_grad_functions(std::vector<Function>& out) {
  out.push_back(gather_grad());
  out.push_back(sum_to_shape());
}

}  // namespace onnxtrain
