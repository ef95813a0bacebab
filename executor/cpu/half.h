#pragma once
// Cast between float32 and float16/bfloat16 on the CPU (the kernels mixed precision emits; docs/gpu.md).
#include <memory>

#include "executor/kernel.h"

namespace onnxtrain::cpu {

// The kernel for a cast with a half type on either side, or null when neither side is half. Only float32 <->
// float16/bfloat16 (and a half type to itself) are supported; other pairs fail naming both dtypes.
std::unique_ptr<Kernel> make_half_cast(PrepareContext& ctx, DType from, DType to);

}  // namespace onnxtrain::cpu
