// Index-driven data movement on the CPU: ScatterND, ScatterElements, GatherElements and GatherND (rules:
// gradients/rules/index.cpp; CUDA twins: executor/cuda/index.cu).
// Indices are data, so they are checked at run time: a bad index throws Error naming the node and the index
// before anything is written through it. Scatters run sequentially: duplicate indices with a reduction must
// combine every update, and with reduction 'none' the last write wins, as in the ONNX reference.
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "executor/cpu/kernel_util.h"
#include "executor/kernel.h"
#include "graph/error.h"

namespace onnxtrain {
namespace {

using cpu::contiguous_strides;
using cpu::elem_size;
using cpu::has_input;
using cpu::normalize_axis;
using cpu::required_input;

constexpr int64_t kParallelWork = 1 << 15;

// Calls f(i, first_bad) for every i in [0, n) and returns the smallest i that f marked bad (n if none);
// exceptions cannot leave an OpenMP region, so the caller reports it afterwards. Threaded only when asked and
// more than one thread is allowed: libgomp builds (and allocates) a team even for `omp parallel if (false)`.
template <class F> int64_t for_each_index(int64_t n, bool parallel, F&& f) {
  int64_t bad = n;
  if (parallel && omp_get_max_threads() > 1) {
#pragma omp parallel for schedule(static) reduction(min : bad)
    for (int64_t i = 0; i < n; ++i) f(i, bad);
  } else {
    for (int64_t i = 0; i < n; ++i) f(i, bad);
  }
  return bad;
}

void expect_index_dtype(const PrepareContext& ctx, const KernelInput& idx, bool allow_int32) {
  if (idx.dtype == DType::Int64 || (allow_int32 && idx.dtype == DType::Int32)) return;
  ctx.fail("indices must be " + std::string(allow_int32 ? "int32 or int64" : "int64") + ", got " +
           dtype_name(idx.dtype));
}

// An index in [-size, size) wrapped to [0, size), or -1 when out of range.
inline int64_t wrap_index(int64_t i, int64_t size) {
  if (i < -size || i >= size) return -1;
  return i < 0 ? i + size : i;
}

[[noreturn]] void bad_index(const std::string& where, int64_t value, const std::string& at, int64_t axis,
                            int64_t size) {
  fail(where, "index " + std::to_string(value) + " at " + at + " is out of range for axis " + std::to_string(axis) +
                  " of size " + std::to_string(size) + " (valid: " + std::to_string(-size) + " to " +
                  std::to_string(size - 1) + ")");
}

void copy_input(const Tensor& in, Tensor& out) {
  if (in.data != out.data && in.nbytes() > 0) std::memcpy(out.data, in.data, in.nbytes());
}

// A data input known at plan time to be all zero bytes: the scatter-adds that gradients emit start from one
// (GatherElements' and GatherND's rules), and writing zeros costs half the memory traffic of copying them.
bool known_zeros(const KernelInput& data) {
  if (!data.value) return false;
  const auto* b = static_cast<const std::byte*>(data.value->data);
  return std::all_of(b, b + data.value->nbytes(), [](std::byte x) { return x == std::byte{0}; });
}

void start_from(const Tensor& in, Tensor& out, bool zeros) {
  if (zeros) std::memset(out.data, 0, out.nbytes());
  else copy_input(in, out);
}

// ---- reductions ------------------------------------------------------------------------------------------

enum class Reduction { None, Add, Mul, Max, Min };

Reduction reduction_of(const PrepareContext& ctx) {
  const std::string r = ctx.node.attr_string("reduction", "none");
  if (r == "none") return Reduction::None;
  if (ctx.opset >= 16 && r == "add") return Reduction::Add;
  if (ctx.opset >= 16 && r == "mul") return Reduction::Mul;
  if (ctx.opset >= 18 && r == "max") return Reduction::Max;
  if (ctx.opset >= 18 && r == "min") return Reduction::Min;
  ctx.fail("reduction '" + r + "' is not valid at opset " + std::to_string(ctx.opset) +
           " (none; add and mul from opset 16; max and min from 18)");
}

template <class T> inline void combine(Reduction r, T& dst, T v) {
  switch (r) {
    case Reduction::None: dst = v; break;
    case Reduction::Add: dst += v; break;
    case Reduction::Mul: dst *= v; break;
    case Reduction::Max: dst = std::max(dst, v); break;
    case Reduction::Min: dst = std::min(dst, v); break;
  }
}

// Calls f(T{}) with the element type of an arithmetic dtype (the scatters' reductions need one).
template <class F> auto with_numeric_type(const PrepareContext& ctx, DType t, F&& f) {
  switch (t) {
    case DType::Float32: return f(float{});
    case DType::Float64: return f(double{});
    case DType::Int32: return f(int32_t{});
    case DType::Int64: return f(int64_t{});
    default: ctx.fail("unsupported dtype " + dtype_name(t) + " (float32, float64, int32, int64)");
  }
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

// ---- ScatterND -------------------------------------------------------------------------------------------
// out = data; for each index tuple t (the last dim of indices, k long): out[indices[t], :] op= updates[t, :].

template <class T> class ScatterNDKernel final : public Kernel {
 public:
  ScatterNDKernel(std::string where, std::vector<int64_t> data_shape, int64_t tuples, int64_t k, int64_t slice,
                  Reduction red, bool zeros)
      : where_(std::move(where)), shape_(std::move(data_shape)), strides_(contiguous_strides(shape_)),
        tuples_(tuples), k_(k), slice_(slice), red_(red), zeros_(zeros) {}

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    start_from(*in[0], *out[0], zeros_);
    const int64_t* idx = in[1]->ptr<int64_t>();
    const T* upd = in[2]->ptr<T>();
    T* y = out[0]->ptr<T>();
    for (int64_t t = 0; t < tuples_; ++t) {
      int64_t off = 0;
      for (int64_t j = 0; j < k_; ++j) {
        const int64_t v = idx[t * k_ + j];
        const int64_t w = wrap_index(v, shape_[j]);
        if (w < 0) bad_index(where_, v, "indices[" + std::to_string(t) + "][" + std::to_string(j) + "]", j, shape_[j]);
        off += w * strides_[j];
      }
      T* dst = y + off;
      const T* src = upd + t * slice_;
      if (red_ == Reduction::None)
        std::copy(src, src + slice_, dst);
      else
        for (int64_t e = 0; e < slice_; ++e) combine(red_, dst[e], src[e]);
    }
  }

 private:
  std::string where_;
  std::vector<int64_t> shape_, strides_;
  int64_t tuples_, k_, slice_;
  Reduction red_;
  bool zeros_;
};

std::unique_ptr<Kernel> make_scatter_nd(PrepareContext& ctx) {
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
  const Reduction red = reduction_of(ctx);
  ctx.outputs.at(0) = {data.dtype, data.shape};
  const int64_t tuples = numel_of(std::span<const int64_t>(indices.shape).first(indices.shape.size() - 1));
  const int64_t slice = numel_of(std::span<const int64_t>(data.shape).subspan(static_cast<size_t>(k)));
  // Clang 14 (the fuzz/sanitizer compiler) cannot capture a structured binding in a lambda.
  const std::vector<int64_t>& data_shape = data.shape;
  const bool zeros = known_zeros(data);
  return with_numeric_type(ctx, data.dtype, [&](auto t) -> std::unique_ptr<Kernel> {
    using T = decltype(t);
    return std::make_unique<ScatterNDKernel<T>>(ctx.node.describe(), data_shape, tuples, k, slice, red, zeros);
  });
}

// ---- ScatterElements and GatherElements ------------------------------------------------------------------
// Both walk the indices tensor; the element at coordinate p pairs with data at p with p[axis] replaced by
// the index. Indices may be smaller than data along every axis.

struct ElementsGeometry {
  std::vector<int64_t> idx_shape, data_shape, data_strides;
  int64_t axis = 0;

