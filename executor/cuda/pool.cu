// MaxPool, AveragePool, the global pools and the fused MaxPoolGrad / AveragePoolGrad on CUDA: the pooling family
// (CPU: executor/cpu/pool.cpp; rules: gradients/rules/pool.cpp). Direct kernels, one thread per output element
// (or per input element for the gradients) gathering its whole window, so there are no atomics and the result
// does not depend on scheduling; ties and NaNs in MaxPool follow the CPU (first maximum in tap order, a NaN
// wins), and AveragePool's divisors are the CPU's own, computed on the host and uploaded once (cuDNN's pooling
// takes symmetric pads only and counts ceil_mode windows differently). Not run on a GPU here: it compiles for
// sm_80/sm_90.
#include <array>
#include <cmath>
#include <memory>
#include <utility>
#include <vector>

#include "executor/ops/conv_geometry.h"
#include "executor/ops/pool.h"
#include "executor/cuda/common.h"
#include "executor/cuda/device_util.cuh"
#include "executor/cuda/window.cuh"

namespace onnxtrain::cuda {
namespace {

// The first maximum of output o's window in plane xp (a NaN wins), as the CPU's max_pool_row picks it:
// taps in row-major order. Returns the offset within the plane, or -1 when the window holds no input.
template <class T> __device__ int64_t window_argmax(const DGeo& g, const T* xp, const int64_t (&o)[3], T& best) {
  int64_t arg = -1;
  best = T(0);
  for_each_tap(g, o, [&](int64_t at, int64_t) {
    const T v = xp[at];
    if (arg < 0 || v > best || (v != v && best == best)) {
      best = v;
      arg = at;
    }
  });
  return arg;
}

// storage_order=1: the offset within the plane with the spatial dims in column-major order.
__device__ int64_t col_major(const DGeo& g, int rank, int64_t at) {
  int64_t pos[3];
  split3(at, g.in, pos);
  int64_t r = 0, mul = 1;
  for (int a = 3 - rank; a < 3; ++a) {
    r += pos[a] * mul;
    mul *= g.in[a];
  }
  return r;
}

template <class T>
__global__ void max_pool_kernel(DGeo g, int rank, bool col, const T* x, T* y, int64_t* idx) {
  const int64_t osz = g.osz(), isz = g.isz();
  for (int64_t e = global_index(); e < g.N * g.C * osz; e += grid_stride()) {
    const int64_t p = e / osz;
    int64_t o[3];
    split3(e % osz, g.out, o);
    T best;
    const int64_t arg = window_argmax(g, x + p * isz, o, best);
    y[e] = arg < 0 ? -INFINITY : best;
    if (idx) idx[e] = arg < 0 ? -1 : p * isz + (col ? col_major(g, rank, arg) : arg);
  }
}

// dx[i] = the sum of dy over the windows whose first maximum is i: each input gathers from the windows that
// can read it and recomputes their argmax (no scatter, no atomics).
template <class T> __global__ void max_pool_grad_kernel(DGeo g, const T* dy, const T* x, T* dx) {
  const int64_t osz = g.osz(), isz = g.isz();
  for (int64_t e = global_index(); e < g.N * g.C * isz; e += grid_stride()) {
    const int64_t p = e / isz, at = e % isz;
    int64_t i[3];
    split3(at, g.in, i);
    T acc = 0;
    for_each_reader(g, i, [&](int64_t oat, const int64_t (&o)[3], int64_t) {
      T best;
      if (window_argmax(g, x + p * isz, o, best) == at) acc += dy[p * osz + oat];
    });
    dx[e] = acc;
  }
}

template <class T> __global__ void avg_pool_kernel(DGeo g, const T* inv, const T* x, T* y) {
  const int64_t osz = g.osz(), isz = g.isz();
  for (int64_t e = global_index(); e < g.N * g.C * osz; e += grid_stride()) {
    const T* xp = x + (e / osz) * isz;
    int64_t o[3];
    split3(e % osz, g.out, o);
    T acc = 0;
    for_each_tap(g, o, [&](int64_t i, int64_t) { acc += xp[i]; });
    y[e] = acc * inv[e % osz];
  }
}

template <class T> __global__ void avg_pool_grad_kernel(DGeo g, const T* inv, const T* dy, T* dx) {
  const int64_t osz = g.osz(), isz = g.isz();
  for (int64_t e = global_index(); e < g.N * g.C * isz; e += grid_stride()) {
    const T* dyp = dy + (e / isz) * osz;
    int64_t i[3];
    split3(e % isz, g.in, i);
    T acc = 0;
    for_each_reader(g, i, [&](int64_t o, const int64_t (&)[3], int64_t) { acc += dyp[o] * inv[o]; });
    dx[e] = acc;
  }
}

template <class T, bool Max> __global__ void global_pool_kernel(int64_t planes, int64_t size, const T* x, T* y) {
  for (int64_t p = global_index(); p < planes; p += grid_stride()) {
    const T* xp = x + p * size;
    if constexpr (Max) {
      T m = -INFINITY;
      for (int64_t i = 0; i < size; ++i)
        if (xp[i] > m || xp[i] != xp[i]) m = xp[i];
      y[p] = m;
    } else {
      double s = 0;  // as the CPU: a large plane loses float digits otherwise
      for (int64_t i = 0; i < size; ++i) s += xp[i];
      y[p] = static_cast<T>(s / static_cast<double>(size));
    }
  }
}

// ---- kernels ----------------------------------------------------------------------------------------------


template <class T> class MaxPoolKernel final : public Kernel {
 public:
  MaxPoolKernel(DGeo g, int rank, bool indices, bool col) : g_(g), rank_(rank), indices_(indices), col_(col) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const int64_t n = out[0]->numel();
    if (n == 0) return;
    max_pool_kernel<T><<<blocks_for(n), kBlock, 0, stream()>>>(g_, rank_, col_, in[0]->ptr<T>(), out[0]->ptr<T>(),
                                                               indices_ ? out[1]->ptr<int64_t>() : nullptr);
    check_launch("MaxPool kernel");
  }

