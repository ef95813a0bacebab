// The plan-time part of the shape family's ops (shape.h), shared by the CPU and CUDA kernels: the views, Gather,
// the plan-time values, and the data-movement ops' geometry and gather maps.
#include "executor/ops/shape.h"

#include <algorithm>
#include <cmath>
#include <cstring>
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

// The strided ops' view. The CPU's StridedCopy walks at most 16 dims (an odometer on the stack); both backends
// refuse the same nodes.
StridedView strided(const PrepareContext& ctx, std::vector<int64_t> dims, std::vector<int64_t> strides, int64_t base) {
  if (dims.size() > 16) ctx.fail("tensors of rank above 16 are not supported");
  return {std::move(dims), std::move(strides), base};
}

// `view` (contiguous) transposed by perm: DepthToSpace and SpaceToDepth.
StridedView permute_view(const std::vector<int64_t>& view, const std::vector<int64_t>& perm) {
  const std::vector<int64_t> st = contiguous_strides(view);
  StridedView v;
  for (int64_t p : perm) {
    v.dims.push_back(view[static_cast<size_t>(p)]);
    v.strides.push_back(st[static_cast<size_t>(p)]);
  }
  return v;
}

int64_t blocksize(const PrepareContext& ctx) {
  if (!ctx.node.has_attr("blocksize")) ctx.fail("attribute 'blocksize' is required");
  const int64_t b = ctx.node.attr_int("blocksize", 0);
  if (b < 1) ctx.fail("blocksize must be positive, got " + std::to_string(b));
  return b;
}

