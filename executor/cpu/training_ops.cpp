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

namespace onnxtrain {
namespace {

constexpr int64_t kGrain = 1 << 14;
const char* const kDomain = "ai.onnx.preview.training";

// Attributes the spec marks required have no default; we refuse the node rather than guess one.
double required_float(const PrepareContext& ctx, const char* name) {
  if (!ctx.node.has_attr(name)) ctx.fail(std::string("missing required attribute '") + name + "'");
  return ctx.node.attr_float(name, 0.0f);
}

// Checks R, T and the n groups of `per_group` tensors; sets every output to its X's dtype and shape.
// Returns n.
size_t prepare_groups(PrepareContext& ctx, size_t per_group, DType& dtype) {
  const size_t nin = ctx.inputs.size();
  if (nin < 2 + per_group || (nin - 2) % per_group != 0)
    ctx.fail("expected inputs R, T, then " + std::to_string(per_group) + " groups of n tensors (n >= 1), got " +
             std::to_string(nin) + " inputs");
  const size_t n = (nin - 2) / per_group;
  const KernelInput& r = ctx.inputs[0];
  const KernelInput& t = ctx.inputs[1];
  if (r.dtype != DType::Float32 && r.dtype != DType::Float64)
    ctx.fail("input 0 (R) must be float32 or float64, got " + dtype_name(r.dtype));
  if (numel_of(r.shape) != 1) ctx.fail("input 0 (R) must be a scalar, got shape " + shape_string(r.shape));
  if (t.dtype != DType::Int64) ctx.fail("input 1 (T) must be int64, got " + dtype_name(t.dtype));
  if (numel_of(t.shape) != 1) ctx.fail("input 1 (T) must be a scalar, got shape " + shape_string(t.shape));
  const size_t outs_per_group = per_group - 1;  // G has no output
  if (ctx.outputs.size() != n * outs_per_group)
    ctx.fail("expected " + std::to_string(n * outs_per_group) + " outputs for " + std::to_string(n) +
             " optimized tensors, got " + std::to_string(ctx.outputs.size()));
  dtype = ctx.inputs[2].dtype;
  if (dtype != DType::Float32 && dtype != DType::Float64)
    ctx.fail("optimized tensors must be float32 or float64, got " + dtype_name(dtype) + " for input 2");
  for (size_t i = 0; i < n; ++i) {
    const KernelInput& x = ctx.inputs[2 + i];
    for (size_t k = 0; k < per_group; ++k) {
      const size_t idx = 2 + k * n + i;
      const KernelInput& in = ctx.inputs[idx];
      if (!in.present()) ctx.fail("input " + std::to_string(idx) + " is missing");
      if (in.dtype != dtype)
        ctx.fail("input " + std::to_string(idx) + " is " + dtype_name(in.dtype) + ", expected " + dtype_name(dtype) +
                 " like input 2");
      // The spec speaks of broadcasting, but a tensor, its gradient and its state always share a shape in
      // practice; anything else is almost surely a wiring mistake.
      if (in.shape != x.shape)
        ctx.fail("input " + std::to_string(idx) + " has shape " + shape_string(in.shape) + ", expected " +
                 shape_string(x.shape) + " like the tensor it belongs to (input " + std::to_string(2 + i) + ")");
    }
    for (size_t k = 0; k < outs_per_group; ++k) {
      ctx.outputs[k * n + i].dtype = dtype;
      ctx.outputs[k * n + i].shape = x.shape;
    }
  }
  return n;
}

double read_r(const Tensor& r) {
  return r.dtype == DType::Float64 ? r.ptr<double>()[0] : static_cast<double>(r.ptr<float>()[0]);
}

// ---- Momentum ----

struct MomentumAttrs {
  double alpha, beta, norm;
  bool nesterov;
};

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
  MomentumAttrs a{};
  a.alpha = required_float(ctx, "alpha");
  a.beta = required_float(ctx, "beta");
  a.norm = required_float(ctx, "norm_coefficient");
  if (!ctx.node.has_attr("mode")) ctx.fail("missing required attribute 'mode' (\"standard\" or \"nesterov\")");
  const std::string mode = ctx.node.attr_string("mode", "");
  if (mode != "standard" && mode != "nesterov")
    ctx.fail("attribute 'mode' is \"" + mode + "\", expected \"standard\" or \"nesterov\"");
  a.nesterov = mode == "nesterov";
  DType dt;
  const size_t n = prepare_groups(ctx, 3, dt);
  if (dt == DType::Float64) return std::make_unique<MomentumKernel<double>>(n, a);
  return std::make_unique<MomentumKernel<float>>(n, a);
}

// ---- Adam ----

struct AdamAttrs {
  double alpha, beta, epsilon, norm, norm_post;
};

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
  const Node& n = ctx.node;
  // Defaults are the schema's (float32 values, as ONNX stores them).
  AdamAttrs a{n.attr_float("alpha", 0.9f), n.attr_float("beta", 0.999f), n.attr_float("epsilon", 1e-6f),
              n.attr_float("norm_coefficient", 0.0f), n.attr_float("norm_coefficient_post", 0.0f)};
  DType dt;
  const size_t count = prepare_groups(ctx, 4, dt);
  if (dt == DType::Float64) return std::make_unique<AdamKernel<double>>(count, a);
  return std::make_unique<AdamKernel<float>>(count, a);
}

// ---- Adagrad ----

struct AdagradAttrs {
  double decay, epsilon, norm;
};

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
  const Node& n = ctx.node;
  AdagradAttrs a{n.attr_float("decay_factor", 0.0f), n.attr_float("epsilon", 1e-6f),
                 n.attr_float("norm_coefficient", 0.0f)};
  DType dt;
  const size_t count = prepare_groups(ctx, 3, dt);
  if (dt == DType::Float64) return std::make_unique<AdagradKernel<double>>(count, a);
  return std::make_unique<AdagradKernel<float>>(count, a);
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
