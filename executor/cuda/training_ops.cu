// The ai.onnx.preview.training optimizer ops (Momentum, Adam, Adagrad) on CUDA. R and T are device scalars
// that change every step, so they are read on the device: the first thread of each block derives the step's
// coefficients with the same *_step() functions the CPU calls (executor/functors.h), and every element then
// applies the shared update functor. No host round trip per step.
// Also the optimizer's own update ops (onnxtrain.AdamUpdate, SgdUpdate, AdagradUpdate and their variants): each
// element runs the formulas/optimizer_updates.h template, the template the CPU kernel (executor/cpu/fused_update.cpp) and the op's function body
// evaluate, with its scalars read on the device.
#include <memory>

#include "executor/cuda/common.h"
#include "executor/cuda/device_util.cuh"
#include "executor/functors.h"
#include "executor/ops/optimizer_updates.h"
#include "executor/ops/training_ops.h"
#include "formulas/optimizer_updates.h"

namespace onnxtrain::cuda {
namespace {

struct Scalars {
  const void* r;
  bool r_double;
  const int64_t* t;
  __device__ double rate() const {
    return r_double ? *static_cast<const double*>(r) : static_cast<double>(*static_cast<const float*>(r));
  }
};

using MomentumAttrs = ops::PreviewMomentumAttrs;
using AdamAttrs = ops::PreviewAdamAttrs;
using AdagradAttrs = ops::PreviewAdagradAttrs;

template <class T>
__global__ void momentum_kernel(Scalars s, MomentumAttrs a, int64_t n, const T* x, const T* g, const T* v, T* xo, T* vo) {
  __shared__ MomentumStep<T> step;
  if (threadIdx.x == 0) step = momentum_step<T>(s.rate(), *s.t, a.alpha, a.beta, a.norm, a.nesterov);
  __syncthreads();
  for (int64_t i = global_index(); i < n; i += grid_stride()) step(x[i], g[i], v[i], xo[i], vo[i]);
}

template <class T>
__global__ void adam_kernel(Scalars s, AdamAttrs a, int64_t n, const T* x, const T* g, const T* v, const T* h, T* xo,
                            T* vo, T* ho) {
  __shared__ AdamStep<T> step;
  if (threadIdx.x == 0) step = adam_step<T>(s.rate(), *s.t, a.alpha, a.beta, a.epsilon, a.norm, a.norm_post);
  __syncthreads();
  for (int64_t i = global_index(); i < n; i += grid_stride()) step(x[i], g[i], v[i], h[i], xo[i], vo[i], ho[i]);
}

template <class T>
__global__ void adagrad_kernel(Scalars s, AdagradAttrs a, int64_t n, const T* x, const T* g, const T* h, T* xo, T* ho) {
  __shared__ AdagradStep<T> step;
  if (threadIdx.x == 0) step = adagrad_step<T>(s.rate(), *s.t, a.decay, a.epsilon, a.norm);
  __syncthreads();
  for (int64_t i = global_index(); i < n; i += grid_stride()) step(x[i], g[i], h[i], xo[i], ho[i]);
}

Scalars scalars(std::span<const Tensor* const> in) {
  return {in[0]->data, in[0]->dtype == DType::Float64, in[1]->ptr<int64_t>()};
}

// Inputs R, T, then `groups` blocks of n tensors; outputs `groups - 1` blocks of n.
template <class T> class MomentumKernel final : public Kernel {
 public:
  MomentumKernel(size_t n, MomentumAttrs a) : n_(n), a_(a) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    for (size_t i = 0; i < n_; ++i) {
      const int64_t m = out[i]->numel();
      if (m == 0) continue;
      momentum_kernel<T><<<blocks_for(m), kBlock, 0, stream()>>>(
          scalars(in), a_, m, in[2 + i]->ptr<T>(), in[2 + n_ + i]->ptr<T>(), in[2 + 2 * n_ + i]->ptr<T>(),
          out[i]->ptr<T>(), out[n_ + i]->ptr<T>());
      check_launch("Momentum kernel");
    }
  }

