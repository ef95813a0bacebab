// Reductions (ReduceSum ... ReduceLogSumExp), ArgMax/ArgMin, CumSum and TopK on CUDA.
//
// One generic strided reduction: the reduced and kept axes are folded into the fewest dims (adjacent dims
// that are both reduced or both kept merge; size-1 dims vanish), an output index decomposes over the kept
// dims and a reduction step over the reduced dims, each with its input strides. Short reductions (fewer than
// kBlockThreshold elements per output: bias-gradient columns, small rows) run one thread per output; longer
// ones one block per output with a shared-memory tree. The maths is ReduceFn of executor/functors.h, which
// the CPU kernels call too. The summation order differs from the CPU's, so float results agree to rounding.
// CumSum runs one thread per lane along the axis. TopK runs one thread per lane and selects the k elements
// one after another, O(k n) per lane: fine for the small k of classification metrics, slow for large k.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <memory>
#include <type_traits>
#include <utility>

#include "executor/cuda/common.h"
#include "executor/cuda/device_util.cuh"
#include "executor/functors.h"
#include "executor/ops/reduce.h"

namespace onnxtrain::cuda {
namespace {

constexpr int kMaxDims = 8;
constexpr int64_t kBlockThreshold = 64;

// A folded reduction: kept dims in output order and reduced dims, each with its input stride.
struct ReduceGeom {
  int nk = 0, nr = 0;
  int64_t kdims[kMaxDims], kstride[kMaxDims];
  int64_t rdims[kMaxDims], rstride[kMaxDims];
  int64_t count = 1, nout = 1;

  __device__ static int64_t offset(int64_t i, int n, const int64_t* dims, const int64_t* stride) {
    int64_t off = 0;
    for (int d = n - 1; d >= 0; --d) {
      off += (i % dims[d]) * stride[d];
      i /= dims[d];
    }
    return off;
  }
  __device__ int64_t base(int64_t o) const { return offset(o, nk, kdims, kstride); }
  __device__ int64_t step(int64_t r) const { return offset(r, nr, rdims, rstride); }
};

ReduceGeom fold(const PrepareContext& ctx, const std::vector<int64_t>& shape, const std::vector<bool>& reduced) {
  std::vector<int64_t> dims, strides;
  std::vector<bool> red;
  ReduceGeom g;
  int64_t stride = 1;
  // From the innermost dim out, so a merged dim's stride is its inner part's.
  for (size_t i = shape.size(); i-- > 0;) {
    const int64_t d = shape[i];
    (reduced[i] ? g.count : g.nout) *= d;
    if (d != 1) {
      if (!dims.empty() && red.back() == reduced[i] && strides.back() * dims.back() == stride) {
        dims.back() *= d;
      } else {
        dims.push_back(d);
        strides.push_back(stride);
        red.push_back(reduced[i]);
      }
    }
    stride *= d;
  }
  for (size_t j = dims.size(); j-- > 0;) {
    int& n = red[j] ? g.nr : g.nk;
    if (n == kMaxDims) ctx.fail("the CUDA reduction folds to more than " + std::to_string(kMaxDims) + " dims");
    (red[j] ? g.rdims : g.kdims)[n] = dims[j];
    (red[j] ? g.rstride : g.kstride)[n] = strides[j];
    ++n;
  }
  return g;
}

// One thread's share of the combine over output o's elements (threads lo, lo+step, ...).
template <class F, class T>
__device__ T partial(const F& f, const ReduceGeom& g, int64_t base, const T* x, T init, T shift, int64_t lo, int64_t step) {
  T acc = init;
  for (int64_t r = lo; r < g.count; r += step) acc = f.combine(acc, f.pre(x[base + g.step(r)], shift));
  return acc;
}

template <ReduceKind K, class T> __global__ void reduce_thread_kernel(ReduceGeom g, const T* x, T* y, T init, T max_init) {
  const ReduceFn<K> f;
  for (int64_t o = global_index(); o < g.nout; o += grid_stride()) {
    const int64_t b = g.base(o);
    T shift = T(0);
    if constexpr (K == ReduceKind::LogSumExp)
      shift = logsumexp_shift(partial(ReduceFn<ReduceKind::Max>{}, g, b, x, max_init, T(0), 0, 1));
    y[o] = f.post(partial(f, g, b, x, init, shift, 0, 1), g.count, shift);
  }
}

template <class F, class T> __device__ T block_combine(const F& f, T v, T* buf) {
  buf[threadIdx.x] = v;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) buf[threadIdx.x] = f.combine(buf[threadIdx.x], buf[threadIdx.x + s]);
    __syncthreads();
  }
  const T r = buf[0];
  __syncthreads();
  return r;
}

