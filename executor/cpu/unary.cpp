// Unary elementwise ops on the CPU (rules: gradients/rules/unary.cpp; CUDA: executor/cuda/unary.cu): one flat
// loop over contiguous memory, threaded for large tensors. The transcendental float ops go through Eigen's
// vectorised versions (executor/cpu/eigen_map.h), which GCC cannot vectorise from std:: calls; the rest call the
// shared functors in executor/functors.h. Also the fused gradients ReluGrad, SigmoidGrad and TanhGrad, which the
// rules of Relu, Sigmoid and Tanh emit.
#include <cstring>
#include <limits>
#include <memory>

#include "executor/broadcast.h"
#include "executor/cpu/eigen_map.h"
#include "executor/cpu/half.h"
#include "executor/cpu/kernel_util.h"
#include "executor/cpu/vector_sqrt.h"
#include "executor/functor_attrs.h"
#include "executor/kernel.h"
#include "executor/ops/unary.h"

namespace onnxtrain {
namespace {

using cpu::CopyKernel;
using cpu::add;
using cpu::dispatch;
using cpu::fail_dtype;
using cpu::kCheapGrain;
using cpu::kCostlyGrain;

template <class Op, class TI, class TO> class UnaryKernel final : public Kernel {
 public:
  UnaryKernel(Op op, int64_t grain) : op_(op), grain_(grain) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const TI* x = in[0]->ptr<TI>();
    TO* y = out[0]->ptr<TO>();
    parallel_chunks(out[0]->numel(), grain_, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) y[i] = op_(x[i]);
    });
  }

 private:
  Op op_;
  int64_t grain_;
};

template <class T> class SqrtKernel final : public Kernel {
 public:
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const T* x = in[0]->ptr<T>();
    T* y = out[0]->ptr<T>();
    parallel_chunks(out[0]->numel(), kCheapGrain, [&](int64_t s, int64_t e) { cpu::sqrt_span(x + s, y + s, e - s); });
  }
};

// Bounds come from attributes (opset 6-10) or from optional scalar inputs read at run time (11+).
template <class T> class ClipKernel final : public Kernel {
 public:
  ClipKernel(T lo, T hi, bool from_inputs) : lo_(lo), hi_(hi), from_inputs_(from_inputs) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    T lo = lo_, hi = hi_;
    if (from_inputs_) {
      if (in.size() > 1 && in[1]) lo = *in[1]->ptr<T>();
      if (in.size() > 2 && in[2]) hi = *in[2]->ptr<T>();
    }
    const T* x = in[0]->ptr<T>();
    T* y = out[0]->ptr<T>();
    const ClipOp op;
    parallel_chunks(out[0]->numel(), kCheapGrain, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) y[i] = op(x[i], lo, hi);
    });
  }

 private:
  T lo_, hi_;
  bool from_inputs_;
};

// ---- factories: the checks, attributes and output are the op layer's (executor/ops/unary.h) ----------------

// A functor-based op over the dtypes Ts; prepare checks the node and builds the functor from its attributes.
template <class Op, class... Ts>
KernelFactory functor_unary(int64_t grain, Op (*prepare)(PrepareContext&) = ops::prepare_unary_op<Op>) {
  return [grain, prepare](PrepareContext& ctx) -> std::unique_ptr<Kernel> {
    const Op op = prepare(ctx);
    const DType t = ctx.inputs[0].dtype;
    std::unique_ptr<Kernel> k;
    dispatch<Ts...>(t, [&](auto tag) {
      using T = typename decltype(tag)::type;
      k = std::make_unique<UnaryKernel<Op, T, T>>(op, grain);
    });
    if (!k) fail_dtype(ctx);
    return k;
  };
}

// Eigen-vectorised for float32 and float64; the functor stays the reference the tests compare against.
template <class Op> KernelFactory eigen_unary() {
  return [](PrepareContext& ctx) -> std::unique_ptr<Kernel> {
    ops::prepare_unary(ctx);
    const DType t = ctx.inputs[0].dtype;
    if (t == DType::Float32) return std::make_unique<cpu::EigenMapKernel<Op, float>>(kCostlyGrain);
    if (t == DType::Float64) return std::make_unique<cpu::EigenMapKernel<Op, double>>(kCostlyGrain);
    fail_dtype(ctx);
  };
}