 private:
  size_t n_;
  MomentumAttrs a_;
};

template <class T> class AdamKernel final : public Kernel {
 public:
  AdamKernel(size_t n, AdamAttrs a) : n_(n), a_(a) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    for (size_t i = 0; i < n_; ++i) {
      const int64_t m = out[i]->numel();
      if (m == 0) continue;
      adam_kernel<T><<<blocks_for(m), kBlock, 0, stream()>>>(
          scalars(in), a_, m, in[2 + i]->ptr<T>(), in[2 + n_ + i]->ptr<T>(), in[2 + 2 * n_ + i]->ptr<T>(),
          in[2 + 3 * n_ + i]->ptr<T>(), out[i]->ptr<T>(), out[n_ + i]->ptr<T>(), out[2 * n_ + i]->ptr<T>());
      check_launch("Adam kernel");
    }
  }

 private:
  size_t n_;
  AdamAttrs a_;
};

template <class T> class AdagradKernel final : public Kernel {
 public:
  AdagradKernel(size_t n, AdagradAttrs a) : n_(n), a_(a) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    for (size_t i = 0; i < n_; ++i) {
      const int64_t m = out[i]->numel();
      if (m == 0) continue;
      adagrad_kernel<T><<<blocks_for(m), kBlock, 0, stream()>>>(scalars(in), a_, m, in[2 + i]->ptr<T>(),
                                                               in[2 + n_ + i]->ptr<T>(), in[2 + 2 * n_ + i]->ptr<T>(),
                                                               out[i]->ptr<T>(), out[n_ + i]->ptr<T>());
      check_launch("Adagrad kernel");
    }
  }

 private:
  size_t n_;
  AdagradAttrs a_;
};

// The attributes and the checks of R, T and the groups: ops::prepare_preview_* (executor/ops/training_ops.h), as on
// the CPU.
std::unique_ptr<Kernel> make_momentum(PrepareContext& ctx) {
  const auto u = ops::prepare_preview_momentum(ctx);
  if (u.dtype == DType::Float64) return std::make_unique<MomentumKernel<double>>(u.n, u.attrs);
  return std::make_unique<MomentumKernel<float>>(u.n, u.attrs);
}

std::unique_ptr<Kernel> make_adam(PrepareContext& ctx) {
  const auto u = ops::prepare_preview_adam(ctx);
  if (u.dtype == DType::Float64) return std::make_unique<AdamKernel<double>>(u.n, u.attrs);
  return std::make_unique<AdamKernel<float>>(u.n, u.attrs);
}

std::unique_ptr<Kernel> make_adagrad(PrepareContext& ctx) {
  const auto u = ops::prepare_preview_adagrad(ctx);
  if (u.dtype == DType::Float64) return std::make_unique<AdagradKernel<double>>(u.n, u.attrs);
  return std::make_unique<AdagradKernel<float>>(u.n, u.attrs);
}

// ---- onnxtrain.Adam*Update (formulas/optimizer_updates.h) --------------------------------------------------------

using formulas::AdamDecay;

template <class T> struct AdamArrays {
  const T *p, *g, *m, *v, *vmax;  // vmax: amsgrad only
  T *p_out, *m_out, *v_out, *vmax_out;
};
template <class T> struct AdamScalarPointers {
  const T* s[8];  // kAdamScalarNames' order; the last only with a decay
};

// The scalars live on the device and change every step; each thread reads them (one cached line), then runs the
// formula on its elements. Without -ffp-contract=off nvcc may fuse a*b + c into an FMA, which rounds once: the
// GPU's results may differ from the CPU's in the last bit (docs/gpu.md), as for every elementwise kernel.
template <class T, AdamDecay Decay, bool Amsgrad>
__global__ void adam_update_kernel(int64_t n, AdamArrays<T> a, AdamScalarPointers<T> sp) {
  formulas::AdamScalars<T> s{*sp.s[0], *sp.s[1], *sp.s[2], *sp.s[3], *sp.s[4], *sp.s[5], *sp.s[6], T(0)};
  if constexpr (Decay != AdamDecay::None) s.decay = *sp.s[7];
  for (int64_t i = global_index(); i < n; i += grid_stride()) {
    T vm(0);
    if constexpr (Amsgrad) vm = a.vmax[i];
    const formulas::AdamState<T> r = formulas::adam_update<Decay, Amsgrad>(a.p[i], a.g[i], a.m[i], a.v[i], vm, s);
    a.p_out[i] = r.p;
    a.m_out[i] = r.m;
    a.v_out[i] = r.v;
    if constexpr (Amsgrad) a.vmax_out[i] = r.vmax;
  }
}

