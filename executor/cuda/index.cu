// Index-driven ops on CUDA: GatherElements, GatherND, ScatterElements and ScatterND.
//
// Indices are read on the device, so they need not be known at plan time. The device cannot raise the CPU
// kernels' out-of-range errors: there an out-of-range index gathers zeros and a scatter skips it.
// Scatters copy data into the output, then one thread per update element applies it; the add/mul/max/min
// reductions are atomic (a compare-and-swap loop over the element's bits), so duplicate indices combine
// correctly, though float sums do so in no fixed order. With reduction "none" and duplicate indices the
// winner is unspecified (ONNX leaves it undefined; the CPU takes the last).
#include <cstring>
#include <memory>
#include <utility>
#include <type_traits>

#include "executor/cuda/common.h"
#include "executor/ops/index.h"
#include "executor/cuda/device_util.cuh"
#include "graph/error.h"

namespace onnxtrain::cuda {
namespace {

constexpr int kMaxRank = 8;

struct Shape {
  int rank = 0;
  int64_t dims[kMaxRank];
  int64_t strides[kMaxRank];  // contiguous strides of the tensor the offsets address
};

Shape shape_of(const PrepareContext& ctx, const std::vector<int64_t>& dims, const std::vector<int64_t>& addressed) {
  if (dims.size() > static_cast<size_t>(kMaxRank))
    ctx.fail("the CUDA kernel supports rank <= " + std::to_string(kMaxRank) + ", got " + std::to_string(dims.size()));
  Shape s;
  s.rank = static_cast<int>(dims.size());
  const std::vector<int64_t> st = ops::contiguous_strides(addressed);
  for (int d = 0; d < s.rank; ++d) {
    s.dims[d] = dims[d];
    s.strides[d] = st[d];
  }
  return s;
}

// An index in [-size, size) wrapped to [0, size), or -1 when out of range (as the CPU's wrap_index).
__device__ inline int64_t wrap(int64_t i, int64_t size) { return i < -size || i >= size ? -1 : (i < 0 ? i + size : i); }

// Element types by size: gathers copy bits, so any dtype of that size moves as this one.
template <class F> void by_size(const PrepareContext& ctx, DType t, F&& f) {
  switch (dtype_size(t)) {
    case 1: return f(Tag<uint8_t>{});
    case 2: return f(Tag<uint16_t>{});
    case 4: return f(Tag<uint32_t>{});
    case 8: return f(Tag<uint64_t>{});
    default: ctx.fail("elements of " + std::to_string(dtype_size(t)) + " bytes are not supported on CUDA");
  }
}

// ---- scatter reductions ----------------------------------------------------------------------------------

enum class Reduction { None, Add, Mul, Max, Min };

// The CPU factory has checked the name against the opset.
// The op layer's reduction (ops::IndexReduction, validated against the opset) as the device enum.
Reduction device_reduction(ops::IndexReduction r) {
  switch (r) {
    case ops::IndexReduction::Add: return Reduction::Add;
    case ops::IndexReduction::Mul: return Reduction::Mul;
    case ops::IndexReduction::Max: return Reduction::Max;
    case ops::IndexReduction::Min: return Reduction::Min;
    default: return Reduction::None;
  }
}

template <class T> __device__ T combined(Reduction r, T a, T b) {
  switch (r) {
    case Reduction::Add: return a + b;
    case Reduction::Mul: return a * b;
    case Reduction::Max: return b > a ? b : a;
    case Reduction::Min: return b < a ? b : a;
    default: return b;
  }
}

template <class T> __device__ void apply(Reduction r, T* dst, T v) {
  if (r == Reduction::None) {
    *dst = v;
    return;
  }
  using U = std::conditional_t<sizeof(T) == 8, unsigned long long, unsigned int>;
  static_assert(sizeof(T) == sizeof(U));
  U* p = reinterpret_cast<U*>(dst);
  U old = *p, assumed;
  do {
    assumed = old;
    T cur;
    memcpy(&cur, &assumed, sizeof(T));
    const T next = combined(r, cur, v);
    U bits;
    memcpy(&bits, &next, sizeof(T));
    old = atomicCAS(p, assumed, bits);
  } while (old != assumed);
}

void copy_data(const Tensor& in, Tensor& out) {
  if (in.data != out.data && in.nbytes())
    check(cudaMemcpyAsync(out.data, in.data, in.nbytes(), cudaMemcpyDeviceToDevice, stream()), "scatter copy");
}

// ---- GatherElements / ScatterElements --------------------------------------------------------------------
// Element i of indices (shape idx) pairs with data at its own coordinate, the axis coordinate replaced.

__device__ inline int64_t elements_base(const Shape& idx, int axis, int64_t i) {
  int64_t off = 0;
  for (int d = idx.rank - 1; d >= 0; --d) {
    const int64_t c = i % idx.dims[d];
    i /= idx.dims[d];
    if (d != axis) off += c * idx.strides[d];
  }
  return off;
}

template <class E, class I>
__global__ void gather_elements_kernel(int64_t n, Shape idx, int axis, int64_t size, const E* x, const I* ind, E* y) {
  const int64_t stride = idx.strides[axis];
  for (int64_t i = global_index(); i < n; i += grid_stride()) {
    const int64_t w = wrap(static_cast<int64_t>(ind[i]), size);
    y[i] = w < 0 ? E(0) : x[elements_base(idx, axis, i) + w * stride];
  }
}

template <class T, class I>
__global__ void scatter_elements_kernel(int64_t n, Shape idx, int axis, int64_t size, Reduction r, const I* ind,
                                        const T* upd, T* y) {
  const int64_t stride = idx.strides[axis];
  for (int64_t i = global_index(); i < n; i += grid_stride()) {
    const int64_t w = wrap(static_cast<int64_t>(ind[i]), size);
    if (w >= 0) apply(r, y + elements_base(idx, axis, i) + w * stride, upd[i]);
  }
}

template <class E, class I, bool Scatter> class ElementsKernel final : public Kernel {
 public:
  ElementsKernel(Shape idx, int axis, int64_t size, Reduction r) : idx_(idx), axis_(axis), size_(size), r_(r) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const int64_t n = in[1]->numel();
    if constexpr (Scatter) copy_data(*in[0], *out[0]);
    if (n == 0) return;
    if constexpr (Scatter)
      scatter_elements_kernel<<<blocks_for(n), kBlock, 0, stream()>>>(n, idx_, axis_, size_, r_, in[1]->ptr<I>(),
                                                                      in[2]->ptr<E>(), out[0]->ptr<E>());
    else
      gather_elements_kernel<<<blocks_for(n), kBlock, 0, stream()>>>(n, idx_, axis_, size_, in[0]->ptr<E>(),
                                                                     in[1]->ptr<I>(), out[0]->ptr<E>());
    check_launch(Scatter ? "ScatterElements kernel" : "GatherElements kernel");
  }

