// Activations on CUDA (CPU kernels: executor/cpu/activation.cpp; rules: gradients/rules/activation.cpp): Selu,
// Celu, Gelu, HardSigmoid, HardSwish, Softsign, Mish, ThresholdedRelu, PRelu, Hardmax, and Gelu's fused gradients.
// The maths is executor/functors.h, shared with the CPU kernels; this file only launches (the launch templates are
// map_kernels.cuh). Shrink has no CUDA twin yet (tests/executor/test_cuda_twins.cpp).
#include <memory>

#include "executor/cuda/common.h"
#include "executor/cuda/device_util.cuh"
#include "executor/cuda/map_kernels.cuh"
#include "executor/functor_attrs.h"

namespace onnxtrain::cuda {
namespace {

std::unique_ptr<Kernel> make_gelu(PrepareContext& ctx, const KernelFactory& host) {
  return gelu_uses_tanh(ctx.node) ? floats<GeluTanhOp>()(ctx, host) : floats<GeluOp>()(ctx, host);
}

// PRelu: the slope broadcasts onto X, which is the output's shape.
std::unique_ptr<Kernel> make_prelu(PrepareContext& ctx, const KernelFactory& host) {
  host_prepare(ctx, host);
  std::unique_ptr<Kernel> k;
  dispatch<float, double>(ctx.inputs[0].dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    k = std::make_unique<BinaryKernel<PReluOp, T, T, T>>(plan_for(ctx), PReluOp{});
  });
  if (!k) ops::fail_dtype(ctx);
  return k;
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

void register_cuda_activation(KernelRegistry& r) {
  twin(r, "Selu", floats<SeluOp>(selu_op));
  twin(r, "Celu", floats<CeluOp>(celu_op));
  twin(r, "Gelu", make_gelu);
  twin(r, "HardSigmoid", floats<HardSigmoidOp>(hard_sigmoid_op));
  twin(r, "HardSwish", floats<HardSwishOp>());
  twin(r, "Softsign", floats<SoftsignOp>());
  twin(r, "Mish", floats<MishOp>());
  twin(r, "ThresholdedRelu", floats<ThresholdedReluOp>(thresholded_relu_op));
  twin(r, "PRelu", make_prelu);
  twin(r, "Hardmax", make_hardmax);
  // (dY, X) -> dX: the GELU gradients take the forward input in Y's place.
  twin(r, "onnxtrain", "GeluGrad", make_grad<GeluErfGradFn>);
  twin(r, "onnxtrain", "GeluTanhGrad", make_grad<GeluTanhGradFn>);
}

}  // namespace onnxtrain::cuda
