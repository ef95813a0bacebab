// Compiled with -ffp-contract=off (CMakeLists.txt): a*b + c must round twice, as the function body's separate Mul
// and Add nodes do, or the kernel and the body would differ in the last bit. -fno-math-errno lets std::sqrt
// vectorise.
#include "executor/cpu/fused_update.h"

#include <memory>

#include "executor/broadcast.h"
#include "executor/cpu/kernel_util.h"
#include "executor/ops/kernel_util.h"
#include "executor/ops/optimizer_updates.h"
#include "formulas/optimizer_updates.h"

namespace onnxtrain {
namespace {

using formulas::AdamDecay;
using formulas::AdamScalars;

// __restrict: with up to nine pointers the compiler's run-time alias checks exceed its limit and it would not
// vectorise at all. The outputs are plan buffers, never an input or the state they will replace; inputs may share
// memory, as they are only read.
template <class T, AdamDecay Decay, bool Amsgrad>
void adam_loop(const T* __restrict p, const T* __restrict g, const T* __restrict m, const T* __restrict v,
               const T* __restrict vmax, T* __restrict p_out, T* __restrict m_out, T* __restrict v_out,
               T* __restrict vmax_out, int64_t begin, int64_t end, const AdamScalars<T> s) {
  // GCC 12 does not use the parameters' __restrict for this loop (inlined into the parallel lambda) and would need 16
  // run-time alias checks, over its limit of 10, so it would not vectorise: ivdep says the same for the loop itself.
#pragma GCC ivdep
  for (int64_t i = begin; i < end; ++i) {
    T vm{};
    if constexpr (Amsgrad) vm = vmax[i];
    const formulas::AdamState<T> r = formulas::adam_update<Decay, Amsgrad>(p[i], g[i], m[i], v[i], vm, s);
    p_out[i] = r.p;
    m_out[i] = r.m;
    v_out[i] = r.v;
    if constexpr (Amsgrad) vmax_out[i] = r.vmax;
  }
}

template <class T, AdamDecay Decay, bool Amsgrad> class AdamUpdateKernel final : public Kernel {
 public:
  explicit AdamUpdateKernel(int64_t numel) : numel_(numel) {}

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    constexpr size_t arrays = formulas::adam_array_inputs(Amsgrad);
    // The scalars change between steps (learning rate, bias corrections): read at run time, once per call.
    auto scalar = [&](size_t k) { return in[arrays + k]->template ptr<T>()[0]; };
    AdamScalars<T> s{scalar(0), scalar(1), scalar(2), scalar(3), scalar(4), scalar(5), scalar(6), T{}};
    if constexpr (Decay != AdamDecay::None) s.decay = scalar(7);
    const T *p = in[0]->template ptr<T>(), *g = in[1]->template ptr<T>(), *m = in[2]->template ptr<T>(),
            *v = in[3]->template ptr<T>();
    const T* vmax = Amsgrad ? in[4]->template ptr<T>() : nullptr;
    T *p_out = out[0]->template ptr<T>(), *m_out = out[1]->template ptr<T>(), *v_out = out[2]->template ptr<T>();
    T* vmax_out = Amsgrad ? out[3]->template ptr<T>() : nullptr;
    parallel_chunks(numel_, cpu::kCostlyGrain, [&](int64_t begin, int64_t end) {
      adam_loop<T, Decay, Amsgrad>(p, g, m, v, vmax, p_out, m_out, v_out, vmax_out, begin, end, s);
    });
  }