 private:
  Shape idx_;
  int axis_;
  int64_t size_;
  Reduction r_;
};

template <bool Scatter> std::unique_ptr<Kernel> make_elements(PrepareContext& ctx) {
  const ops::ElementsAttrs a = Scatter ? ops::prepare_scatter_elements(ctx) : ops::prepare_gather_elements(ctx);
  const std::vector<int64_t>& data = ctx.inputs[0].shape;
  const int axis = static_cast<int>(a.axis);
  const Reduction red = device_reduction(a.reduction);
  // Offsets address data; the loop walks indices' shape.
  const Shape idx = shape_of(ctx, ctx.inputs[1].shape, data);
  const bool i64 = ctx.inputs[1].dtype == DType::Int64;
  std::unique_ptr<Kernel> k;
  auto make = [&](auto tag) {
    using E = typename decltype(tag)::type;
    if (i64) k = std::make_unique<ElementsKernel<E, int64_t, Scatter>>(idx, axis, data[axis], red);
    else k = std::make_unique<ElementsKernel<E, int32_t, Scatter>>(idx, axis, data[axis], red);
  };
  if constexpr (Scatter) dispatch<float, double, int32_t, int64_t>(ctx.inputs[0].dtype, make);
  else by_size(ctx, ctx.inputs[0].dtype, make);
  if (!k) ops::fail_dtype(ctx);
  return k;
}

// ---- GatherND / ScatterND --------------------------------------------------------------------------------
// Tuple t (k int64 components) addresses a slice of `slice` elements of data; GatherND has batch_dims
// leading dims shared by data and indices (ScatterND none).

struct NdGeom {
  Shape data;  // dims and strides of data
  int64_t batch_dims, tuples, k, slice, batch_stride;