  // Offset into data of indices element i, leaving out the axis term (the index supplies it).
  int64_t base_offset(int64_t i) const {
    int64_t off = 0;
    for (size_t d = idx_shape.size(); d-- > 0;) {
      const int64_t c = i % idx_shape[d];
      i /= idx_shape[d];
      if (static_cast<int64_t>(d) != axis) off += c * data_strides[d];
    }
    return off;
  }
};

ElementsGeometry elements_geometry(const PrepareContext& ctx, const KernelInput& data, const KernelInput& indices) {
  ElementsGeometry g;
  const auto r = static_cast<int64_t>(data.shape.size());
  if (r == 0) ctx.fail("data must have rank >= 1, got a scalar");
  if (indices.shape.size() != data.shape.size())
    ctx.fail("indices " + shape_string(indices.shape) + " must have data's rank " + std::to_string(r) + " (data " +
             shape_string(data.shape) + ")");
  g.axis = normalize_axis(ctx, ctx.node.attr_int("axis", 0), r);
  for (int64_t d = 0; d < r; ++d)
    if (d != g.axis && indices.shape[d] > data.shape[d])
      ctx.fail("indices " + shape_string(indices.shape) + " is larger than data " + shape_string(data.shape) +
               " along axis " + std::to_string(d) + " (only the indexed axis " + std::to_string(g.axis) +
               " may differ freely)");
  g.idx_shape = indices.shape;
  g.data_shape = data.shape;
  g.data_strides = contiguous_strides(data.shape);
  return g;
}

std::string element_position(const ElementsGeometry& g, int64_t i) {
  std::vector<int64_t> c(g.idx_shape.size());
  for (size_t d = c.size(); d-- > 0;) {
    c[d] = i % g.idx_shape[d];
    i /= g.idx_shape[d];
  }
  return "indices" + shape_string(c);
}

template <class T, class I> class ScatterElementsKernel final : public Kernel {
 public:
  ScatterElementsKernel(std::string where, ElementsGeometry g, Reduction red, bool zeros)
      : where_(std::move(where)), g_(std::move(g)), red_(red), zeros_(zeros) {}

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    start_from(*in[0], *out[0], zeros_);
    const I* idx = in[1]->ptr<I>();
    const T* upd = in[2]->ptr<T>();
    T* y = out[0]->ptr<T>();
    const int64_t n = in[1]->numel();
    const int64_t size = g_.data_shape[g_.axis], stride = g_.data_strides[g_.axis];
    for (int64_t i = 0; i < n; ++i) {
      const auto v = static_cast<int64_t>(idx[i]);
      const int64_t w = wrap_index(v, size);
      if (w < 0) bad_index(where_, v, element_position(g_, i), g_.axis, size);
      combine(red_, y[g_.base_offset(i) + w * stride], upd[i]);
    }
  }

