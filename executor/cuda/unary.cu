// Unary elementwise ops, activations, Cast, Clip, the fused (dY, Y) -> dX gradients and Hardmax on CUDA.
// The maths is executor/functors.h, shared with the CPU kernels; this file only launches.
#include <limits>
#include <memory>

#include "executor/cuda/common.h"
#include "executor/cuda/device_util.cuh"
#include "executor/functor_attrs.h"

namespace onnxtrain::cuda {

std::unique_ptr<Kernel> make_half_cast(DType from, DType to);  // half.cu

namespace {

template <class Op, class TI, class TO> __global__ void unary_kernel(int64_t n, const TI* x, TO* y, Op op) {
  for (int64_t i = global_index(); i < n; i += grid_stride()) y[i] = op(x[i]);
}

template <class Op, class TI, class TO> class UnaryKernel final : public Kernel {
 public:
  explicit UnaryKernel(Op op) : op_(op) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const int64_t n = out[0]->numel();
    if (n == 0) return;
    unary_kernel<<<blocks_for(n), kBlock, 0, stream()>>>(n, in[0]->ptr<TI>(), out[0]->ptr<TO>(), op_);
    check_launch("unary elementwise kernel");
  }

 private:
  Op op_;
};

template <class Op, class... Ts> CudaFactory unary(Op (*make_op)(const Node&) = nullptr) {
  return [make_op](PrepareContext& ctx, const KernelFactory& host) -> std::unique_ptr<Kernel> {
    host_prepare(ctx, host);
    const Op op = make_op ? make_op(ctx.node) : Op{};
    std::unique_ptr<Kernel> k;
    dispatch<Ts...>(ctx.inputs[0].dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      k = std::make_unique<UnaryKernel<Op, T, T>>(op);
    });
    if (!k) ops::fail_dtype(ctx);
    return k;
  };
}

template <class Op> CudaFactory floats(Op (*make_op)(const Node&) = nullptr) { return unary<Op, float, double>(make_op); }

std::unique_ptr<Kernel> make_gelu(PrepareContext& ctx, const KernelFactory& host) {
  return gelu_uses_tanh(ctx.node) ? floats<GeluTanhOp>()(ctx, host) : floats<GeluOp>()(ctx, host);
}

std::unique_ptr<Kernel> make_copy(PrepareContext& ctx, const KernelFactory& host) {
  host_prepare(ctx, host);
  return std::make_unique<DeviceCopyKernel>();
}

std::unique_ptr<Kernel> make_cast(PrepareContext& ctx, const KernelFactory& host) {
  host_prepare(ctx, host);
  const DType from = ctx.inputs[0].dtype, to = ctx.outputs[0].dtype;
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

std::unique_ptr<Kernel> make_clip(PrepareContext& ctx, const KernelFactory& host) {
  host_prepare(ctx, host);
  const bool from_inputs = ctx.opset >= 11;
  std::unique_ptr<Kernel> k;
  dispatch<float, double, int64_t, int32_t, int8_t, uint8_t>(ctx.inputs[0].dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const auto [lo, hi] = clip_bounds<T>(ctx.node, from_inputs);
    k = std::make_unique<ClipKernel<T>>(lo, hi, from_inputs);
  });
  if (!k) ops::fail_dtype(ctx);
  return k;
}

// Fused gradients: (dY, Y) -> dX, same shapes (checked by the CPU factory).
template <class Op, class T> __global__ void grad_kernel(int64_t n, const T* dy, const T* y, T* dx) {
  const Op op;
  for (int64_t i = global_index(); i < n; i += grid_stride()) dx[i] = op(dy[i], y[i]);
}

template <class Op, class T> class GradKernel final : public Kernel {
 public:
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const int64_t n = out[0]->numel();
    if (n == 0) return;
    grad_kernel<Op, T><<<blocks_for(n), kBlock, 0, stream()>>>(n, in[0]->ptr<T>(), in[1]->ptr<T>(), out[0]->ptr<T>());
    check_launch("fused gradient kernel");
  }
};

template <class Op> std::unique_ptr<Kernel> make_grad(PrepareContext& ctx, const KernelFactory& host) {
  host_prepare(ctx, host);
  if (ctx.inputs[0].dtype == DType::Float64) return std::make_unique<GradKernel<Op, double>>();
  return std::make_unique<GradKernel<Op, float>>();
}

// Hardmax: one thread per lane writes the one-hot of the lane's first maximum.
template <class T> __global__ void hardmax_kernel(int64_t lanes, int64_t len, int64_t inner, const T* x, T* y) {
  for (int64_t lane = global_index(); lane < lanes; lane += grid_stride()) {
    const int64_t base = (lane / inner) * len * inner + lane % inner;
    int64_t best = 0;
    for (int64_t j = 1; j < len; ++j)
      if (x[base + j * inner] > x[base + best * inner]) best = j;
    for (int64_t j = 0; j < len; ++j) y[base + j * inner] = j == best ? T(1) : T(0);
  }
}