// The maps of an op with one data input (input 0) and no fill input.
GatherMaps one_source(const PrepareContext& ctx, std::vector<std::vector<int64_t>> maps) {
  return {std::move(maps), {0}, {0}, numel_of(ctx.inputs[0].shape), -1};
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

// ---------------------------------------------------------------------------------------------------------
// Data movement: checks, outputs and geometry (moved from the CPU factories, cpu/shape.cpp).

StridedView prepare_transpose(PrepareContext& ctx) {
  const KernelInput& x = required_input(ctx, 0, "data");
  elem_size(ctx, x.dtype);
  const size_t rank = x.shape.size();
  std::vector<int64_t> perm = ctx.node.attr_ints("perm");
  if (perm.empty()) {
    for (size_t i = rank; i-- > 0;) perm.push_back(static_cast<int64_t>(i));
  }
  if (perm.size() != rank)
    ctx.fail("perm has " + std::to_string(perm.size()) + " entries but the input has rank " + std::to_string(rank));
  std::vector<bool> seen(rank, false);
  const std::vector<int64_t> in_strides = contiguous_strides(x.shape);
  std::vector<int64_t> dims, strides;
  for (int64_t p : perm) {
    if (p < 0 || p >= static_cast<int64_t>(rank) || seen[static_cast<size_t>(p)])
      ctx.fail("perm " + shape_string(perm) + " is not a permutation of 0.." + std::to_string(rank - 1));
    seen[static_cast<size_t>(p)] = true;
    dims.push_back(x.shape[static_cast<size_t>(p)]);
    strides.push_back(in_strides[static_cast<size_t>(p)]);
  }
  set_output(ctx, 0, x.dtype, dims);
  return strided(ctx, std::move(dims), std::move(strides), 0);
}

StridedView prepare_slice(PrepareContext& ctx) {
  const KernelInput& x = required_input(ctx, 0, "data");
  elem_size(ctx, x.dtype);
  const int64_t rank = static_cast<int64_t>(x.shape.size());
  std::vector<int64_t> starts, ends, axes, steps;
  if (ctx.opset >= 10) {
    required_input(ctx, 1, "starts");
    required_input(ctx, 2, "ends");
    starts = constant_ints(ctx, 1, "starts");
    ends = constant_ints(ctx, 2, "ends");
    if (has_input(ctx, 3)) axes = constant_ints(ctx, 3, "axes");
    if (has_input(ctx, 4)) steps = constant_ints(ctx, 4, "steps");
  } else {
    starts = ctx.node.attr_ints("starts");
    ends = ctx.node.attr_ints("ends");
    axes = ctx.node.attr_ints("axes");
  }
  if (starts.size() != ends.size()) ctx.fail("starts and ends must have the same length");
  if (axes.empty())
    for (size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
  if (steps.empty()) steps.assign(starts.size(), 1);
  if (axes.size() != starts.size() || steps.size() != starts.size())
    ctx.fail("starts, ends, axes and steps must have the same length");

  std::vector<int64_t> strides = contiguous_strides(x.shape);
  std::vector<int64_t> dims = x.shape;
  std::vector<bool> seen(x.shape.size(), false);
  int64_t base = 0;
  for (size_t i = 0; i < axes.size(); ++i) {
    const size_t ax = static_cast<size_t>(normalize_axis(ctx, axes[i], rank));
    if (seen[ax]) ctx.fail("axis " + std::to_string(axes[i]) + " is repeated in axes");
    seen[ax] = true;
    const int64_t d = x.shape[ax], step = steps[i];
    if (step == 0) ctx.fail("steps must not be 0");
    int64_t start = starts[i], end = ends[i];
    // Clamping as the ONNX spec states it: a positive step walks [0, d], a negative one [-1, d-1].
    if (start < 0) start += d;
    if (end < 0) end += d;
    int64_t count;
    if (step > 0) {
      start = std::clamp<int64_t>(start, 0, d);
      end = std::clamp<int64_t>(end, 0, d);
      count = end > start ? (end - start + step - 1) / step : 0;
    } else {
      start = std::clamp<int64_t>(start, 0, d - 1);
      end = std::clamp<int64_t>(end, -1, d - 1);
      count = start > end ? (start - end + (-step) - 1) / (-step) : 0;
    }
    dims[ax] = count;
    if (count > 0) base += start * strides[ax];
    strides[ax] *= step;
  }
  set_output(ctx, 0, x.dtype, dims);
  const int64_t b = numel_of(dims) ? base : 0;
  return strided(ctx, std::move(dims), std::move(strides), b);
}

StridedView prepare_expand(PrepareContext& ctx) {
  const KernelInput& x = required_input(ctx, 0, "input");
  elem_size(ctx, x.dtype);
  required_input(ctx, 1, "shape");
  const std::vector<int64_t> target = constant_ints(ctx, 1, "shape");
  const size_t rank = std::max(x.shape.size(), target.size());
  std::vector<int64_t> in(rank, 1), tg(rank, 1);
  std::copy(x.shape.begin(), x.shape.end(), in.begin() + static_cast<ptrdiff_t>(rank - x.shape.size()));
  std::copy(target.begin(), target.end(), tg.begin() + static_cast<ptrdiff_t>(rank - target.size()));
  const std::vector<int64_t> in_strides = contiguous_strides(in);
  std::vector<int64_t> dims(rank), strides(rank);
  for (size_t i = 0; i < rank; ++i) {
    if (in[i] != tg[i] && in[i] != 1 && tg[i] != 1)
      ctx.fail("cannot broadcast input " + shape_string(x.shape) + " to shape " + shape_string(target));
    dims[i] = in[i] == 1 ? tg[i] : in[i];
    strides[i] = in[i] == 1 ? 0 : in_strides[i];
  }
  set_output(ctx, 0, x.dtype, dims);
  return strided(ctx, std::move(dims), std::move(strides), 0);
}

StridedView prepare_tile(PrepareContext& ctx) {
  const KernelInput& x = required_input(ctx, 0, "input");
  elem_size(ctx, x.dtype);
  required_input(ctx, 1, "repeats");
  const std::vector<int64_t> reps = constant_ints(ctx, 1, "repeats");
  if (reps.size() != x.shape.size())
    ctx.fail("repeats has " + std::to_string(reps.size()) + " entries but the input has rank " +
             std::to_string(x.shape.size()));
  // Output dim k is (repeat, original) with the repeat outer, so it reads the input with stride 0.
  const std::vector<int64_t> in_strides = contiguous_strides(x.shape);
  std::vector<int64_t> out_shape, dims, strides;
  for (size_t k = 0; k < reps.size(); ++k) {
    if (reps[k] < 0) ctx.fail("repeats must not be negative");
    out_shape.push_back(reps[k] * x.shape[k]);
    dims.insert(dims.end(), {reps[k], x.shape[k]});
    strides.insert(strides.end(), {0, in_strides[k]});
  }
  set_output(ctx, 0, x.dtype, out_shape);
  return strided(ctx, std::move(dims), std::move(strides), 0);
}

StridedView prepare_depth_to_space(PrepareContext& ctx) {
  const KernelInput& x = required_input(ctx, 0, "input");
  elem_size(ctx, x.dtype);
  if (x.shape.size() != 4) ctx.fail("input must be 4-D [N, C, H, W], got " + shape_string(x.shape));
  const int64_t b = blocksize(ctx), N = x.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3];
  if (C % (b * b) != 0)
    ctx.fail("channels " + std::to_string(C) + " are not divisible by blocksize^2 = " + std::to_string(b * b));
  const int64_t c = C / (b * b);
  const std::string mode = ctx.opset >= 11 ? ctx.node.attr_string("mode", "DCR") : "DCR";
  set_output(ctx, 0, x.dtype, {N, c, H * b, W * b});
  if (mode == "DCR") return permute_view({N, b, b, c, H, W}, {0, 3, 4, 1, 5, 2});
  if (mode == "CRD") return permute_view({N, c, b, b, H, W}, {0, 1, 4, 2, 5, 3});
  ctx.fail("mode must be DCR or CRD, got '" + mode + "'");
}

StridedView prepare_space_to_depth(PrepareContext& ctx) {
  const KernelInput& x = required_input(ctx, 0, "input");
  elem_size(ctx, x.dtype);
  if (x.shape.size() != 4) ctx.fail("input must be 4-D [N, C, H, W], got " + shape_string(x.shape));
  const int64_t b = blocksize(ctx), N = x.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3];
  if (H % b != 0 || W % b != 0)
    ctx.fail("height and width " + shape_string(x.shape) + " are not divisible by blocksize " + std::to_string(b));
  set_output(ctx, 0, x.dtype, {N, C * b * b, H / b, W / b});
  return permute_view({N, C, H / b, b, W / b, b}, {0, 3, 5, 1, 2, 4});
}

