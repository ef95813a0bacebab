// Standard-ONNX bodies of onnxtrain.GatherGrad and onnxtrain.SumToShape (native kernels:
// executor/cpu/gather_grad.cpp). Both work out their shapes at run time from their shape input, so one body
// serves every rank, axis and dtype.
#include <limits>

#include "gradients/fused.h"

namespace onnxtrain {

namespace {

// Appends nodes to a body, each named after its single output.
struct Body {
  Function& f;
  const std::string& add(const std::string& out, const std::string& type, std::vector<std::string> in,
                         std::map<std::string, Attribute> attrs = {}) {
    Node n;
    n.name = out;
    n.op_type = type;
    n.inputs = std::move(in);
    n.outputs = {out};
    n.attributes = std::move(attrs);
    f.nodes.push_back(std::move(n));
    return f.nodes.back().outputs[0];
  }
  void ints(const std::string& out, std::vector<int64_t> v) { add(out, "Constant", {}, {{"value_ints", std::move(v)}}); }
  void scalar(const std::string& out, int64_t v) { add(out, "Constant", {}, {{"value_int", v}}); }
};

Function make(const std::string& name, std::vector<std::string> inputs, const std::string& doc) {
  Function f;
  f.name = name;
  f.domain = kFusedGradDomain;
  f.inputs = std::move(inputs);
  f.outputs = {"dX"};
  f.opset_imports = {{"", 17}};
  f.doc = doc;
  return f;
}

Function gather_grad() {
  Function f = make("GatherGrad", {"dY", "indices", "shape"},
                    "Gradient of Gather (axis attribute) with respect to its data, whose shape is `shape`: dY "
                    "added into zeros at the gathered positions (repeated indices accumulate; negative ones "
                    "count from the end). Viewing data as [outer, n, inner], it is ScatterElements(axis=1, "
                    "reduction='add') of dY as [outer, m, inner] with the indices broadcast over outer and "
                    "inner, which is exact: only additions of dY's values. Needs opset 16.");
  f.attributes = {"axis"};
  Body b{f};
  // The axis comes in by reference; normalised at run time against the rank of `shape`.
  Node axis;
  axis.name = "axis";
  axis.outputs = {"axis"};
  axis.op_type = "Constant";
  constexpr int32_t kInt = 2;  // AttributeProto.INT
  axis.attribute_refs["value_int"] = {"axis", kInt};
  f.nodes.push_back(std::move(axis));
  b.ints("one", {1});
  b.ints("zero", {0});
  b.ints("flat", {-1});
  b.ints("end", {std::numeric_limits<int64_t>::max()});
  b.add("rank", "Size", {"shape"});
  b.add("axis_plus_rank", "Add", {"axis", "rank"});
  b.add("axis_scalar", "Mod", {"axis_plus_rank", "rank"});
  b.add("at", "Reshape", {"axis_scalar", "one"});
  b.add("after", "Add", {"at", "one"});
  // [outer, n, inner] from shape; ReduceProd over a leading 1 so that empty slices give 1.
  b.add("n", "Slice", {"shape", "at", "after"});
  b.add("lead", "Slice", {"shape", "zero", "at"});
  b.add("trail", "Slice", {"shape", "after", "end"});
  b.add("one_lead", "Concat", {"one", "lead"}, {{"axis", int64_t{0}}});
  b.add("one_trail", "Concat", {"one", "trail"}, {{"axis", int64_t{0}}});
  b.add("outer", "ReduceProd", {"one_lead"}, {{"keepdims", int64_t{1}}});
  b.add("inner", "ReduceProd", {"one_trail"}, {{"keepdims", int64_t{1}}});
  b.add("m_scalar", "Size", {"indices"});
  b.add("m", "Reshape", {"m_scalar", "one"});
  b.add("data_3d", "Concat", {"outer", "n", "inner"}, {{"axis", int64_t{0}}});
  b.add("updates_3d", "Concat", {"outer", "m", "inner"}, {{"axis", int64_t{0}}});
  b.add("index_3d", "Concat", {"one", "m", "one"}, {{"axis", int64_t{0}}});
  // allowzero: a 0 in these shapes is an empty dim, not "copy the input's".
  const std::map<std::string, Attribute> allowzero{{"allowzero", int64_t{1}}};
  b.add("dy_3d", "Reshape", {"dY", "updates_3d"}, allowzero);
  // Negative indices count from the end of the axis.
  b.add("idx_flat", "Reshape", {"indices", "flat"});
  b.add("n_idx", "CastLike", {"n", "indices"});
  b.add("zero_idx", "CastLike", {"zero", "indices"});
  b.add("negative", "Less", {"idx_flat", "zero_idx"});
  b.add("wrapped", "Add", {"idx_flat", "n_idx"});
  b.add("idx_pos", "Where", {"negative", "wrapped", "idx_flat"});
  b.add("idx_column", "Reshape", {"idx_pos", "index_3d"}, allowzero);
  b.add("idx_3d", "Expand", {"idx_column", "updates_3d"});
  b.add("zero_d", "Constant", {}, {{"value", TensorData::scalar<double>(0.0)}});
  b.add("zero_dy", "CastLike", {"zero_d", "dY"});
  b.add("zeros", "Expand", {"zero_dy", "data_3d"});
  b.add("scattered", "ScatterElements", {"zeros", "idx_3d", "dy_3d"},
        {{"axis", int64_t{1}}, {"reduction", std::string("add")}});
  b.add("dX", "Reshape", {"scattered", "shape"}, allowzero);
  return f;
}

Function sum_to_shape() {
  Function f = make("SumToShape", {"dY", "shape"},
                    "dY summed back to `shape` after numpy broadcasting: over its leading axes and over the axes "
                    "where `shape` has 1. For gradients whose broadcast is known only at run time (symbolic dims). "
                    "The axes to sum are picked from the shapes with CumSum and a comparison table, so the body "
                    "needs no Compress or NonZero; valid from opset 13.");
  Body b{f};
  b.ints("one", {1});
  b.ints("zero", {0});
  b.scalar("zero_s", 0);
  b.scalar("one_s", 1);
  b.add("dy_shape", "Shape", {"dY"});
  b.add("dy_rank", "Size", {"dy_shape"});
  b.add("rank", "Size", {"shape"});
  b.add("lead", "Sub", {"dy_rank", "rank"});
  b.add("lead_1", "Reshape", {"lead", "one"});
  b.add("ones", "ConstantOfShape", {"lead_1"},
        {{"value", TensorData::from<int64_t>({1}, std::span<const int64_t>(std::vector<int64_t>{1}))}});
  // The target with dY's rank: the axes to sum are those where it is 1 (summing a dY axis of size 1 is a copy).
  b.add("padded", "Concat", {"ones", "shape"}, {{"axis", int64_t{0}}});
  b.add("is_one_b", "Equal", {"padded", "one"});
  b.add("is_one", "Cast", {"is_one_b"}, {{"to", int64_t{static_cast<int64_t>(DType::Int64)}}});
  // axes[k] = the position of the (k+1)-th 1 = how many positions have fewer than k+1 ones up to them.
  b.add("ones_upto", "CumSum", {"is_one", "zero_s"});
  b.add("count", "ReduceSum", {"is_one"}, {{"keepdims", int64_t{0}}});
  b.add("k", "Range", {"zero_s", "count", "one_s"});
  b.add("k_plus_1", "Add", {"k", "one_s"});
  b.add("upto_column", "Unsqueeze", {"ones_upto", "one"});
  b.add("k_row", "Unsqueeze", {"k_plus_1", "zero"});
  b.add("before_b", "Less", {"upto_column", "k_row"});
  b.add("before", "Cast", {"before_b"}, {{"to", int64_t{static_cast<int64_t>(DType::Int64)}}});
  b.add("axes", "ReduceSum", {"before", "zero"}, {{"keepdims", int64_t{0}}});
  // noop_with_empty_axes: nothing broadcast means nothing to sum (empty axes would otherwise sum them all).
  b.add("summed", "ReduceSum", {"dY", "axes"}, {{"keepdims", int64_t{1}}, {"noop_with_empty_axes", int64_t{1}}});
  b.add("lead_axes", "Range", {"zero_s", "lead", "one_s"});
  b.add("dX", "ReduceSum", {"summed", "lead_axes"}, {{"keepdims", int64_t{0}}, {"noop_with_empty_axes", int64_t{1}}});
  return f;
}

}  // namespace

void add_gather_grad_functions(std::vector<Function>& out) {
  out.push_back(gather_grad());
  out.push_back(sum_to_shape());
}

}  // namespace onnxtrain
