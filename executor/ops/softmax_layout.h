#pragma once
// How Softmax, LogSoftmax and their fused gradients view their input (executor/ops/softmax_layout.cpp), shared by
// the CPU and CUDA kernels so both backends read the axis one way.
#include <cstdint>
#include <vector>

#include "executor/kernel.h"

namespace onnxtrain::ops {

// The op normalises over `len` elements that sit `inner` apart, for each of `outer * inner` lanes.
struct SoftmaxLayout {
  int64_t outer = 1, len = 1, inner = 1;
};

// The layout of `shape` at `axis`; `coerce_2d` is the opset 1-12 Softmax semantics (the input coerced to 2-D
// at axis, so len = prod(dims from axis on) and inner = 1). Fails naming the axis when it is out of range.
SoftmaxLayout softmax_layout(const PrepareContext& ctx, const std::vector<int64_t>& shape, int64_t axis,
                             bool coerce_2d);

// The layout a Softmax/LogSoftmax node (any opset) or a fused SoftmaxGrad/LogSoftmaxGrad node (always the
// opset 13 single-axis form) has for input 0.
SoftmaxLayout softmax_layout(const PrepareContext& ctx, bool fused_grad);

// The plan-time part of a Softmax/LogSoftmax node (or, with `fused_grad`, a SoftmaxGrad/LogSoftmaxGrad node) that
// both backends share: checks its inputs and outputs, sets output 0 (input 0's dtype and shape) and returns the
// layout. The kernels only pick their element type.
SoftmaxLayout prepare_softmax(PrepareContext& ctx, bool fused_grad);

}  // namespace onnxtrain::ops