AxisChunks prepare_concat(PrepareContext& ctx) {
  if (ctx.inputs.empty()) ctx.fail("needs at least one input");
  const KernelInput& first = required_input(ctx, 0, "inputs");
  elem_size(ctx, first.dtype);
  const int64_t rank = static_cast<int64_t>(first.shape.size());
  if (rank == 0) ctx.fail("inputs must have rank >= 1");
  if (!ctx.node.has_attr("axis") && ctx.opset >= 4) ctx.fail("attribute 'axis' is required");
  const size_t axis = static_cast<size_t>(normalize_axis(ctx, ctx.node.attr_int("axis", 1), rank));
  std::vector<int64_t> shape = first.shape;
  shape[axis] = 0;
  AxisChunks c;
  int64_t inner = 1;
  for (size_t i = 0; i < first.shape.size(); ++i) {
    if (i < axis) c.outer *= first.shape[i];
    if (i > axis) inner *= first.shape[i];
  }
  for (size_t i = 0; i < ctx.inputs.size(); ++i) {
    const KernelInput& in = required_input(ctx, i, "inputs");
    if (in.dtype != first.dtype) ctx.fail("input " + std::to_string(i) + " has type " + dtype_name(in.dtype) +
                                          " but input 0 has " + dtype_name(first.dtype));
    bool ok = in.shape.size() == first.shape.size();
    for (size_t k = 0; ok && k < in.shape.size(); ++k) ok = k == axis || in.shape[k] == first.shape[k];
    if (!ok)
      ctx.fail("input " + std::to_string(i) + " has shape " + shape_string(in.shape) + ", which does not match " +
               shape_string(first.shape) + " outside axis " + std::to_string(axis));
    shape[axis] += in.shape[axis];
    c.chunks.push_back(in.shape[axis] * inner);
  }
  set_output(ctx, 0, first.dtype, shape);
  return c;
}