template <class T> class HardmaxKernel final : public Kernel {
 public:
  HardmaxKernel(int64_t outer, int64_t len, int64_t inner) : outer_(outer), len_(len), inner_(inner) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const int64_t lanes = outer_ * inner_;
    if (lanes == 0 || len_ == 0) return;
    hardmax_kernel<<<blocks_for(lanes), kBlock, 0, stream()>>>(lanes, len_, inner_, in[0]->ptr<T>(), out[0]->ptr<T>());
    check_launch("Hardmax kernel");
  }

 private:
  int64_t outer_, len_, inner_;
};

std::unique_ptr<Kernel> make_hardmax(PrepareContext& ctx, const KernelFactory& host) {
  host_prepare(ctx, host);
  const std::vector<int64_t>& shape = ctx.inputs[0].shape;
  const auto rank = static_cast<int64_t>(shape.size());
  const bool coerce = ctx.opset < 13;
  const int64_t axis = ops::normalize_axis(ctx, ctx.node.attr_int("axis", coerce ? 1 : -1), rank);
  int64_t outer = 1, len = shape[axis], inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= shape[d];
  for (int64_t d = axis + 1; d < rank; ++d) (coerce ? len : inner) *= shape[d];
  if (ctx.inputs[0].dtype == DType::Float64) return std::make_unique<HardmaxKernel<double>>(outer, len, inner);
  return std::make_unique<HardmaxKernel<float>>(outer, len, inner);
}

}  // namespace

void register_cuda_unary(KernelRegistry& r) {
  twin(r, "Neg", unary<NegOp, float, double, int64_t, int32_t>());
  twin(r, "Abs", unary<AbsOp, float, double, int64_t, int32_t>());
  twin(r, "Sign", unary<SignOp, float, double, int64_t, int32_t>());
  twin(r, "Relu", unary<ReluOp, float, double, int64_t, int32_t>());
  twin(r, "Sigmoid", floats<SigmoidOp>());
  twin(r, "Tanh", floats<TanhOp>());
  twin(r, "Exp", floats<ExpOp>());
  twin(r, "Log", floats<LogOp>());
  twin(r, "Sqrt", floats<SqrtOp>());
  twin(r, "Reciprocal", floats<ReciprocalOp>());
  twin(r, "Floor", floats<FloorOp>());
  twin(r, "Ceil", floats<CeilOp>());
  twin(r, "Erf", floats<ErfOp>());
  twin(r, "Softplus", floats<SoftplusOp>());
  twin(r, "LeakyRelu", floats<LeakyReluOp>(leaky_relu_op));
  twin(r, "Elu", floats<EluOp>(elu_op));
  twin(r, "Not", unary<NotOp, bool>());
  twin(r, "Identity", make_copy);
  twin(r, "Cast", make_cast);
  twin(r, "CastLike", make_cast);
  twin(r, "Clip", make_clip);

  twin(r, "Sin", floats<SinOp>());
  twin(r, "Cos", floats<CosOp>());
  twin(r, "Tan", floats<TanOp>());
  twin(r, "Asin", floats<AsinOp>());
  twin(r, "Acos", floats<AcosOp>());
  twin(r, "Atan", floats<AtanOp>());
  twin(r, "Sinh", floats<SinhOp>());
  twin(r, "Cosh", floats<CoshOp>());
  twin(r, "Asinh", floats<AsinhOp>());
  twin(r, "Acosh", floats<AcoshOp>());
  twin(r, "Atanh", floats<AtanhOp>());
  twin(r, "Round", floats<RoundOp>());
  twin(r, "Selu", floats<SeluOp>(selu_op));
  twin(r, "Celu", floats<CeluOp>(celu_op));
  twin(r, "Gelu", make_gelu);
  twin(r, "HardSigmoid", floats<HardSigmoidOp>(hard_sigmoid_op));
  twin(r, "HardSwish", floats<HardSwishOp>());
  twin(r, "Softsign", floats<SoftsignOp>());
  twin(r, "Mish", floats<MishOp>());
  twin(r, "ThresholdedRelu", floats<ThresholdedReluOp>(thresholded_relu_op));
  twin(r, "Hardmax", make_hardmax);

  twin(r, "onnxtrain", "ReluGrad", make_grad<ReluGradOp>);
  twin(r, "onnxtrain", "SigmoidGrad", make_grad<SigmoidGradOp>);
  twin(r, "onnxtrain", "TanhGrad", make_grad<TanhGradOp>);
  // (dY, X) -> dX: the GELU gradients take the forward input in Y's place.
  twin(r, "onnxtrain", "GeluGrad", make_grad<GeluErfGradFn>);
  twin(r, "onnxtrain", "GeluTanhGrad", make_grad<GeluTanhGradFn>);
}

}  // namespace onnxtrain::cuda
