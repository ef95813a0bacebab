#pragma once
// The executor's float32 <-> float16 / bfloat16 casts. The conversions themselves (FloatToHalf and the rest)
// are graph/float16.h's, shared with the graph's constants and with the CUDA twins.
#include <memory>

#include "executor/kernel.h"
#include "graph/float16.h"

namespace onnxtrain {

// The kernel K<Op, From, To> for a supported cast (float32 <-> float16/bfloat16), or null. Shared by the CPU
// and CUDA factories so the two support the same pairs.
template <template <class, class, class> class K> std::unique_ptr<Kernel> half_cast_kernel(DType from, DType to) {
  if (from == DType::Float32 && to == DType::Float16) return std::make_unique<K<FloatToHalf, float, uint16_t>>();
  if (from == DType::Float16 && to == DType::Float32) return std::make_unique<K<HalfToFloat, uint16_t, float>>();
  if (from == DType::Float32 && to == DType::BFloat16) return std::make_unique<K<FloatToBFloat16, float, uint16_t>>();
  if (from == DType::BFloat16 && to == DType::Float32) return std::make_unique<K<BFloat16ToFloat, uint16_t, float>>();
  return nullptr;
}

}  // namespace onnxtrain