  // Offset of tuple bt's slice in data, or -1 when a component is out of range.
  __device__ int64_t offset(const int64_t* idx, int64_t bt) const {
    int64_t off = (bt / tuples) * batch_stride;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t w = wrap(idx[bt * k + j], data.dims[batch_dims + j]);
      if (w < 0) return -1;
      off += w * data.strides[batch_dims + j];
    }
    return off;
  }
};

template <class E> __global__ void gather_nd_kernel(int64_t n, NdGeom g, const E* x, const int64_t* idx, E* y) {
  for (int64_t e = global_index(); e < n; e += grid_stride()) {
    const int64_t off = g.offset(idx, e / g.slice);
    y[e] = off < 0 ? E(0) : x[off + e % g.slice];
  }
}

template <class T> __global__ void scatter_nd_kernel(int64_t n, NdGeom g, Reduction r, const int64_t* idx, const T* upd, T* y) {
  for (int64_t e = global_index(); e < n; e += grid_stride()) {
    const int64_t off = g.offset(idx, e / g.slice);
    if (off >= 0) apply(r, y + off + e % g.slice, upd[e]);
  }
}

template <class E, bool Scatter> class NdKernel final : public Kernel {
 public:
  NdKernel(NdGeom g, Reduction r) : g_(g), r_(r) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    if constexpr (Scatter) copy_data(*in[0], *out[0]);
    // One thread per element of the output (GatherND) or of updates (ScatterND).
    const int64_t n = Scatter ? in[2]->numel() : out[0]->numel();
    if (n == 0) return;
    if constexpr (Scatter)
      scatter_nd_kernel<<<blocks_for(n), kBlock, 0, stream()>>>(n, g_, r_, in[1]->ptr<int64_t>(), in[2]->ptr<E>(),
                                                                out[0]->ptr<E>());
    else
      gather_nd_kernel<<<blocks_for(n), kBlock, 0, stream()>>>(n, g_, in[0]->ptr<E>(), in[1]->ptr<int64_t>(),
                                                               out[0]->ptr<E>());
    check_launch(Scatter ? "ScatterND kernel" : "GatherND kernel");
  }

 private:
  NdGeom g_;
  Reduction r_;
};

template <bool Scatter> std::unique_ptr<Kernel> make_nd(PrepareContext& ctx) {
  const ops::NdAttrs a = Scatter ? ops::prepare_scatter_nd(ctx) : ops::prepare_gather_nd(ctx);
  const std::vector<int64_t>& data = ctx.inputs[0].shape;
  NdGeom g{};
  g.data = shape_of(ctx, data, data);
  g.batch_dims = a.batch_dims;
  g.k = a.k;
  g.tuples = a.tuples;
  g.slice = a.slice;
  g.batch_stride = g.batch_dims > 0 ? g.data.strides[g.batch_dims - 1] : 0;
  std::unique_ptr<Kernel> k;
  auto make = [&](auto tag) {
    using E = typename decltype(tag)::type;
    k = std::make_unique<NdKernel<E, Scatter>>(g, device_reduction(a.reduction));
  };
  if constexpr (Scatter) dispatch<float, double, int32_t, int64_t>(ctx.inputs[0].dtype, make);
  else by_size(ctx, ctx.inputs[0].dtype, make);
  if (!k) ops::fail_dtype(ctx);
  return k;
}

}  // namespace

void register_cuda_index(KernelRegistry& r) {
  twin(r, "GatherElements", make_elements<false>);
  twin(r, "ScatterElements", make_elements<true>);
  twin(r, "GatherND", make_nd<false>);
  twin(r, "ScatterND", make_nd<true>);
}

}  // namespace onnxtrain::cuda
