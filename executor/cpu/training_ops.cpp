// The ai.onnx.preview.training optimizer ops (Momentum, Adam, Adagrad), opset 1, with the exact semantics of
// the ONNX spec (and, registered here as the same family, the onnxtrain update ops optimizers/ emits:
// executor/cpu/fused_update.h). Each node updates n tensors at once; its inputs are R, T, then the groups laid out by kind
// (X1..Xn, G1..Gn, V1..Vn[, H1..Hn]) and its outputs likewise (X_new1..n, V_new1..n[, H_new1..n]).
//
// R and T are read at run time, not plan time: in a training graph they are variables that change each
// step, and a plan must not be recompiled for that. Scalar coefficients are derived from them in double once
// per run; the elementwise maths runs in the tensors' own dtype and is shared with the CUDA kernels through
// executor/functors.h.
#include <cmath>
#include <memory>
#include <string>

#include "executor/broadcast.h"
#include "executor/cpu/fused_update.h"
#include "executor/functors.h"
#include "executor/kernel.h"
#include "executor/ops/training_ops.h"

namespace onnxtrain {
namespace {

constexpr int64_t kGrain = 1 << 14;
const char* const kDomain = "ai.onnx.preview.training";

double read_r(const Tensor& r) {
  return r.dtype == DType::Float64 ? r.ptr<double>()[0] : static_cast<double>(r.ptr<float>()[0]);
}

// ---- Momentum ----

using MomentumAttrs = ops::PreviewMomentumAttrs;

template <class T> class MomentumKernel final : public Kernel {
 public:
  MomentumKernel(size_t n, MomentumAttrs a) : n_(n), a_(a) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const auto step = momentum_step<T>(read_r(*in[0]), in[1]->ptr<int64_t>()[0], a_.alpha, a_.beta, a_.norm,
                                       a_.nesterov);
    for (size_t i = 0; i < n_; ++i) {
      const T* x = in[2 + i]->ptr<T>();
      const T* g = in[2 + n_ + i]->ptr<T>();
      const T* v = in[2 + 2 * n_ + i]->ptr<T>();
      T* xo = out[i]->ptr<T>();
      T* vo = out[n_ + i]->ptr<T>();
      parallel_chunks(out[i]->numel(), kGrain, [&](int64_t s, int64_t e) {
        for (int64_t j = s; j < e; ++j) step(x[j], g[j], v[j], xo[j], vo[j]);
      });
    }
  }

 private:
  size_t n_;
  MomentumAttrs a_;
};

std::unique_ptr<Kernel> make_momentum(PrepareContext& ctx) {
  const auto u = ops::prepare_preview_momentum(ctx);
  if (u.dtype == DType::Float64) return std::make_unique<MomentumKernel<double>>(u.n, u.attrs);
  return std::make_unique<MomentumKernel<float>>(u.n, u.attrs);
}

// ---- Adam ----

using AdamAttrs = ops::PreviewAdamAttrs;

template <class T> class AdamKernel final : public Kernel {
 public:
  AdamKernel(size_t n, AdamAttrs a) : n_(n), a_(a) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const auto step = adam_step<T>(read_r(*in[0]), in[1]->ptr<int64_t>()[0], a_.alpha, a_.beta, a_.epsilon, a_.norm,
                                   a_.norm_post);
    for (size_t i = 0; i < n_; ++i) {
      const T* x = in[2 + i]->ptr<T>();
      const T* g = in[2 + n_ + i]->ptr<T>();
      const T* v = in[2 + 2 * n_ + i]->ptr<T>();
      const T* h = in[2 + 3 * n_ + i]->ptr<T>();
      T* xo = out[i]->ptr<T>();
      T* vo = out[n_ + i]->ptr<T>();
      T* ho = out[2 * n_ + i]->ptr<T>();
      parallel_chunks(out[i]->numel(), kGrain, [&](int64_t s, int64_t e) {
        for (int64_t j = s; j < e; ++j) step(x[j], g[j], v[j], h[j], xo[j], vo[j], ho[j]);
      });
    }
  }

 private:
  size_t n_;
  AdamAttrs a_;
};

std::unique_ptr<Kernel> make_adam(PrepareContext& ctx) {
  const auto u = ops::prepare_preview_adam(ctx);
  if (u.dtype == DType::Float64) return std::make_unique<AdamKernel<double>>(u.n, u.attrs);
  return std::make_unique<AdamKernel<float>>(u.n, u.attrs);
}

// ---- Adagrad ----

using AdagradAttrs = ops::PreviewAdagradAttrs;

template <class T> class AdagradKernel final : public Kernel {
 public:
  AdagradKernel(size_t n, AdagradAttrs a) : n_(n), a_(a) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const auto step = adagrad_step<T>(read_r(*in[0]), in[1]->ptr<int64_t>()[0], a_.decay, a_.epsilon, a_.norm);
    for (size_t i = 0; i < n_; ++i) {
      const T* x = in[2 + i]->ptr<T>();
      const T* g = in[2 + n_ + i]->ptr<T>();
      const T* h = in[2 + 2 * n_ + i]->ptr<T>();
      T* xo = out[i]->ptr<T>();
      T* ho = out[n_ + i]->ptr<T>();
      parallel_chunks(out[i]->numel(), kGrain, [&](int64_t s, int64_t e) {
        for (int64_t j = s; j < e; ++j) step(x[j], g[j], h[j], xo[j], ho[j]);
      });
    }
  }

 private:
  size_t n_;
  AdagradAttrs a_;
};

std::unique_ptr<Kernel> make_adagrad(PrepareContext& ctx) {
  const auto u = ops::prepare_preview_adagrad(ctx);
  if (u.dtype == DType::Float64) return std::make_unique<AdagradKernel<double>>(u.n, u.attrs);
  return std::make_unique<AdagradKernel<float>>(u.n, u.attrs);
}

void add(KernelRegistry& r, const char* op, KernelFactory f) {
  KernelDef d;
  d.domain = kDomain;
  d.op_type = op;
  d.since_version = 1;
  d.dtypes = {DType::Float32, DType::Float64};  // R's dtype: the registry keys on the first input
  d.factory = std::move(f);
  r.add(std::move(d));
}

}  // namespace

void register_cpu_training_ops(KernelRegistry& r) {
  add(r, "Momentum", make_momentum);
  add(r, "Adam", make_adam);
  add(r, "Adagrad", make_adagrad);
  // The optimizer's own per-weight update ops (onnxtrain domain, formulas/optimizer_updates.h), whose loops live in
  // fused_update.cpp for its -ffp-contract=off.
  add_cpu_optimizer_update_kernels(r);
}

}  // namespace onnxtrain
