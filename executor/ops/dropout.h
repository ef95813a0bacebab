#pragma once
// The plan-time part of Dropout and onnxtrain.DropoutMask, shared by the CPU kernels (executor/cpu/dropout.cpp)
// and their CUDA twins (executor/cuda/dropout.cu): input checks, attributes and output dtypes and shapes. The
// random streams themselves differ by device (documented in each kernel file).
#include <cstdint>
#include <optional>

#include "executor/kernel.h"

namespace onnxtrain::ops {

struct DropoutAttrs {
  bool has_ratio = false, has_mode = false;  // the ratio and training_mode inputs (opset 12+) are present
  std::optional<uint32_t> seed;              // the seed attribute, when given
  double fixed_ratio = 0.5;                  // the ratio attribute before opset 12
};

// Sets output (x's dtype and shape) and mask (bool) and checks is_test, training_mode's dtype and the seed.
DropoutAttrs prepare_dropout(PrepareContext& ctx);

struct DropoutMaskAttrs {
  uint64_t seed = 0;
  double ratio = 0;
};

// Checks the counter (an int64 scalar), ratio in [0, 1) and the seed, and sets the bool mask of x's shape.
DropoutMaskAttrs prepare_dropout_mask(PrepareContext& ctx);

}  // namespace onnxtrain::ops