std::unique_ptr<Kernel> make_sqrt(PrepareContext& ctx) {
  ops::prepare_unary(ctx);
  const DType t = ctx.inputs[0].dtype;
  if (t == DType::Float32) return std::make_unique<SqrtKernel<float>>();
  if (t == DType::Float64) return std::make_unique<SqrtKernel<double>>();
  fail_dtype(ctx);
}

std::unique_ptr<Kernel> make_identity(PrepareContext& ctx) {
  ops::prepare_identity(ctx);
  return std::make_unique<CopyKernel>();
}

// The op layer checked that the pair is one of the casts below.
std::unique_ptr<Kernel> make_cast_to(PrepareContext& ctx, ops::CastTypes c) {
  const DType from = c.from, to = c.to;
  if (from == to) return std::make_unique<CopyKernel>();
  if (auto half = cpu::make_half_cast(ctx, from, to)) return half;
  std::unique_ptr<Kernel> k;
  dispatch<float, double, int64_t, int32_t, bool, uint8_t, int8_t>(from, [&](auto ft) {
    using TF = typename decltype(ft)::type;
    dispatch<float, double, int64_t, int32_t, bool, uint8_t, int8_t>(to, [&](auto tt) {
      using TT = typename decltype(tt)::type;
      k = std::make_unique<UnaryKernel<CastOp<TT>, TF, TT>>(CastOp<TT>{}, kCheapGrain);
    });
  });
  if (!k) fail_dtype(ctx);
  return k;
}

std::unique_ptr<Kernel> make_cast(PrepareContext& ctx) { return make_cast_to(ctx, ops::prepare_cast(ctx)); }

std::unique_ptr<Kernel> make_cast_like(PrepareContext& ctx) { return make_cast_to(ctx, ops::prepare_cast_like(ctx)); }

std::unique_ptr<Kernel> make_clip(PrepareContext& ctx) {
  const bool from_inputs = ops::prepare_clip(ctx).from_inputs;
  const DType t = ctx.inputs[0].dtype;
  std::unique_ptr<Kernel> k;
  dispatch<float, double, int64_t, int32_t, int8_t, uint8_t>(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const auto [lo, hi] = clip_bounds<T>(ctx.node, from_inputs);
    k = std::make_unique<ClipKernel<T>>(lo, hi, from_inputs);
  });
  if (!k) fail_dtype(ctx);
  return k;
}

// ---- ReluGrad, SigmoidGrad, TanhGrad: (dY, Y) -> dX from the forward op's output --------------------------
// One pass instead of the 3-5 elementwise nodes of their ONNX function bodies (gradients/fused.cpp).

template <class Op, class T> class GradKernel final : public Kernel {
 public:
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const T* dy = in[0]->ptr<T>();
    const T* y = in[1]->ptr<T>();
    T* dx = out[0]->ptr<T>();
    const Op op;
    parallel_chunks(out[0]->numel(), kCheapGrain, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) dx[i] = op(dy[i], y[i]);
    });
  }
};

template <class Op> std::unique_ptr<Kernel> make_grad(PrepareContext& ctx) {
  ops::prepare_fused_grad(ctx);
  const KernelInput& dy = ctx.inputs[0];
  if (dy.dtype == DType::Float32) return std::make_unique<GradKernel<Op, float>>();
  if (dy.dtype == DType::Float64) return std::make_unique<GradKernel<Op, double>>();
  ctx.fail("unsupported dtype " + dtype_name(dy.dtype) + " (float32, float64)");
}

}  // namespace

