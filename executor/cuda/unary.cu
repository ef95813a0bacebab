// Unary elementwise ops on CUDA (CPU kernels: executor/cpu/unary.cpp; rules: gradients/rules/unary.cpp): the
// maths functions, Relu/Sigmoid/Tanh/LeakyRelu/Softplus/Elu, the trigonometric ops and Round, Cast, Clip, and the
// fused ReluGrad, SigmoidGrad and TanhGrad. The checks, attributes and outputs are executor/ops/unary.h and the
// maths is executor/functors.h, both shared with the CPU kernels; this file only launches (the launch templates
// are map_kernels.cuh).
#include <limits>
#include <memory>

#include "executor/cuda/common.h"
#include "executor/cuda/device_util.cuh"
#include "executor/cuda/map_kernels.cuh"
#include "executor/functor_attrs.h"
#include "executor/ops/unary.h"

namespace onnxtrain::cuda {

std::unique_ptr<Kernel> make_half_cast(DType from, DType to);  // half.cu

namespace {

std::unique_ptr<Kernel> make_copy(PrepareContext& ctx) {
  ops::prepare_identity(ctx);
  return std::make_unique<DeviceCopyKernel>();
}

// The op layer checked that the pair is one of the casts below.
std::unique_ptr<Kernel> make_cast_to(PrepareContext& ctx, ops::CastTypes c) {
  const DType from = c.from, to = c.to;
  if (from == to) return std::make_unique<DeviceCopyKernel>();
  if (auto half = make_half_cast(from, to)) return half;
  std::unique_ptr<Kernel> k;
  dispatch<float, double, int64_t, int32_t, bool, uint8_t, int8_t>(from, [&](auto ft) {
    using TF = typename decltype(ft)::type;
    dispatch<float, double, int64_t, int32_t, bool, uint8_t, int8_t>(to, [&](auto tt) {
      using TT = typename decltype(tt)::type;
      k = std::make_unique<UnaryKernel<CastOp<TT>, TF, TT>>(CastOp<TT>{});
    });
  });
  if (!k) ops::fail_dtype(ctx);
  return k;
}

std::unique_ptr<Kernel> make_cast(PrepareContext& ctx) { return make_cast_to(ctx, ops::prepare_cast(ctx)); }

std::unique_ptr<Kernel> make_cast_like(PrepareContext& ctx) { return make_cast_to(ctx, ops::prepare_cast_like(ctx)); }

// Clip's bounds: attributes (opset 6-10) or optional scalar inputs read on the device at run time (11+).
template <class T> __global__ void clip_kernel(int64_t n, const T* x, T* y, T lo, T hi, const T* lo_in, const T* hi_in) {
  const T l = lo_in ? *lo_in : lo, h = hi_in ? *hi_in : hi;
  const ClipOp op;
  for (int64_t i = global_index(); i < n; i += grid_stride()) y[i] = op(x[i], l, h);
}

template <class T> class ClipKernel final : public Kernel {
 public:
  ClipKernel(T lo, T hi, bool from_inputs) : lo_(lo), hi_(hi), from_inputs_(from_inputs) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const T* lo = from_inputs_ && in.size() > 1 && in[1] ? in[1]->ptr<T>() : nullptr;
    const T* hi = from_inputs_ && in.size() > 2 && in[2] ? in[2]->ptr<T>() : nullptr;
    const int64_t n = out[0]->numel();
    if (n == 0) return;
    clip_kernel<<<blocks_for(n), kBlock, 0, stream()>>>(n, in[0]->ptr<T>(), out[0]->ptr<T>(), lo_, hi_, lo, hi);
    check_launch("Clip kernel");
  }

 private:
  T lo_, hi_;
  bool from_inputs_;
};

std::unique_ptr<Kernel> make_clip(PrepareContext& ctx) {
  const bool from_inputs = ops::prepare_clip(ctx).from_inputs;
  std::unique_ptr<Kernel> k;
  dispatch<float, double, int64_t, int32_t, int8_t, uint8_t>(ctx.inputs[0].dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const auto [lo, hi] = clip_bounds<T>(ctx.node, from_inputs);
    k = std::make_unique<ClipKernel<T>>(lo, hi, from_inputs);
  });
  if (!k) ops::fail_dtype(ctx);
  return k;
}

}  // namespace

