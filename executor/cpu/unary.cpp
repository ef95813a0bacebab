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

// ---- factories ---------------------------------------------------------------------------------------

void expect_one_input(PrepareContext& ctx) {
  if (ctx.inputs.empty() || !ctx.inputs[0].present()) ctx.fail("input 0 is required");
  if (ctx.outputs.size() != 1) ctx.fail("expected 1 output, got " + std::to_string(ctx.outputs.size()));
}

void same_as_input(PrepareContext& ctx, DType out_dtype) { cpu::set_output(ctx, 0, out_dtype, ctx.inputs[0].shape); }

// A functor-based op over the dtypes Ts; make_op builds the functor from the node's attributes.
template <class Op, class... Ts> KernelFactory functor_unary(int64_t grain, Op (*make_op)(const Node&) = nullptr) {
  return [grain, make_op](PrepareContext& ctx) -> std::unique_ptr<Kernel> {
    expect_one_input(ctx);
    const DType t = ctx.inputs[0].dtype;
    same_as_input(ctx, t);
    const Op op = make_op ? make_op(ctx.node) : Op{};
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
    expect_one_input(ctx);
    const DType t = ctx.inputs[0].dtype;
    same_as_input(ctx, t);
    if (t == DType::Float32) return std::make_unique<cpu::EigenMapKernel<Op, float>>(kCostlyGrain);
    if (t == DType::Float64) return std::make_unique<cpu::EigenMapKernel<Op, double>>(kCostlyGrain);
    fail_dtype(ctx);
  };
}

std::unique_ptr<Kernel> make_sqrt(PrepareContext& ctx) {
  expect_one_input(ctx);
  const DType t = ctx.inputs[0].dtype;
  same_as_input(ctx, t);
  if (t == DType::Float32) return std::make_unique<SqrtKernel<float>>();
  if (t == DType::Float64) return std::make_unique<SqrtKernel<double>>();
  fail_dtype(ctx);
}

std::unique_ptr<Kernel> make_identity(PrepareContext& ctx) {
  expect_one_input(ctx);
  if (dtype_size(ctx.inputs[0].dtype) == 0) fail_dtype(ctx);
  same_as_input(ctx, ctx.inputs[0].dtype);
  return std::make_unique<CopyKernel>();
}

// Cast to `to`; CastLike (opset 15+) passes the target dtype as its second input instead of an attribute.
std::unique_ptr<Kernel> make_cast_to(PrepareContext& ctx, DType to) {
  const DType from = ctx.inputs[0].dtype;
  same_as_input(ctx, to);
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
  if (!k) {
    const std::string to_name = dtype_name(to).empty() ? "dtype " + std::to_string(static_cast<int>(to)) : dtype_name(to);
    ctx.fail("casting " + dtype_name(from) + " to " + to_name +
             " is not supported (supported: float32, float64, int64, int32, bool, uint8, int8)");
  }
  return k;
}

std::unique_ptr<Kernel> make_cast(PrepareContext& ctx) {
  expect_one_input(ctx);
  if (!ctx.node.has_attr("to")) ctx.fail("attribute 'to' is required");
  return make_cast_to(ctx, static_cast<DType>(ctx.node.attr_int("to", 0)));
}

std::unique_ptr<Kernel> make_cast_like(PrepareContext& ctx) {
  if (ctx.inputs.size() != 2 || !ctx.inputs[1].present()) ctx.fail("expected 2 inputs (input, target_type)");
  return make_cast_to(ctx, ctx.inputs[1].dtype);
}

std::unique_ptr<Kernel> make_clip(PrepareContext& ctx) {
  expect_one_input(ctx);
  const DType t = ctx.inputs[0].dtype;
  same_as_input(ctx, t);
  const bool from_inputs = ctx.opset >= 11;
  if (from_inputs) {
    if (ctx.inputs.size() > 3) ctx.fail("expected at most 3 inputs, got " + std::to_string(ctx.inputs.size()));
    for (size_t i = 1; i < ctx.inputs.size(); ++i) {
      const KernelInput& b = ctx.inputs[i];
      if (!b.present()) continue;
      if (b.dtype != t)
        ctx.fail(std::string(i == 1 ? "min" : "max") + " must have the input's dtype " + dtype_name(t) + ", got " +
                 dtype_name(b.dtype));
      if (numel_of(b.shape) != 1)
        ctx.fail(std::string(i == 1 ? "min" : "max") + " must be a scalar, got shape " + shape_string(b.shape));
    }
  } else if (t != DType::Float32 && t != DType::Float64) {
    fail_dtype(ctx);  // opset 6-10 is float-only, bounds are float attributes
  }
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
  cpu::expect_grad_inputs(ctx);
  const KernelInput& dy = ctx.inputs[0];
  cpu::set_output(ctx, 0, dy.dtype, dy.shape);
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
  add(r, "LeakyRelu", 6, flt, functor_unary<LeakyReluOp, float, double>(kCheapGrain, leaky_relu_op));
  add(r, "Elu", 6, flt, functor_unary<EluOp, float, double>(kCostlyGrain, elu_op));
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