AxisChunks prepare_split(PrepareContext& ctx) {
  const KernelInput& x = required_input(ctx, 0, "input");
  elem_size(ctx, x.dtype);
  const int64_t rank = static_cast<int64_t>(x.shape.size());
  const size_t axis = static_cast<size_t>(normalize_axis(ctx, ctx.node.attr_int("axis", 0), rank));
  const int64_t n = x.shape[axis];
  const size_t nout = ctx.outputs.size();
  std::vector<int64_t> split;
  if (ctx.opset >= 13) {
    if (has_input(ctx, 1)) split = constant_ints(ctx, 1, "split");
  } else {
    split = ctx.node.attr_ints("split");
    if (split.empty() && has_input(ctx, 1)) split = constant_ints(ctx, 1, "split");  // opset 1 allowed an input
  }
  if (split.empty()) {
    if (ctx.opset >= 18 && ctx.node.has_attr("num_outputs")) {
      const int64_t k = ctx.node.attr_int("num_outputs", 0);
      if (k < 1 || static_cast<size_t>(k) != nout)
        ctx.fail("num_outputs is " + std::to_string(k) + " but the node has " + std::to_string(nout) + " outputs");
      // Every part gets ceil(n / k) elements except the last, which takes what is left.
      const int64_t part = (n + k - 1) / k;
      for (int64_t i = 0; i < k; ++i) split.push_back(std::max<int64_t>(0, std::min(part, n - i * part)));
    } else {
      if (nout == 0 || n % static_cast<int64_t>(nout) != 0)
        ctx.fail("axis " + std::to_string(axis) + " of size " + std::to_string(n) + " does not split evenly into " +
                 std::to_string(nout) + " outputs");
      split.assign(nout, n / static_cast<int64_t>(nout));
    }
  }
  if (split.size() != nout)
    ctx.fail("split has " + std::to_string(split.size()) + " entries but the node has " + std::to_string(nout) +
             " outputs");
  int64_t sum = 0;
  for (int64_t s : split) {
    if (s < 0) ctx.fail("split sizes must not be negative");
    sum += s;
  }
  if (sum != n)
    ctx.fail("split sizes add up to " + std::to_string(sum) + " but axis " + std::to_string(axis) + " has size " +
             std::to_string(n));
  AxisChunks c;
  int64_t inner = 1;
  for (size_t i = 0; i < x.shape.size(); ++i) {
    if (i < axis) c.outer *= x.shape[i];
    if (i > axis) inner *= x.shape[i];
  }
  for (size_t i = 0; i < nout; ++i) {
    std::vector<int64_t> shape = x.shape;
    shape[axis] = split[i];
    set_output(ctx, i, x.dtype, shape);
    c.chunks.push_back(split[i] * inner);
  }
  return c;
}

TriluGeometry prepare_trilu(PrepareContext& ctx) {
  const KernelInput& x = required_input(ctx, 0, "input");
  elem_size(ctx, x.dtype);
  if (x.shape.size() < 2) ctx.fail("input must have rank >= 2, got " + shape_string(x.shape));
  int64_t k = 0;
  if (has_input(ctx, 1)) {
    const std::vector<int64_t> kv = ints_of(ctx, ctx.constant_input(1), "k");
    if (kv.size() != 1) ctx.fail("k must hold one value");
    k = kv[0];
  }
  const size_t r = x.shape.size();
  const int64_t n = x.shape[r - 2], m = x.shape[r - 1];
  set_output(ctx, 0, x.dtype, x.shape);
  return {n * m != 0 ? numel_of(x.shape) / (n * m) : 0, n, m, k, ctx.node.attr_int("upper", 1) != 0};
}