template <ReduceKind K, class T> __global__ void reduce_block_kernel(ReduceGeom g, const T* x, T* y, T init, T max_init) {
  __shared__ T buf[kBlock];
  const ReduceFn<K> f;
  for (int64_t o = blockIdx.x; o < g.nout; o += gridDim.x) {
    const int64_t b = g.base(o);
    T shift = T(0);
    if constexpr (K == ReduceKind::LogSumExp) {
      const ReduceFn<ReduceKind::Max> mx;
      shift = logsumexp_shift(block_combine(mx, partial(mx, g, b, x, max_init, T(0), threadIdx.x, blockDim.x), buf));
    }
    const T acc = block_combine(f, partial(f, g, b, x, init, shift, threadIdx.x, blockDim.x), buf);
    if (threadIdx.x == 0) y[o] = f.post(acc, g.count, shift);
  }
}

template <ReduceKind K, class T> class ReduceKernel final : public Kernel {
 public:
  ReduceKernel(ReduceGeom g, T init, T max_init) : g_(g), init_(init), max_init_(max_init) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    if (g_.nout == 0) return;
    const T* x = in[0]->ptr<T>();
    T* y = out[0]->ptr<T>();
    if (g_.count >= kBlockThreshold) {
      const auto blocks = static_cast<unsigned>(g_.nout < (1 << 20) ? g_.nout : (1 << 20));
      reduce_block_kernel<K, T><<<blocks, kBlock, 0, stream()>>>(g_, x, y, init_, max_init_);
    } else {
      reduce_thread_kernel<K, T><<<blocks_for(g_.nout), kBlock, 0, stream()>>>(g_, x, y, init_, max_init_);
    }
    check_launch("reduction kernel");
  }

 private:
  ReduceGeom g_;
  T init_, max_init_;
};

// Mixed precision's float16/bfloat16 ReduceSum (the bias gradient of a half Gemm, docs/gpu.md): float32
// accumulation and one rounding, the numerics of the CPU's emulation (executor/cpu/half_matmul.cpp). One thread
// per output, since these are bias-gradient columns (few outputs, a batch each).
__device__ float widen(__half v) { return __half2float(v); }
__device__ float widen(__nv_bfloat16 v) { return __bfloat162float(v); }
template <class H> __device__ H narrow(float v) {
  if constexpr (std::is_same_v<H, __half>) return __float2half_rn(v);
  else return __float2bfloat16_rn(v);
}

template <class H> __global__ void half_sum_kernel(ReduceGeom g, const H* x, H* y) {
  for (int64_t o = global_index(); o < g.nout; o += grid_stride()) {
    const int64_t b = g.base(o);
    float acc = 0.0f;
    for (int64_t r = 0; r < g.count; ++r) acc += widen(x[b + g.step(r)]);
    y[o] = narrow<H>(acc);
  }
}

template <class H> class HalfSumKernel final : public Kernel {
 public:
  explicit HalfSumKernel(ReduceGeom g) : g_(g) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    if (g_.nout == 0) return;
    half_sum_kernel<H><<<blocks_for(g_.nout), kBlock, 0, stream()>>>(g_, in[0]->ptr<H>(), out[0]->ptr<H>());
    check_launch("half-precision ReduceSum kernel");
  }

 private:
  ReduceGeom g_;
};

// The axes a node reduces, as the CPU factory (which has already validated them) reads them.
template <ReduceKind K, class T> std::unique_ptr<Kernel> reduce_kernel(const ReduceGeom& g, T init) {
  return std::make_unique<ReduceKernel<K, T>>(g, init, reduce_init<T>(ReduceKind::Max));
}

// The (kind, dtype) pairs the CPU registers (register_cpu_reduce), whose keys the twins copy; nullptr for the rest.
template <class T> std::unique_ptr<Kernel> reduce_for(ReduceKind k, const ReduceGeom& g, T init) {
  using RK = ReduceKind;
  if (k == RK::Max) return reduce_kernel<RK::Max>(g, init);
  if (k == RK::Min) return reduce_kernel<RK::Min>(g, init);
  if constexpr (!std::is_same_v<T, uint8_t>) {
    if (k == RK::Sum) return reduce_kernel<RK::Sum>(g, init);
    if (k == RK::Mean) return reduce_kernel<RK::Mean>(g, init);
    if (k == RK::Prod) return reduce_kernel<RK::Prod>(g, init);
  }
  if constexpr (std::is_floating_point_v<T>) {
    switch (k) {
      case RK::SumSquare: return reduce_kernel<RK::SumSquare>(g, init);
      case RK::L1: return reduce_kernel<RK::L1>(g, init);
      case RK::L2: return reduce_kernel<RK::L2>(g, init);
      case RK::LogSum: return reduce_kernel<RK::LogSum>(g, init);
      case RK::LogSumExp: return reduce_kernel<RK::LogSumExp>(g, init);
      default: break;
    }
  }
  return nullptr;
}