 private:
  DGeo g_;
  int rank_;
  bool indices_, col_;
};

template <class T> class MaxPoolGradKernel final : public Kernel {
 public:
  explicit MaxPoolGradKernel(DGeo g) : g_(g) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const int64_t n = out[0]->numel();
    if (n == 0) return;
    max_pool_grad_kernel<T><<<blocks_for(n), kBlock, 0, stream()>>>(g_, in[0]->ptr<T>(), in[1]->ptr<T>(),
                                                                     out[0]->ptr<T>());
    check_launch("MaxPoolGrad kernel");
  }

 private:
  DGeo g_;
};

// AveragePool and its gradient: the reciprocal divisors per output position, counted by the CPU's
// avg_pool_count and uploaded at plan time.
template <class T> class AvgPoolKernel final : public Kernel {
 public:
  AvgPoolKernel(const ops::Geo& g, bool include_pad, bool grad) : g_(device_geo(g)), grad_(grad) {
    std::vector<T> inv(static_cast<size_t>(g.out_size()));
    for (int64_t o0 = 0; o0 < g.out[0]; ++o0)
      for (int64_t o1 = 0; o1 < g.out[1]; ++o1)
        for (int64_t o2 = 0; o2 < g.out[2]; ++o2)
          inv[static_cast<size_t>((o0 * g.out[1] + o1) * g.out[2] + o2)] =
              T(1) / static_cast<T>(ops::avg_pool_count(g, {o0, o1, o2}, include_pad));
    inv_ = static_cast<T*>(allocate(inv.size() * sizeof(T)));
    check(cudaMemcpy(inv_, inv.data(), inv.size() * sizeof(T), cudaMemcpyHostToDevice), "AveragePool divisors upload");
  }
  ~AvgPoolKernel() override { release(inv_); }
  AvgPoolKernel(const AvgPoolKernel&) = delete;
  AvgPoolKernel& operator=(const AvgPoolKernel&) = delete;

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const int64_t n = out[0]->numel();
    if (n == 0) return;
    if (grad_)
      avg_pool_grad_kernel<T><<<blocks_for(n), kBlock, 0, stream()>>>(g_, inv_, in[0]->ptr<T>(), out[0]->ptr<T>());
    else
      avg_pool_kernel<T><<<blocks_for(n), kBlock, 0, stream()>>>(g_, inv_, in[0]->ptr<T>(), out[0]->ptr<T>());
    check_launch(grad_ ? "AveragePoolGrad kernel" : "AveragePool kernel");
  }

 private:
  DGeo g_;
  bool grad_;
  T* inv_ = nullptr;
};

