// Activations on CUDA (CPU kernels: executor/cpu/activation.cpp; rules: gradients/rules/activation.cpp): Selu,
// Celu, Gelu, HardSigmoid, HardSwish, Softsign, Mish, ThresholdedRelu, PRelu, Hardmax, and Gelu's fused gradients.
// The checks, attributes and outputs are executor/ops/activation.h and the maths is executor/functors.h, both
// shared with the CPU kernels; this file only launches (the launch templates are map_kernels.cuh). Shrink has no CUDA twin yet (tests/executor/test_cuda_twins.cpp).
#include <memory>

#include "executor/cuda/common.h"
#include "executor/cuda/device_util.cuh"
#include "executor/cuda/map_kernels.cuh"
#include "executor/functor_attrs.h"
#include "executor/ops/activation.h"

namespace onnxtrain::cuda {
namespace {

std::unique_ptr<Kernel> make_gelu(PrepareContext& ctx) {
  if (ops::prepare_gelu(ctx).tanh) return make_unary<GeluTanhOp, float, double>(ctx, GeluTanhOp{});
  return make_unary<GeluOp, float, double>(ctx, GeluOp{});
}

// PRelu: the slope broadcasts onto X, which is the output's shape.
std::unique_ptr<Kernel> make_prelu(PrepareContext& ctx) {
  ops::prepare_prelu(ctx);
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

std::unique_ptr<Kernel> make_hardmax(PrepareContext& ctx) {
  const ops::HardmaxLanes l = ops::prepare_hardmax(ctx);
  if (ctx.inputs[0].dtype == DType::Float64) return std::make_unique<HardmaxKernel<double>>(l.outer, l.len, l.inner);
  return std::make_unique<HardmaxKernel<float>>(l.outer, l.len, l.inner);
}

}  // namespace

void register_cuda_activation(KernelRegistry& r) {
  twin(r, "Selu", floats<SeluOp>(ops::prepare_selu));
  twin(r, "Celu", floats<CeluOp>(ops::prepare_celu));
  twin(r, "Gelu", make_gelu);
  twin(r, "HardSigmoid", floats<HardSigmoidOp>(ops::prepare_hard_sigmoid));
  twin(r, "HardSwish", floats<HardSwishOp>(ops::prepare_activation_op<HardSwishOp>));
  twin(r, "Softsign", floats<SoftsignOp>(ops::prepare_activation_op<SoftsignOp>));
  twin(r, "Mish", floats<MishOp>(ops::prepare_activation_op<MishOp>));
  twin(r, "ThresholdedRelu", floats<ThresholdedReluOp>(ops::prepare_thresholded_relu));
  twin(r, "PRelu", make_prelu);
  twin(r, "Hardmax", make_hardmax);
  // (dY, X) -> dX: the GELU gradients take the forward input in Y's place.
  twin(r, "onnxtrain", "GeluGrad", make_grad<GeluErfGradFn>);
  twin(r, "onnxtrain", "GeluTanhGrad", make_grad<GeluTanhGradFn>);
}

}  // namespace onnxtrain::cuda
