#pragma once
// The plan-time part of the ai.onnx.preview.training optimizer ops (Momentum, Adam, Adagrad; opset 1), shared by
// the CPU kernels (executor/cpu/training_ops.cpp) and their CUDA twins (executor/cuda/training_ops.cu): the
// attributes (the schema's defaults; an attribute the spec marks required is refused when missing, never guessed)
// and the checks of R, T and the n groups of tensors, which set every output to its X's dtype and shape.
// The update maths is executor/functors.h's *_step() functions, which both backends call.
#include <cstddef>

#include "executor/kernel.h"

namespace onnxtrain::ops {

struct PreviewMomentumAttrs {
  double alpha, beta, norm;
  bool nesterov;
};
struct PreviewAdamAttrs {
  double alpha, beta, epsilon, norm, norm_post;
};
struct PreviewAdagradAttrs {
  double decay, epsilon, norm;
};

// A node's attributes, how many tensors it updates (n) and their dtype (float32 or float64).
template <class Attrs> struct PreviewUpdate {
  Attrs attrs;
  size_t n;
  DType dtype;
};

PreviewUpdate<PreviewMomentumAttrs> prepare_preview_momentum(PrepareContext& ctx);
PreviewUpdate<PreviewAdamAttrs> prepare_preview_adam(PrepareContext& ctx);
PreviewUpdate<PreviewAdagradAttrs> prepare_preview_adagrad(PrepareContext& ctx);

}  // namespace onnxtrain::ops