template <class T, bool Max> class GlobalPoolKernel final : public Kernel {
 public:
  GlobalPoolKernel(int64_t planes, int64_t size) : planes_(planes), size_(size) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    if (planes_ == 0) return;
    global_pool_kernel<T, Max><<<blocks_for(planes_), kBlock, 0, stream()>>>(planes_, size_, in[0]->ptr<T>(),
                                                                              out[0]->ptr<T>());
    check_launch(Max ? "GlobalMaxPool kernel" : "GlobalAveragePool kernel");
  }

 private:
  int64_t planes_, size_;
};

// ---- factories: validation, attributes and output shapes come from the op layer (executor/ops/pool.h) -----

std::unique_ptr<Kernel> make_max_pool(PrepareContext& ctx) {
  const ops::MaxPoolAttrs a = ops::prepare_max_pool(ctx);
  const ops::Geo& g = a.g;
  return by_dtype<MaxPoolKernel>(ctx.inputs[0].dtype, device_geo(g), static_cast<int>(g.rank), a.indices,
                                 a.column_major);
}

std::unique_ptr<Kernel> make_max_pool_grad(PrepareContext& ctx) {
  const ops::Geo g = ops::prepare_max_pool_grad(ctx);
  return by_dtype<MaxPoolGradKernel>(ctx.inputs[1].dtype, device_geo(g));
}

std::unique_ptr<Kernel> make_avg_pool(PrepareContext& ctx) {
  const ops::AvgPoolAttrs a = ops::prepare_avg_pool(ctx);
  return by_dtype<AvgPoolKernel>(ctx.inputs[0].dtype, a.g, a.include_pad, false);
}

std::unique_ptr<Kernel> make_avg_pool_grad(PrepareContext& ctx) {
  const ops::AvgPoolAttrs a = ops::prepare_avg_pool_grad(ctx);
  return by_dtype<AvgPoolKernel>(ctx.inputs[1].dtype, a.g, a.include_pad, true);
}

template <bool Max> std::unique_ptr<Kernel> make_global_pool(PrepareContext& ctx) {
  const ops::GlobalPoolGeometry g = ops::prepare_global_pool(ctx);
  if (ctx.inputs[0].dtype == DType::Float64) return std::make_unique<GlobalPoolKernel<double, Max>>(g.planes, g.size);
  return std::make_unique<GlobalPoolKernel<float, Max>>(g.planes, g.size);
}

}  // namespace

void register_cuda_pool(KernelRegistry& r) {
  twin(r, "MaxPool", make_max_pool);
  twin(r, "onnxtrain", "MaxPoolGrad", make_max_pool_grad);
  twin(r, "AveragePool", make_avg_pool);
  twin(r, "onnxtrain", "AveragePoolGrad", make_avg_pool_grad);
  twin(r, "GlobalAveragePool", make_global_pool<false>);
  twin(r, "GlobalMaxPool", make_global_pool<true>);
}

}  // namespace onnxtrain::cuda