 private:
  std::string where_;
  ElementsGeometry g_;
  Reduction red_;
  bool zeros_;
};

std::unique_ptr<Kernel> make_scatter_elements(PrepareContext& ctx) {
  const auto [data, indices, updates] = scatter_inputs(ctx, true);
  if (updates.shape != indices.shape)
    ctx.fail("updates " + shape_string(updates.shape) + " must have the shape of indices " +
             shape_string(indices.shape));
  ElementsGeometry g = elements_geometry(ctx, data, indices);
  const Reduction red = reduction_of(ctx);
  ctx.outputs.at(0) = {data.dtype, data.shape};
  const bool i64 = indices.dtype == DType::Int64;
  const bool zeros = known_zeros(data);  // outside the lambda: clang 14 cannot capture a structured binding
  return with_numeric_type(ctx, data.dtype, [&](auto t) -> std::unique_ptr<Kernel> {
    using T = decltype(t);
    if (i64) return std::make_unique<ScatterElementsKernel<T, int64_t>>(ctx.node.describe(), std::move(g), red, zeros);
    return std::make_unique<ScatterElementsKernel<T, int32_t>>(ctx.node.describe(), std::move(g), red, zeros);
  });
}

// Gathers copy whole elements, so they work on bytes of any fixed-size dtype.
template <class E> inline void copy_elem(const std::byte* src, std::byte* dst) {
  *reinterpret_cast<E*>(dst) = *reinterpret_cast<const E*>(src);
}

template <class I> class GatherElementsKernel final : public Kernel {
 public:
  GatherElementsKernel(std::string where, ElementsGeometry g, size_t es)
      : where_(std::move(where)), g_(std::move(g)), es_(es) {}

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const I* idx = in[1]->ptr<I>();
    const auto* x = static_cast<const std::byte*>(in[0]->data);
    auto* y = static_cast<std::byte*>(out[0]->data);
    const int64_t n = in[1]->numel();
    const int64_t size = g_.data_shape[g_.axis], stride = g_.data_strides[g_.axis];
    const int64_t bad = for_each_index(n, n > kParallelWork, [&](int64_t i, int64_t& first_bad) {
      const int64_t w = wrap_index(static_cast<int64_t>(idx[i]), size);
      if (w < 0) {
        first_bad = std::min(first_bad, i);
        return;
      }
      std::memcpy(y + i * es_, x + (g_.base_offset(i) + w * stride) * es_, es_);
    });
    if (bad < n) bad_index(where_, static_cast<int64_t>(idx[bad]), element_position(g_, bad), g_.axis, size);
  }

