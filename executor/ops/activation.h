#pragma once
// The plan-time part of the activations (Selu, Celu, Gelu, HardSigmoid, HardSwish, Softsign, Mish,
// ThresholdedRelu, Shrink, PRelu, Hardmax), shared by the CPU kernels (executor/cpu/activation.cpp) and their CUDA
// twins (executor/cuda/activation.cu): input checks, attributes (alpha, beta, gamma, approximate, axis) and
// validation, output 0's dtype and shape. The maths is executor/functors.h, built from the attributes by
// executor/functor_attrs.h; the GELU gradients are checked by ops::prepare_fused_grad (unary.h).
#include <cstdint>

#include "executor/functor_attrs.h"
#include "executor/kernel.h"

namespace onnxtrain::ops {

// Exactly one input, one output of the input's dtype and shape.
void prepare_activation(PrepareContext& ctx);
// prepare_activation, then the op's functor: the default one, or the one its attributes build.
template <class Op> Op prepare_activation_op(PrepareContext& ctx) {
  prepare_activation(ctx);
  return Op{};
}
SeluOp prepare_selu(PrepareContext& ctx);
CeluOp prepare_celu(PrepareContext& ctx);  // alpha must not be 0
HardSigmoidOp prepare_hard_sigmoid(PrepareContext& ctx);
ThresholdedReluOp prepare_thresholded_relu(PrepareContext& ctx);

// Gelu: approximate is "none" (erf) or "tanh".
struct GeluAttrs {
  bool tanh = false;
};
GeluAttrs prepare_gelu(PrepareContext& ctx);

// PRelu: the slope, of X's dtype, broadcasts (unidirectionally) onto X, which is output 0's shape.
void prepare_prelu(PrepareContext& ctx);

// Hardmax's lanes: the input viewed as [outer, len, inner], one-hot along len. Opset 13+ uses one axis (default
// -1); before that the input is coerced to 2-D at axis (default 1), so a lane spans every dimension from axis on.
struct HardmaxLanes {
  int64_t outer = 1, len = 1, inner = 1;
};
HardmaxLanes prepare_hardmax(PrepareContext& ctx);

}  // namespace onnxtrain::ops