 private:
  int64_t numel_;
};

KernelFactory adam_update_factory(AdamDecay decay, bool amsgrad) {
  return [decay, amsgrad](PrepareContext& ctx) -> std::unique_ptr<Kernel> {
    ops::prepare_adam_update(ctx, decay, amsgrad);
    const int64_t n = numel_of(ctx.inputs[0].shape);
    const bool f64 = ctx.inputs[0].dtype == DType::Float64;
    return formulas::with_adam_variant(decay, amsgrad, [&]<AdamDecay D, bool A>() -> std::unique_ptr<Kernel> {
      if (f64) return std::make_unique<AdamUpdateKernel<double, D, A>>(n);
      return std::make_unique<AdamUpdateKernel<float, D, A>>(n);
    });
  };
}

using formulas::SgdMomentum;

// SGD (torch convention). The first-step flag is one bool for the whole tensor.
template <class T, bool L2, SgdMomentum Momentum>
void sgd_loop(const T* __restrict p, const T* __restrict g, const T* __restrict buf, bool first_step,
              T* __restrict p_out, T* __restrict buf_out, int64_t begin, int64_t end, const formulas::SgdScalars<T> s) {
#pragma GCC ivdep
  for (int64_t i = begin; i < end; ++i) {
    T b{};
    if constexpr (Momentum != SgdMomentum::None) b = buf[i];
    const formulas::SgdState<T> r = formulas::sgd_update<L2, Momentum>(p[i], g[i], b, first_step, s);
    p_out[i] = r.p;
    if constexpr (Momentum != SgdMomentum::None) buf_out[i] = r.buf;
  }
}

template <class T, bool L2, SgdMomentum Momentum> class SgdUpdateKernel final : public Kernel {
 public:
  explicit SgdUpdateKernel(int64_t numel) : numel_(numel) {}

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    constexpr bool with_buffer = Momentum != SgdMomentum::None;
    constexpr size_t first = formulas::sgd_array_inputs(Momentum) + (with_buffer ? 1 : 0);  // the first scalar
    auto scalar = [&](size_t k) { return in[first + k]->template ptr<T>()[0]; };
    formulas::SgdScalars<T> s{scalar(0), T{}, T{}, T{}};
    size_t k = 1;
    if constexpr (L2) s.decay = scalar(k++);
    if constexpr (with_buffer) {
      s.momentum = scalar(k++);
      s.one_minus_dampening = scalar(k++);
    }
    const bool first_step = with_buffer && in[3]->template ptr<bool>()[0];
    const T *p = in[0]->template ptr<T>(), *g = in[1]->template ptr<T>();
    const T* buf = with_buffer ? in[2]->template ptr<T>() : nullptr;
    T* p_out = out[0]->template ptr<T>();
    T* buf_out = with_buffer ? out[1]->template ptr<T>() : nullptr;
    parallel_chunks(numel_, cpu::kCostlyGrain, [&](int64_t begin, int64_t end) {
      sgd_loop<T, L2, Momentum>(p, g, buf, first_step, p_out, buf_out, begin, end, s);
    });
  }

 private:
  int64_t numel_;
};

template <class T, bool L2>
void adagrad_loop(const T* __restrict p, const T* __restrict g, const T* __restrict sum, T* __restrict p_out,
                  T* __restrict sum_out, int64_t begin, int64_t end, const formulas::AdagradScalars<T> s) {
#pragma GCC ivdep
  for (int64_t i = begin; i < end; ++i) {
    const formulas::AdagradState<T> r = formulas::adagrad_update<L2>(p[i], g[i], sum[i], s);
    p_out[i] = r.p;
    sum_out[i] = r.sum;
  }
}

template <class T, bool L2> class AdagradUpdateKernel final : public Kernel {
 public:
  explicit AdagradUpdateKernel(int64_t numel) : numel_(numel) {}

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    auto scalar = [&](size_t k) { return in[3 + k]->template ptr<T>()[0]; };
    const formulas::AdagradScalars<T> s{scalar(0), scalar(1), L2 ? scalar(2) : T{}};
    const T *p = in[0]->template ptr<T>(), *g = in[1]->template ptr<T>(), *sum = in[2]->template ptr<T>();
    T *p_out = out[0]->template ptr<T>(), *sum_out = out[1]->template ptr<T>();
    parallel_chunks(numel_, cpu::kCostlyGrain, [&](int64_t begin, int64_t end) {
      adagrad_loop<T, L2>(p, g, sum, p_out, sum_out, begin, end, s);
    });
  }

 private:
  int64_t numel_;
};

KernelFactory sgd_update_factory(bool l2, SgdMomentum momentum) {
  return [l2, momentum](PrepareContext& ctx) -> std::unique_ptr<Kernel> {
    ops::prepare_sgd_update(ctx, l2, momentum);
    const int64_t n = numel_of(ctx.inputs[0].shape);
    const bool f64 = ctx.inputs[0].dtype == DType::Float64;
    return formulas::with_sgd_variant(l2, momentum, [&]<bool L2, SgdMomentum M>() -> std::unique_ptr<Kernel> {
      if (f64) return std::make_unique<SgdUpdateKernel<double, L2, M>>(n);
      return std::make_unique<SgdUpdateKernel<float, L2, M>>(n);
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

void add_cpu_optimizer_update_kernels(KernelRegistry& r) {
  for (AdamDecay decay : formulas::kAdamDecays)
    for (bool amsgrad : {false, true})
      ops::add(r, "onnxtrain", formulas::adam_update_op(decay, amsgrad), 1, {DType::Float32, DType::Float64},
               adam_update_factory(decay, amsgrad));
  for (bool l2 : {false, true}) {
    for (SgdMomentum momentum : formulas::kSgdMomenta)
      ops::add(r, "onnxtrain", formulas::sgd_update_op(l2, momentum), 1, {DType::Float32, DType::Float64},
               sgd_update_factory(l2, momentum));
    ops::add(r, "onnxtrain", formulas::adagrad_update_op(l2), 1, {DType::Float32, DType::Float64},
             adagrad_update_factory(l2));
  }
}

}  // namespace onnxtrain