void register_cpu_unary(KernelRegistry& r) {
  const std::vector<DType> num = {DType::Float32, DType::Float64, DType::Int64, DType::Int32};
  const std::vector<DType> flt = {DType::Float32, DType::Float64};
  // Opset 6 dropped the legacy `consumed_inputs` attribute; later versions only widen the dtypes.
  add(r, "Neg", 6, num, functor_unary<NegOp, float, double, int64_t, int32_t>(kCheapGrain));
  add(r, "Abs", 6, num, functor_unary<AbsOp, float, double, int64_t, int32_t>(kCheapGrain));
  add(r, "Sign", 9, num, functor_unary<SignOp, float, double, int64_t, int32_t>(kCheapGrain));
  add(r, "Relu", 6, num, functor_unary<ReluOp, float, double, int64_t, int32_t>(kCheapGrain));
  add(r, "Sigmoid", 6, flt, eigen_unary<cpu::EigenSigmoid>());
  add(r, "Tanh", 6, flt, eigen_unary<cpu::EigenTanh>());
  add(r, "Exp", 6, flt, eigen_unary<cpu::EigenExp>());
  add(r, "Log", 6, flt, eigen_unary<cpu::EigenLog>());
  add(r, "Sqrt", 6, flt, make_sqrt);
  add(r, "Reciprocal", 6, flt, functor_unary<ReciprocalOp, float, double>(kCheapGrain));
  add(r, "Floor", 6, flt, functor_unary<FloorOp, float, double>(kCheapGrain));
  add(r, "Ceil", 6, flt, functor_unary<CeilOp, float, double>(kCheapGrain));
  add(r, "Erf", 9, flt, eigen_unary<cpu::EigenErf>());
  add(r, "Softplus", 1, flt, functor_unary<SoftplusOp, float, double>(kCostlyGrain));
  add(r, "LeakyRelu", 6, flt, functor_unary<LeakyReluOp, float, double>(kCheapGrain, ops::prepare_leaky_relu));
  add(r, "Elu", 6, flt, functor_unary<EluOp, float, double>(kCostlyGrain, ops::prepare_elu));
  add(r, "Not", 1, {DType::Bool}, functor_unary<NotOp, bool>(kCheapGrain));
  add(r, "Identity", 1, {}, make_identity);
  add(r, "Cast", 6,
      {DType::Float32, DType::Float64, DType::Int64, DType::Int32, DType::Bool, DType::UInt8, DType::Int8,
       DType::Float16, DType::BFloat16},
      make_cast);
  add(r, "CastLike", 15,
      {DType::Float32, DType::Float64, DType::Int64, DType::Int32, DType::Bool, DType::UInt8, DType::Int8},
      make_cast_like);
  add(r, "Clip", 6, {DType::Float32, DType::Float64, DType::Int64, DType::Int32, DType::Int8, DType::UInt8},
      make_clip);
  // The trigonometric ops arrived at 7 and the hyperbolic ones at 9, unchanged since except for added dtypes.
  add(r, "Sin", 7, flt, functor_unary<SinOp, float, double>(kCostlyGrain));
  add(r, "Cos", 7, flt, functor_unary<CosOp, float, double>(kCostlyGrain));
  add(r, "Tan", 7, flt, functor_unary<TanOp, float, double>(kCostlyGrain));
  add(r, "Asin", 7, flt, functor_unary<AsinOp, float, double>(kCostlyGrain));
  add(r, "Acos", 7, flt, functor_unary<AcosOp, float, double>(kCostlyGrain));
  add(r, "Atan", 7, flt, functor_unary<AtanOp, float, double>(kCostlyGrain));
  add(r, "Sinh", 9, flt, functor_unary<SinhOp, float, double>(kCostlyGrain));
  add(r, "Cosh", 9, flt, functor_unary<CoshOp, float, double>(kCostlyGrain));
  add(r, "Asinh", 9, flt, functor_unary<AsinhOp, float, double>(kCostlyGrain));
  add(r, "Acosh", 9, flt, functor_unary<AcoshOp, float, double>(kCostlyGrain));
  add(r, "Atanh", 9, flt, functor_unary<AtanhOp, float, double>(kCostlyGrain));
  add(r, "Round", 11, flt, functor_unary<RoundOp, float, double>(kCheapGrain));
  // The fused gradients of Relu, Sigmoid and Tanh (gradients/rules/unary.cpp emits them).
  add(r, "onnxtrain", "ReluGrad", 1, flt, make_grad<ReluGradOp>);
  add(r, "onnxtrain", "SigmoidGrad", 1, flt, make_grad<SigmoidGradOp>);
  add(r, "onnxtrain", "TanhGrad", 1, flt, make_grad<TanhGradOp>);
}

}  // namespace onnxtrain
