// The plan-time part of the views and Gather (shape.h), shared by the CPU and CUDA kernels.
#include "executor/ops/shape.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "executor/ops/kernel_util.h"
#include "executor/plan_fusion.h"
#include "graph/error.h"

namespace onnxtrain::ops {
namespace {

std::vector<int64_t> constant_ints(const PrepareContext& ctx, size_t i, const std::string& what) {
  return ints_of(ctx, ctx.constant_input(i), what);
}

// The reshape-like ops' output: input 0's bytes with another shape of as many elements.
void reshape_to(PrepareContext& ctx, std::vector<int64_t> shape) {
  const KernelInput& x = required_input(ctx, 0, "data");
  elem_size(ctx, x.dtype);
  if (numel_of(shape) != numel_of(x.shape))
    ctx.fail("cannot reshape " + shape_string(x.shape) + " into " + shape_string(shape));
  set_output(ctx, 0, x.dtype, std::move(shape));
}

std::vector<int64_t> axes_arg(const PrepareContext& ctx, int64_t input_since) {
  if (ctx.opset >= input_since) return has_input(ctx, 1) ? constant_ints(ctx, 1, "axes") : std::vector<int64_t>{};
  return ctx.node.attr_ints("axes");
}

// A plan-time value as output 0.
Tensor constant_output(PrepareContext& ctx, Tensor value) {
  set_output(ctx, 0, value.dtype, value.shape);
  return value;
}

template <class T> Tensor range_values(const PrepareContext& ctx) {
  auto scalar = [&](size_t i, const char* name) {
    required_input(ctx, i, name);
    const Tensor& t = ctx.constant_input(i);
    if (t.numel() != 1) ctx.fail(std::string(name) + " must be a scalar, got " + t.describe());
    return t.ptr<T>()[0];
  };
  const T start = scalar(0, "start"), limit = scalar(1, "limit"), delta = scalar(2, "delta");
  if (delta == T(0)) ctx.fail("delta must not be 0");
  const double count = std::ceil((static_cast<double>(limit) - static_cast<double>(start)) / static_cast<double>(delta));
  const int64_t n = std::max<int64_t>(0, static_cast<int64_t>(count));
  Tensor t = Tensor::empty(dtype_of<T>(), {n});
  T* p = t.ptr<T>();
  for (int64_t i = 0; i < n; ++i) p[i] = static_cast<T>(start + static_cast<T>(i) * delta);
  return t;
}

}  // namespace

void prepare_reshape(PrepareContext& ctx) {
  const KernelInput& x = required_input(ctx, 0, "data");
  required_input(ctx, 1, "shape");
  std::vector<int64_t> shape = constant_ints(ctx, 1, "shape");
  const bool allowzero = ctx.opset >= 14 && ctx.node.attr_int("allowzero", 0) != 0;
  int64_t infer = -1, known = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 0 && !allowzero) {
      if (i >= x.shape.size())
        ctx.fail("shape[" + std::to_string(i) + "] is 0 (copy the input dim) but the input " +
                 shape_string(x.shape) + " has no dim " + std::to_string(i));
      shape[i] = x.shape[i];
    }
    if (shape[i] == -1) {
      if (infer >= 0) ctx.fail("shape " + shape_string(shape) + " has more than one -1");
      infer = static_cast<int64_t>(i);
    } else if (shape[i] < 0) {
      ctx.fail("shape " + shape_string(shape) + " has a negative dim other than -1");
    } else {
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    const int64_t total = numel_of(x.shape);
    if (known == 0 || total % known != 0)
      ctx.fail("cannot infer the -1 dim reshaping " + shape_string(x.shape) + " into " + shape_string(shape));
    shape[static_cast<size_t>(infer)] = total / known;
  }
  reshape_to(ctx, std::move(shape));
}