KernelFactory reduce(ReduceKind kind, int64_t axes_input_since) {
  return [kind, axes_input_since](PrepareContext& ctx) -> std::unique_ptr<Kernel> {
    const ops::ReduceAxes axes = ops::prepare_reduce(ctx, axes_input_since);
    if (axes.identity) return std::make_unique<DeviceCopyKernel>();
    const ReduceGeom g = fold(ctx, ctx.inputs[0].shape, axes.reduced);
    std::unique_ptr<Kernel> k;
    const DType t = ctx.inputs[0].dtype;
    if (t == DType::Float16 || t == DType::BFloat16) {
      if (kind == ReduceKind::Sum) {
        if (t == DType::Float16) k = std::make_unique<HalfSumKernel<__half>>(g);
        else k = std::make_unique<HalfSumKernel<__nv_bfloat16>>(g);
      }
    } else if (t == DType::Bool) {
      // One byte holding 0 or 1: max/min are or/and, and an empty-set min is true (as on the CPU).
      k = reduce_for<uint8_t>(kind, g, kind == ReduceKind::Min ? uint8_t{1} : uint8_t{0});
    } else {
      dispatch<float, double, int64_t, int32_t>(t, [&](auto tag) {
        using T = typename decltype(tag)::type;
        k = reduce_for<T>(kind, g, reduce_init<T>(kind));
      });
    }
    if (!k) ops::fail_dtype(ctx);
    return k;
  };
}

// ArgMax/ArgMin: one thread per (outer, inner) lane scans the axis, as the CPU kernel does.
template <bool IsMax, class T>
__global__ void arg_kernel(int64_t lanes, int64_t n, int64_t inner, bool last, const T* x, int64_t* y) {
  for (int64_t lane = global_index(); lane < lanes; lane += grid_stride()) {
    const T* xs = x + (lane / inner) * n * inner + lane % inner;
    T best = xs[0];
    int64_t bi = 0;
    for (int64_t k = 1; k < n; ++k)
      if (arg_better<IsMax>(xs[k * inner], best, last)) {
        best = xs[k * inner];
        bi = k;
      }
    y[lane] = bi;
  }
}

template <bool IsMax, class T> class ArgKernel final : public Kernel {
 public:
  ArgKernel(int64_t n, int64_t inner, bool last) : n_(n), inner_(inner), last_(last) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const int64_t lanes = out[0]->numel();
    if (lanes == 0) return;
    arg_kernel<IsMax, T><<<blocks_for(lanes), kBlock, 0, stream()>>>(lanes, n_, inner_, last_, in[0]->ptr<T>(),
                                                                     out[0]->ptr<int64_t>());
    check_launch("ArgMax/ArgMin kernel");
  }

 private:
  int64_t n_, inner_;
  bool last_;
};

template <bool IsMax> std::unique_ptr<Kernel> make_arg(PrepareContext& ctx) {
  const ops::ArgAttrs a = ops::prepare_arg(ctx);
  const bool last = a.select_last;
  const int64_t n = a.split.n, inner = a.split.inner;
  std::unique_ptr<Kernel> k;
  dispatch<float, double, int64_t, int32_t>(ctx.inputs[0].dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    k = std::make_unique<ArgKernel<IsMax, T>>(n, inner, last);
  });
  if (!k) ops::fail_dtype(ctx);
  return k;
}

// ---- CumSum ----------------------------------------------------------------------------------------------

template <class T>
__global__ void cumsum_kernel(int64_t lanes, int64_t n, int64_t inner, bool exclusive, bool reverse, const T* x, T* y) {
  for (int64_t lane = global_index(); lane < lanes; lane += grid_stride()) {
    const int64_t base = (lane / inner) * n * inner + lane % inner;
    T acc = T(0);
    for (int64_t s = 0; s < n; ++s) {
      const int64_t at = base + (reverse ? n - 1 - s : s) * inner;
      const T v = x[at];
      if (exclusive) y[at] = acc;
      acc += v;
      if (!exclusive) y[at] = acc;
    }
  }
}