PadGeometry prepare_pad(PrepareContext& ctx) {
  const KernelInput& data = required_input(ctx, 0, "data");
  const size_t es = elem_size(ctx, data.dtype);
  if (es > 16) ctx.fail("elements of " + std::to_string(es) + " bytes are not supported");
  const std::string mode = ctx.node.attr_string("mode", "constant");
  if (mode != "constant") ctx.fail("mode '" + mode + "' is not supported (only 'constant')");
  PadGeometry g;
  std::vector<int64_t> pads;
  if (ctx.opset < 11) {
    pads = ctx.node.attr_ints("pads");
    const float v = ctx.node.attr_float("value", 0.0f);
    g.attr_value.resize(es);
    if (data.dtype == DType::Float32) {
      std::memcpy(g.attr_value.data(), &v, es);
    } else if (data.dtype == DType::Float64) {
      const double dv = v;
      std::memcpy(g.attr_value.data(), &dv, es);
    } else if (v != 0.0f) {
      ctx.fail("a non-zero value attribute is supported for float32 and float64 only, the data is " +
               dtype_name(data.dtype));
    }
  } else {
    required_input(ctx, 1, "pads");
    const Tensor& pads_t = ctx.constant_input(1);
    if (pads_t.dtype != DType::Int64) ctx.fail("pads must be int64, got " + dtype_name(pads_t.dtype));
    pads.assign(pads_t.span<int64_t>().begin(), pads_t.span<int64_t>().end());
  }
  if (ctx.opset >= 11 && has_input(ctx, 2)) {
    const KernelInput& v = ctx.inputs[2];
    if (v.dtype != data.dtype)
      ctx.fail("constant_value must have data's dtype " + dtype_name(data.dtype) + ", got " + dtype_name(v.dtype));
    if (numel_of(v.shape) != 1) ctx.fail("constant_value must hold one value, got shape " + shape_string(v.shape));
  }
  const auto r = static_cast<int64_t>(data.shape.size());
  std::vector<int64_t> axes;
  if (ctx.opset >= 11 && has_input(ctx, 3)) {
    if (ctx.opset < 18) ctx.fail("the axes input exists from opset 18, the model has " + std::to_string(ctx.opset));
    const Tensor& a = ctx.constant_input(3);
    if (a.dtype == DType::Int64)
      axes.assign(a.span<int64_t>().begin(), a.span<int64_t>().end());
    else if (a.dtype == DType::Int32)
      axes.assign(a.span<int32_t>().begin(), a.span<int32_t>().end());
    else
      ctx.fail("axes must be int32 or int64, got " + dtype_name(a.dtype));
  } else {
    for (int64_t d = 0; d < r; ++d) axes.push_back(d);
  }
  const auto na = static_cast<int64_t>(axes.size());
  if (static_cast<int64_t>(pads.size()) != 2 * na)
    ctx.fail("pads has " + std::to_string(pads.size()) + " values, expected " + std::to_string(2 * na) +
             " (begin and end for each of " + std::to_string(na) + " axes)");
  g.begins.assign(r, 0);
  g.ends.assign(r, 0);
  std::vector<bool> seen(r, false);
  for (int64_t i = 0; i < na; ++i) {
    const int64_t a = normalize_axis(ctx, axes[i], r);
    if (seen[a]) ctx.fail("axis " + std::to_string(axes[i]) + " is repeated in axes");
    seen[a] = true;
    g.begins[a] = pads[i];
    g.ends[a] = pads[i + na];
  }
  g.out_shape.resize(r);
  for (int64_t d = 0; d < r; ++d) {
    g.out_shape[d] = data.shape[d] + g.begins[d] + g.ends[d];
    if (g.out_shape[d] < 0)
      ctx.fail("pads " + shape_string(pads) + " crop more than the " + std::to_string(data.shape[d]) +
               " elements of axis " + std::to_string(d));
  }
  g.in_shape = data.shape;
  ctx.outputs.at(0) = {data.dtype, g.out_shape};
  return g;
}

PadSpan pad_span(int64_t dim, int64_t begin, int64_t end) {
  // A negative begin crops the input's first -begin elements, a positive one shifts them right; the same at the
  // end.
  PadSpan s;
  s.src = std::max<int64_t>(0, -begin);
  s.len = std::max<int64_t>(0, dim - std::max<int64_t>(0, -end) - s.src);
  s.dst = std::max<int64_t>(0, begin);
  return s;
}

// ---------------------------------------------------------------------------------------------------------
// Gather maps from the geometry.

std::vector<int64_t> gather_map(const StridedView& v) {
  const int64_t n = numel_of(v.dims);
  std::vector<int64_t> map(static_cast<size_t>(n));
  if (n == 0) return map;
  const size_t r = v.dims.size();
  std::vector<int64_t> idx(r, 0);
  int64_t off = v.base;
  for (int64_t i = 0; i < n; ++i) {
    map[static_cast<size_t>(i)] = off;
    for (size_t q = r; q-- > 0;) {  // odometer, last dim fastest
      off += v.strides[q];
      if (++idx[q] < v.dims[q]) break;
      off -= v.strides[q] * v.dims[q];
      idx[q] = 0;
    }
  }
  return map;
}

std::vector<int64_t> concat_map(const AxisChunks& c) {
  std::vector<int64_t> map;
  int64_t row = 0;
  for (int64_t k : c.chunks) row += k;
  map.reserve(static_cast<size_t>(c.outer * row));
  for (int64_t o = 0; o < c.outer; ++o) {
    int64_t base = 0;  // input i starts after the inputs before it, each outer * chunk elements
    for (int64_t k : c.chunks) {
      for (int64_t j = 0; j < k; ++j) map.push_back(base + o * k + j);
      base += c.outer * k;
    }
  }
  return map;
}