template <class T, AdamDecay Decay, bool Amsgrad> class AdamUpdateKernel final : public Kernel {
 public:
  explicit AdamUpdateKernel(int64_t n) : n_(n) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    if (n_ == 0) return;
    constexpr size_t arrays = formulas::adam_array_inputs(Amsgrad);
    AdamArrays<T> a{in[0]->ptr<T>(), in[1]->ptr<T>(), in[2]->ptr<T>(), in[3]->ptr<T>(),
                    Amsgrad ? in[4]->ptr<T>() : nullptr, out[0]->ptr<T>(), out[1]->ptr<T>(), out[2]->ptr<T>(),
                    Amsgrad ? out[3]->ptr<T>() : nullptr};
    AdamScalarPointers<T> sp{};
    for (size_t k = 0; k < static_cast<size_t>(formulas::adam_scalar_inputs(Decay)); ++k)
      sp.s[k] = in[arrays + k]->ptr<T>();
    adam_update_kernel<T, Decay, Amsgrad><<<blocks_for(n_), kBlock, 0, stream()>>>(n_, a, sp);
    check_launch("Adam update kernel");
  }

 private:
  int64_t n_;
};

KernelFactory adam_update_factory(AdamDecay decay, bool amsgrad) {
  return [decay, amsgrad](PrepareContext& ctx) -> std::unique_ptr<Kernel> {
    ops::prepare_adam_update(ctx, decay, amsgrad);  // checks and shapes, shared with the CPU kernel
    const int64_t n = numel_of(ctx.inputs[0].shape);
    const bool f64 = ctx.inputs[0].dtype == DType::Float64;
    return formulas::with_adam_variant(decay, amsgrad, [&]<AdamDecay D, bool A>() -> std::unique_ptr<Kernel> {
      if (f64) return std::make_unique<AdamUpdateKernel<double, D, A>>(n);
      return std::make_unique<AdamUpdateKernel<float, D, A>>(n);
    });
  };
}

// ---- onnxtrain.Sgd*Update and Adagrad*Update (formulas/optimizer_updates.h) -----------------------------------------

using formulas::SgdMomentum;

template <class T, bool L2, SgdMomentum Momentum>
__global__ void sgd_update_kernel(int64_t n, const T* p, const T* g, const T* buf, const bool* first, T* p_out,
                                  T* buf_out, const T* lr, const T* decay, const T* momentum, const T* one_minus_d) {
  formulas::SgdScalars<T> s{*lr, T(0), T(0), T(0)};
  bool first_step = false;
  if constexpr (L2) s.decay = *decay;
  if constexpr (Momentum != SgdMomentum::None) {
    s.momentum = *momentum;
    s.one_minus_dampening = *one_minus_d;
    first_step = *first;
  }
  for (int64_t i = global_index(); i < n; i += grid_stride()) {
    T b(0);
    if constexpr (Momentum != SgdMomentum::None) b = buf[i];
    const formulas::SgdState<T> r = formulas::sgd_update<L2, Momentum>(p[i], g[i], b, first_step, s);
    p_out[i] = r.p;
    if constexpr (Momentum != SgdMomentum::None) buf_out[i] = r.buf;
  }
}

template <class T, bool L2, SgdMomentum Momentum> class SgdUpdateKernel final : public Kernel {
 public:
  explicit SgdUpdateKernel(int64_t n) : n_(n) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    if (n_ == 0) return;
    constexpr bool with_buffer = Momentum != SgdMomentum::None;
    size_t k = with_buffer ? 4 : 2;  // the first scalar
    const T* lr = in[k++]->ptr<T>();
    const T* decay = L2 ? in[k++]->ptr<T>() : nullptr;
    const T* momentum = with_buffer ? in[k++]->ptr<T>() : nullptr;
    const T* one_minus_d = with_buffer ? in[k++]->ptr<T>() : nullptr;
    sgd_update_kernel<T, L2, Momentum><<<blocks_for(n_), kBlock, 0, stream()>>>(
        n_, in[0]->ptr<T>(), in[1]->ptr<T>(), with_buffer ? in[2]->ptr<T>() : nullptr,
        with_buffer ? in[3]->ptr<bool>() : nullptr, out[0]->ptr<T>(), with_buffer ? out[1]->ptr<T>() : nullptr, lr,
        decay, momentum, one_minus_d);
    check_launch("SGD update kernel");
  }

 private:
  int64_t n_;
};