void register_cuda_unary(KernelRegistry& r) {
  twin(r, "Neg", unary<NegOp, float, double, int64_t, int32_t>(ops::prepare_unary_op<NegOp>));
  twin(r, "Abs", unary<AbsOp, float, double, int64_t, int32_t>(ops::prepare_unary_op<AbsOp>));
  twin(r, "Sign", unary<SignOp, float, double, int64_t, int32_t>(ops::prepare_unary_op<SignOp>));
  twin(r, "Relu", unary<ReluOp, float, double, int64_t, int32_t>(ops::prepare_unary_op<ReluOp>));
  twin(r, "Sigmoid", floats<SigmoidOp>(ops::prepare_unary_op<SigmoidOp>));
  twin(r, "Tanh", floats<TanhOp>(ops::prepare_unary_op<TanhOp>));
  twin(r, "Exp", floats<ExpOp>(ops::prepare_unary_op<ExpOp>));
  twin(r, "Log", floats<LogOp>(ops::prepare_unary_op<LogOp>));
  twin(r, "Sqrt", floats<SqrtOp>(ops::prepare_unary_op<SqrtOp>));
  twin(r, "Reciprocal", floats<ReciprocalOp>(ops::prepare_unary_op<ReciprocalOp>));
  twin(r, "Floor", floats<FloorOp>(ops::prepare_unary_op<FloorOp>));
  twin(r, "Ceil", floats<CeilOp>(ops::prepare_unary_op<CeilOp>));
  twin(r, "Erf", floats<ErfOp>(ops::prepare_unary_op<ErfOp>));
  twin(r, "Softplus", floats<SoftplusOp>(ops::prepare_unary_op<SoftplusOp>));
  twin(r, "LeakyRelu", floats<LeakyReluOp>(ops::prepare_leaky_relu));
  twin(r, "Elu", floats<EluOp>(ops::prepare_elu));
  twin(r, "Not", unary<NotOp, bool>(ops::prepare_unary_op<NotOp>));
  twin(r, "Identity", make_copy);
  twin(r, "Cast", make_cast);
  twin(r, "CastLike", make_cast_like);
  twin(r, "Clip", make_clip);

  twin(r, "Sin", floats<SinOp>(ops::prepare_unary_op<SinOp>));
  twin(r, "Cos", floats<CosOp>(ops::prepare_unary_op<CosOp>));
  twin(r, "Tan", floats<TanOp>(ops::prepare_unary_op<TanOp>));
  twin(r, "Asin", floats<AsinOp>(ops::prepare_unary_op<AsinOp>));
  twin(r, "Acos", floats<AcosOp>(ops::prepare_unary_op<AcosOp>));
  twin(r, "Atan", floats<AtanOp>(ops::prepare_unary_op<AtanOp>));
  twin(r, "Sinh", floats<SinhOp>(ops::prepare_unary_op<SinhOp>));
  twin(r, "Cosh", floats<CoshOp>(ops::prepare_unary_op<CoshOp>));
  twin(r, "Asinh", floats<AsinhOp>(ops::prepare_unary_op<AsinhOp>));
  twin(r, "Acosh", floats<AcoshOp>(ops::prepare_unary_op<AcoshOp>));
  twin(r, "Atanh", floats<AtanhOp>(ops::prepare_unary_op<AtanhOp>));
  twin(r, "Round", floats<RoundOp>(ops::prepare_unary_op<RoundOp>));

  twin(r, "onnxtrain", "ReluGrad", make_grad<ReluGradOp>);
  twin(r, "onnxtrain", "SigmoidGrad", make_grad<SigmoidGradOp>);
  twin(r, "onnxtrain", "TanhGrad", make_grad<TanhGradOp>);
}

}  // namespace onnxtrain::cuda