void prepare_flatten(PrepareContext& ctx) {
  const KernelInput& x = required_input(ctx, 0, "input");
  const int64_t rank = static_cast<int64_t>(x.shape.size());
  int64_t axis = ctx.node.attr_int("axis", 1);
  if (axis < -rank || axis > rank)
    ctx.fail("axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(rank));
  if (axis < 0) axis += rank;
  int64_t a = 1, b = 1;
  for (int64_t i = 0; i < rank; ++i) (i < axis ? a : b) *= x.shape[static_cast<size_t>(i)];
  reshape_to(ctx, {a, b});
}

void prepare_squeeze(PrepareContext& ctx) {
  const KernelInput& x = required_input(ctx, 0, "data");
  const int64_t rank = static_cast<int64_t>(x.shape.size());
  std::vector<int64_t> axes = axes_arg(ctx, 13);
  std::vector<bool> drop(x.shape.size(), false);
  if (axes.empty()) {
    for (size_t i = 0; i < x.shape.size(); ++i) drop[i] = x.shape[i] == 1;
  }
  for (int64_t a : axes) {
    const size_t ax = static_cast<size_t>(normalize_axis(ctx, a, rank));
    if (x.shape[ax] != 1)
      ctx.fail("cannot squeeze axis " + std::to_string(a) + " of " + shape_string(x.shape) + ": its size is not 1");
    drop[ax] = true;
  }
  std::vector<int64_t> shape;
  for (size_t i = 0; i < x.shape.size(); ++i)
    if (!drop[i]) shape.push_back(x.shape[i]);
  reshape_to(ctx, std::move(shape));
}

void prepare_unsqueeze(PrepareContext& ctx) {
  const KernelInput& x = required_input(ctx, 0, "data");
  std::vector<int64_t> axes = axes_arg(ctx, 13);
  if (axes.empty()) ctx.fail("axes must not be empty");
  const int64_t out_rank = static_cast<int64_t>(x.shape.size() + axes.size());
  std::vector<bool> inserted(static_cast<size_t>(out_rank), false);
  for (int64_t a : axes) {
    const size_t ax = static_cast<size_t>(normalize_axis(ctx, a, out_rank));
    if (inserted[ax]) ctx.fail("axis " + std::to_string(a) + " is repeated in axes");
    inserted[ax] = true;
  }
  std::vector<int64_t> shape;
  size_t j = 0;
  for (size_t i = 0; i < inserted.size(); ++i) shape.push_back(inserted[i] ? 1 : x.shape[j++]);
  reshape_to(ctx, std::move(shape));
}

GatherGeometry prepare_gather(PrepareContext& ctx) {
  const KernelInput& x = required_input(ctx, 0, "data");
  const KernelInput& ind = required_input(ctx, 1, "indices");
  elem_size(ctx, x.dtype);
  const int64_t rank = static_cast<int64_t>(x.shape.size());
  if (rank == 0) ctx.fail("data must have rank >= 1");
  const size_t axis = static_cast<size_t>(normalize_axis(ctx, ctx.node.attr_int("axis", 0), rank));
  GatherGeometry g;
  std::vector<int64_t> shape;
  for (size_t i = 0; i < x.shape.size(); ++i) {
    if (i < axis) g.outer *= x.shape[i];
    if (i > axis) g.inner *= x.shape[i];
    if (i == axis) shape.insert(shape.end(), ind.shape.begin(), ind.shape.end());
    else shape.push_back(x.shape[i]);
  }
  g.n = x.shape[axis];
  set_output(ctx, 0, x.dtype, shape);
  if (ind.dtype != DType::Int64 && ind.dtype != DType::Int32)
    ctx.fail("indices must be int64 or int32, got " + dtype_name(ind.dtype));
  return g;
}

Tensor prepare_shape(PrepareContext& ctx) {
  const KernelInput& x = required_input(ctx, 0, "data");
  const int64_t rank = static_cast<int64_t>(x.shape.size());
  int64_t start = 0, end = rank;
  if (ctx.opset >= 15) {
    start = ctx.node.attr_int("start", 0);
    end = ctx.node.attr_int("end", rank);
  }
  auto clamp = [rank](int64_t v) { return std::clamp(v < 0 ? v + rank : v, int64_t{0}, rank); };
  start = clamp(start);
  end = std::max(clamp(end), start);
  std::vector<int64_t> shape = x.shape;
  if (ctx.node.has_attr(kShapePerm)) {
    // A Transpose folded away at plan time (executor/plan_fusion.h): the shape it would have had.
    const std::vector<int64_t> perm = ctx.node.attr_ints(kShapePerm);
    if (static_cast<int64_t>(perm.size()) != rank) ctx.fail(std::string(kShapePerm) + " does not match the input's rank");
    for (size_t k = 0; k < perm.size(); ++k) {
      if (perm[k] < 0 || perm[k] >= rank) ctx.fail(std::string(kShapePerm) + " is not a permutation");
      shape[k] = x.shape[static_cast<size_t>(perm[k])];
    }
  }
  std::vector<int64_t> dims(shape.begin() + start, shape.begin() + end);
  return constant_output(ctx, Tensor::from_vector<int64_t>({static_cast<int64_t>(dims.size())}, dims));
}

Tensor prepare_size(PrepareContext& ctx) {
  const KernelInput& x = required_input(ctx, 0, "data");
  return constant_output(ctx, Tensor::from_vector<int64_t>({}, {numel_of(x.shape)}));
}

Tensor prepare_constant(PrepareContext& ctx) {
  const Node& n = ctx.node;
  for (const char* unsupported : {"sparse_value", "value_string", "value_strings"})
    if (n.has_attr(unsupported)) ctx.fail(std::string("attribute '") + unsupported + "' is not supported");
  if (const TensorData* t = n.attr_tensor("value")) return constant_output(ctx, Tensor::from_data(*t));
  if (n.has_attr("value_float")) return constant_output(ctx, Tensor::from_vector<float>({}, {n.attr_float("value_float", 0)}));
  if (n.has_attr("value_int")) return constant_output(ctx, Tensor::from_vector<int64_t>({}, {n.attr_int("value_int", 0)}));
  if (n.has_attr("value_ints")) {
    std::vector<int64_t> v = n.attr_ints("value_ints");
    return constant_output(ctx, Tensor::from_vector<int64_t>({static_cast<int64_t>(v.size())}, v));
  }
  if (auto it = n.attributes.find("value_floats"); it != n.attributes.end()) {
    const auto* v = std::get_if<std::vector<float>>(&it->second);
    if (!v) ctx.fail("attribute 'value_floats' must be a list of floats");
    return constant_output(ctx, Tensor::from_vector<float>({static_cast<int64_t>(v->size())}, *v));
  }
  ctx.fail("needs one of the attributes value, value_float(s) or value_int(s)");
}

TensorData prepare_constant_of_shape(PrepareContext& ctx) {
  required_input(ctx, 0, "input");
  std::vector<int64_t> shape = constant_ints(ctx, 0, "input (the output shape)");
  for (int64_t d : shape)
    if (d < 0) ctx.fail("output shape " + shape_string(shape) + " has a negative dim");
  TensorData value = TensorData::scalar<float>(0.0f);
  if (const TensorData* t = ctx.node.attr_tensor("value")) {
    if (t->numel() != 1) ctx.fail("attribute 'value' must hold exactly one element");
    value = *t;
  }
  elem_size(ctx, value.dtype);
  set_output(ctx, 0, value.dtype, shape);
  return value;
}

Tensor prepare_range(PrepareContext& ctx) {
  const KernelInput& s = required_input(ctx, 0, "start");
  for (size_t i = 1; i < 3; ++i)
    if (has_input(ctx, i) && ctx.inputs[i].dtype != s.dtype) ctx.fail("start, limit and delta must share a type");
  switch (s.dtype) {
    case DType::Float32: return constant_output(ctx, range_values<float>(ctx));
    case DType::Float64: return constant_output(ctx, range_values<double>(ctx));
    case DType::Int32: return constant_output(ctx, range_values<int32_t>(ctx));
    case DType::Int64: return constant_output(ctx, range_values<int64_t>(ctx));
    default: ctx.fail("type " + dtype_name(s.dtype) + " is not supported");
  }
}

}  // namespace onnxtrain::ops