template <class T, bool L2>
__global__ void adagrad_update_kernel(int64_t n, const T* p, const T* g, const T* sum, T* p_out, T* sum_out,
                                      const T* clr, const T* eps, const T* decay) {
  const formulas::AdagradScalars<T> s{*clr, *eps, L2 ? *decay : T(0)};
  for (int64_t i = global_index(); i < n; i += grid_stride()) {
    const formulas::AdagradState<T> r = formulas::adagrad_update<L2>(p[i], g[i], sum[i], s);
    p_out[i] = r.p;
    sum_out[i] = r.sum;
  }
}

template <class T, bool L2> class AdagradUpdateKernel final : public Kernel {
 public:
  explicit AdagradUpdateKernel(int64_t n) : n_(n) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    if (n_ == 0) return;
    adagrad_update_kernel<T, L2><<<blocks_for(n_), kBlock, 0, stream()>>>(
        n_, in[0]->ptr<T>(), in[1]->ptr<T>(), in[2]->ptr<T>(), out[0]->ptr<T>(), out[1]->ptr<T>(), in[3]->ptr<T>(),
        in[4]->ptr<T>(), L2 ? in[5]->ptr<T>() : nullptr);
    check_launch("Adagrad update kernel");
  }

 private:
  int64_t n_;
};

KernelFactory sgd_update_factory(bool l2, SgdMomentum momentum) {
  return [l2, momentum](PrepareContext& ctx) -> std::unique_ptr<Kernel> {
    ops::prepare_sgd_update(ctx, l2, momentum);
    const int64_t n = numel_of(ctx.inputs[0].shape);
    const bool f64 = ctx.inputs[0].dtype == DType::Float64;
    return formulas::with_sgd_variant(l2, momentum, [&]<bool L, SgdMomentum M>() -> std::unique_ptr<Kernel> {
      if (f64) return std::make_unique<SgdUpdateKernel<double, L, M>>(n);
      return std::make_unique<SgdUpdateKernel<float, L, M>>(n);
    });
  };
}

KernelFactory adagrad_update_factory(bool l2) {
  return [l2](PrepareContext& ctx) -> std::unique_ptr<Kernel> {
    ops::prepare_adagrad_update(ctx, l2);
    const int64_t n = numel_of(ctx.inputs[0].shape);
    const bool f64 = ctx.inputs[0].dtype == DType::Float64;
    if (l2) {
      if (f64) return std::make_unique<AdagradUpdateKernel<double, true>>(n);
      return std::make_unique<AdagradUpdateKernel<float, true>>(n);
    }
    if (f64) return std::make_unique<AdagradUpdateKernel<double, false>>(n);
    return std::make_unique<AdagradUpdateKernel<float, false>>(n);
  };
}

}  // namespace

void register_cuda_training_ops(KernelRegistry& r) {
  for (AdamDecay decay : formulas::kAdamDecays)
    for (bool amsgrad : {false, true})
      twin(r, "onnxtrain", formulas::adam_update_op(decay, amsgrad), adam_update_factory(decay, amsgrad));
  for (bool l2 : {false, true}) {
    for (SgdMomentum momentum : formulas::kSgdMomenta)
      twin(r, "onnxtrain", formulas::sgd_update_op(l2, momentum), sgd_update_factory(l2, momentum));
    twin(r, "onnxtrain", formulas::adagrad_update_op(l2), adagrad_update_factory(l2));
  }
  const char* const domain = "ai.onnx.preview.training";
  twin(r, domain, "Momentum", make_momentum);
  twin(r, domain, "Adam", make_adam);
  twin(r, domain, "Adagrad", make_adagrad);
}

}  // namespace onnxtrain::cuda
