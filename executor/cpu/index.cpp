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
#include "executor/ops/index.h"
#include "graph/error.h"

namespace onnxtrain {
namespace {

using cpu::contiguous_strides;
using cpu::elem_size;

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

using Reduction = ops::IndexReduction;

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
  const ops::NdAttrs a = ops::prepare_scatter_nd(ctx);
  const KernelInput& data = ctx.inputs[0];
  const bool zeros = known_zeros(data);
  return with_numeric_type(ctx, data.dtype, [&](auto t) -> std::unique_ptr<Kernel> {
    using T = decltype(t);
    return std::make_unique<ScatterNDKernel<T>>(ctx.node.describe(), data.shape, a.tuples, a.k, a.slice, a.reduction,
                                                zeros);
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

// The op layer has checked the shapes and the axis (ops::prepare_gather_elements, prepare_scatter_elements).
ElementsGeometry elements_geometry(const KernelInput& data, const KernelInput& indices, int64_t axis) {
  ElementsGeometry g;
  g.axis = axis;
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
  const ops::ElementsAttrs a = ops::prepare_scatter_elements(ctx);
  const KernelInput& data = ctx.inputs[0];
  const KernelInput& indices = ctx.inputs[1];
  ElementsGeometry g = elements_geometry(data, indices, a.axis);
  const Reduction red = a.reduction;
  const bool i64 = indices.dtype == DType::Int64;
  const bool zeros = known_zeros(data);
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
  const ops::ElementsAttrs a = ops::prepare_gather_elements(ctx);
  const KernelInput& data = ctx.inputs[0];
  const KernelInput& indices = ctx.inputs[1];
  const size_t es = elem_size(ctx, data.dtype);
  ElementsGeometry g = elements_geometry(data, indices, a.axis);
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
  const ops::NdAttrs a = ops::prepare_gather_nd(ctx);
  const KernelInput& data = ctx.inputs[0];
  const size_t es = elem_size(ctx, data.dtype);
  return std::make_unique<GatherNDKernel>(ctx.node.describe(), data.shape, a.batch_dims, a.batches, a.tuples, a.k,
                                          a.slice, es);
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