std::vector<std::vector<int64_t>> split_maps(const AxisChunks& c) {
  int64_t row = 0;
  for (int64_t k : c.chunks) row += k;
  std::vector<std::vector<int64_t>> maps;
  int64_t at = 0;  // where output i's part of a row starts
  for (int64_t k : c.chunks) {
    std::vector<int64_t> map;
    map.reserve(static_cast<size_t>(c.outer * k));
    for (int64_t o = 0; o < c.outer; ++o)
      for (int64_t j = 0; j < k; ++j) map.push_back(o * row + at + j);
    maps.push_back(std::move(map));
    at += k;
  }
  return maps;
}

std::vector<int64_t> trilu_map(const TriluGeometry& g) {
  std::vector<int64_t> map;
  map.reserve(static_cast<size_t>(g.batch * g.n * g.m));
  for (int64_t b = 0; b < g.batch; ++b)
    for (int64_t i = 0; i < g.n; ++i)
      for (int64_t j = 0; j < g.m; ++j)
        map.push_back(trilu_keeps(i, j, g.k, g.upper) ? (b * g.n + i) * g.m + j : -1);
  return map;
}

std::vector<int64_t> pad_map(const PadGeometry& g) {
  const size_t r = g.in_shape.size();
  const int64_t n = numel_of(g.out_shape);
  std::vector<int64_t> map(static_cast<size_t>(n));
  if (n == 0) return map;
  std::vector<PadSpan> spans;
  for (size_t d = 0; d < r; ++d) spans.push_back(pad_span(g.in_shape[d], g.begins[d], g.ends[d]));
  const std::vector<int64_t> in_strides = contiguous_strides(g.in_shape);
  std::vector<int64_t> idx(r, 0);
  for (int64_t i = 0; i < n; ++i) {
    int64_t src = 0;
    for (size_t d = 0; d < r && src >= 0; ++d) {
      const int64_t s = pad_source(spans[d], idx[d]);
      src = s < 0 ? -1 : src + s * in_strides[d];
    }
    map[static_cast<size_t>(i)] = src;
    for (size_t q = r; q-- > 0;) {
      if (++idx[q] < g.out_shape[q]) break;
      idx[q] = 0;
    }
  }
  return map;
}

GatherMaps transpose_gather_maps(PrepareContext& ctx) { return one_source(ctx, {gather_map(prepare_transpose(ctx))}); }
GatherMaps slice_gather_maps(PrepareContext& ctx) { return one_source(ctx, {gather_map(prepare_slice(ctx))}); }
GatherMaps expand_gather_maps(PrepareContext& ctx) { return one_source(ctx, {gather_map(prepare_expand(ctx))}); }
GatherMaps tile_gather_maps(PrepareContext& ctx) { return one_source(ctx, {gather_map(prepare_tile(ctx))}); }
GatherMaps depth_to_space_gather_maps(PrepareContext& ctx) {
  return one_source(ctx, {gather_map(prepare_depth_to_space(ctx))});
}
GatherMaps space_to_depth_gather_maps(PrepareContext& ctx) {
  return one_source(ctx, {gather_map(prepare_space_to_depth(ctx))});
}
GatherMaps split_gather_maps(PrepareContext& ctx) { return one_source(ctx, split_maps(prepare_split(ctx))); }
GatherMaps trilu_gather_maps(PrepareContext& ctx) { return one_source(ctx, {trilu_map(prepare_trilu(ctx))}); }

GatherMaps concat_gather_maps(PrepareContext& ctx) {
  GatherMaps g;
  g.maps.push_back(concat_map(prepare_concat(ctx)));
  for (size_t i = 0; i < ctx.inputs.size(); ++i) {  // every input is data (prepare_concat requires each)
    g.data.push_back(i);
    g.bases.push_back(g.total);
    g.total += numel_of(ctx.inputs[i].shape);
  }
  return g;
}

GatherMaps pad_gather_maps(PrepareContext& ctx) {
  GatherMaps g = one_source(ctx, {pad_map(prepare_pad(ctx))});
  if (ctx.opset >= 11) g.fill_input = 2;  // constant_value, when present; the attribute before is CUDA's to check
  return g;
}

}  // namespace onnxtrain::ops
