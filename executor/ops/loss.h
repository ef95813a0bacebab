#pragma once
// The plan-time part of NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss, shared by the CPU kernels
// (executor/cpu/loss.cpp) and their CUDA twins (executor/cuda/loss.cu): input checks, attributes and output
// dtypes and shapes.
#include <cstdint>
#include <optional>
#include <string>

#include "executor/kernel.h"

namespace onnxtrain::ops {

// Input [n, c, d...] read as [n, c, d] with d the product of the trailing dims; target [n, d...].
struct LossAttrs {
  int64_t n = 0, c = 0, d = 1;
  std::string reduction;          // none, sum or mean
  std::optional<int64_t> ignore;  // ignore_index, when given
  bool wide_target = false;       // int64 targets (else int32)
};

// Checks the inputs (scores/input, labels/target, optional weight) and attributes, sets the loss output (and,
// for SoftmaxCrossEntropyLoss, log_prob when it is an output) and returns what the kernels need.
LossAttrs prepare_loss(PrepareContext& ctx, bool softmax);

}  // namespace onnxtrain::ops