 private:
  std::string where_;
  ElementsGeometry g_;
  size_t es_;
};

std::unique_ptr<Kernel> make_gather_elements(PrepareContext& ctx) {
  const KernelInput& data = required_input(ctx, 0, "data");
  const KernelInput& indices = required_input(ctx, 1, "indices");
  expect_index_dtype(ctx, indices, true);
  const size_t es = elem_size(ctx, data.dtype);
  ElementsGeometry g = elements_geometry(ctx, data, indices);
  ctx.outputs.at(0) = {data.dtype, indices.shape};
  if (indices.dtype == DType::Int64)
    return std::make_unique<GatherElementsKernel<int64_t>>(ctx.node.describe(), std::move(g), es);
  return std::make_unique<GatherElementsKernel<int32_t>>(ctx.node.describe(), std::move(g), es);
}

// ---- GatherND --------------------------------------------------------------------------------------------
// For each batch b (the first batch_dims dims, shared by data and indices) and index tuple t of length k:
// out[b, t, :] = data[b, indices[b, t], :].

class GatherNDKernel final : public Kernel {
 public:
  GatherNDKernel(std::string where, std::vector<int64_t> data_shape, int64_t batch_dims, int64_t batches,
                 int64_t tuples, int64_t k, int64_t slice, size_t es)
      : where_(std::move(where)), shape_(std::move(data_shape)), strides_(contiguous_strides(shape_)),
        bd_(batch_dims), batches_(batches), tuples_(tuples), k_(k), slice_(slice), es_(es) {}

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const auto* x = static_cast<const std::byte*>(in[0]->data);
    const int64_t* idx = in[1]->ptr<int64_t>();
    auto* y = static_cast<std::byte*>(out[0]->data);
    const int64_t batch_stride = bd_ > 0 ? strides_[bd_ - 1] : 0;
    const int64_t total = batches_ * tuples_;
    const size_t row_bytes = static_cast<size_t>(slice_) * es_;
    const int64_t bad = for_each_index(total, total * slice_ > kParallelWork, [&](int64_t bt, int64_t& first_bad) {
      int64_t off = (bt / tuples_) * batch_stride;
      bool ok = true;
      for (int64_t j = 0; j < k_; ++j) {
        const int64_t w = wrap_index(idx[bt * k_ + j], shape_[bd_ + j]);
        if (w < 0) {
          ok = false;
          break;
        }
        off += w * strides_[bd_ + j];
      }
      if (!ok) {
        first_bad = std::min(first_bad, bt);
        return;
      }
      if (row_bytes) std::memcpy(y + bt * row_bytes, x + off * es_, row_bytes);
    });
    if (bad < total)
      for (int64_t j = 0; j < k_; ++j) {
        const int64_t v = idx[bad * k_ + j];
        if (wrap_index(v, shape_[bd_ + j]) < 0)
          bad_index(where_, v, "index tuple " + std::to_string(bad) + " component " + std::to_string(j), bd_ + j,
                    shape_[bd_ + j]);
      }
  }

 private:
  std::string where_;
  std::vector<int64_t> shape_, strides_;
  int64_t bd_, batches_, tuples_, k_, slice_;
  size_t es_;
};

std::unique_ptr<Kernel> make_gather_nd(PrepareContext& ctx) {
  const KernelInput& data = required_input(ctx, 0, "data");
  const KernelInput& indices = required_input(ctx, 1, "indices");
  expect_index_dtype(ctx, indices, false);
  const size_t es = elem_size(ctx, data.dtype);
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
  const int64_t batches = numel_of(ishape.first(static_cast<size_t>(b)));
  const int64_t tuples = numel_of(ishape.subspan(static_cast<size_t>(b), static_cast<size_t>(q - b - 1)));
  const int64_t slice = numel_of(std::span<const int64_t>(data.shape).subspan(static_cast<size_t>(b + k)));
  return std::make_unique<GatherNDKernel>(ctx.node.describe(), data.shape, b, batches, tuples, k, slice, es);
}

}  // namespace

void register_cpu_index(KernelRegistry& r) {
  using cpu::add;
  const std::vector<DType> numeric{DType::Float32, DType::Float64, DType::Int32, DType::Int64};
  add(r, "ScatterND", 11, numeric, make_scatter_nd);
  add(r, "ScatterElements", 11, numeric, make_scatter_elements);
  add(r, "GatherElements", 11, {}, make_gather_elements);
  add(r, "GatherND", 11, {}, make_gather_nd);
}

}  // namespace onnxtrain