template <class T> class CumSumKernel final : public Kernel {
 public:
  CumSumKernel(int64_t n, int64_t inner, bool exclusive, bool reverse)
      : n_(n), inner_(inner), exclusive_(exclusive), reverse_(reverse) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const int64_t lanes = n_ ? out[0]->numel() / n_ : 0;
    if (lanes == 0) return;
    cumsum_kernel<<<blocks_for(lanes), kBlock, 0, stream()>>>(lanes, n_, inner_, exclusive_, reverse_, in[0]->ptr<T>(),
                                                              out[0]->ptr<T>());
    check_launch("CumSum kernel");
  }

 private:
  int64_t n_, inner_;
  bool exclusive_, reverse_;
};

// K<T>(args...) for input 0's dtype among the numeric types CumSum and TopK take.
template <template <class> class K, class... A> std::unique_ptr<Kernel> numeric(const PrepareContext& ctx, A... args) {
  std::unique_ptr<Kernel> k;
  dispatch<float, double, int32_t, int64_t>(ctx.inputs[0].dtype, [&](auto tag) {
    k = std::make_unique<K<typename decltype(tag)::type>>(args...);
  });
  if (!k) ops::fail_dtype(ctx);
  return k;
}

std::unique_ptr<Kernel> make_cumsum(PrepareContext& ctx) {
  const ops::CumSumAttrs a = ops::prepare_cumsum(ctx);
  return numeric<CumSumKernel>(ctx, a.split.n, a.split.inner, a.exclusive, a.reverse);
}

// ---- TopK ------------------------------------------------------------------------------------------------
// The order is the CPU's: by value (descending when largest), equal values by lower index. Each step takes
// the first element, in that order, that comes after the previous pick.

template <class T>
__global__ void topk_kernel(int64_t lanes, int64_t n, int64_t inner, int64_t k, bool largest, const T* x, T* vals,
                            int64_t* idx) {
  for (int64_t lane = global_index(); lane < lanes; lane += grid_stride()) {
    const int64_t o = lane / inner, i = lane % inner;
    const T* xs = x + o * n * inner + i;
    auto before = [&](int64_t a, int64_t b) {
      const T va = xs[a * inner], vb = xs[b * inner];
      if (va != vb) return largest ? va > vb : va < vb;
      return a < b;
    };
    int64_t prev = -1;
    for (int64_t j = 0; j < k; ++j) {
      int64_t pick = -1;
      for (int64_t e = 0; e < n; ++e)
        if ((prev < 0 || before(prev, e)) && (pick < 0 || before(e, pick))) pick = e;
      const int64_t at = (o * k + j) * inner + i;
      vals[at] = xs[pick * inner];
      if (idx) idx[at] = pick;
      prev = pick;
    }
  }
}

template <class T> class TopKKernel final : public Kernel {
 public:
  TopKKernel(int64_t n, int64_t inner, int64_t k, bool largest) : n_(n), inner_(inner), k_(k), largest_(largest) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const int64_t lanes = k_ ? out[0]->numel() / k_ : 0;
    if (lanes == 0) return;
    int64_t* idx = out.size() > 1 && out[1] ? out[1]->ptr<int64_t>() : nullptr;
    topk_kernel<<<blocks_for(lanes), kBlock, 0, stream()>>>(lanes, n_, inner_, k_, largest_, in[0]->ptr<T>(),
                                                            out[0]->ptr<T>(), idx);
    check_launch("TopK kernel");
  }

 private:
  int64_t n_, inner_, k_;
  bool largest_;
};

std::unique_ptr<Kernel> make_topk(PrepareContext& ctx) {
  const ops::TopKAttrs a = ops::prepare_topk(ctx);
  return numeric<TopKKernel>(ctx, a.split.n, a.split.inner, a.k, a.largest);
}

}  // namespace

void register_cuda_reduce(KernelRegistry& r) {
  using RK = ReduceKind;
  struct Entry {
    const char* op;
    RK kind;
    int64_t axes_input_since;  // as register_cpu_reduce
  };
  const Entry entries[] = {
      {"ReduceSum", RK::Sum, 13},        {"ReduceMean", RK::Mean, 18},     {"ReduceMax", RK::Max, 18},
      {"ReduceMin", RK::Min, 18},        {"ReduceProd", RK::Prod, 18},     {"ReduceSumSquare", RK::SumSquare, 18},
      {"ReduceL1", RK::L1, 18},          {"ReduceL2", RK::L2, 18},         {"ReduceLogSum", RK::LogSum, 18},
      {"ReduceLogSumExp", RK::LogSumExp, 18},
  };
  for (const Entry& e : entries) twin(r, e.op, reduce(e.kind, e.axes_input_since));
  twin(r, "ArgMax", make_arg<true>);
  twin(r, "ArgMin", make_arg<false>);
  twin(r, "CumSum", make_cumsum);
  twin(r, "TopK", make_topk);
}

}  // namespace onnxtrain::cuda
