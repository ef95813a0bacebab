#pragma once
// float32 <-> float16 / bfloat16 conversions written once for host and device (ONNXTRAIN_HD), so the CPU
// Cast kernels and their CUDA twins round identically and the CPU tests check the GPU's rounding too.
// Both round to nearest even, as numpy's astype and torch's .half()/.bfloat16() do; overflow gives infinity.
#include <cstdint>
#include <cstring>
#include <memory>

#include "executor/hd.h"
#include "executor/kernel.h"

namespace onnxtrain {

ONNXTRAIN_HD inline uint32_t float_bits(float f) {
  uint32_t x;
  memcpy(&x, &f, sizeof x);
  return x;
}
ONNXTRAIN_HD inline float bits_float(uint32_t x) {
  float f;
  memcpy(&f, &x, sizeof f);
  return f;
}

struct FloatToHalf {
  ONNXTRAIN_HD uint16_t operator()(float f) const {
    const uint32_t x = float_bits(f);
    const uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t mant = x & 0x7FFFFFu;
    const int exp = static_cast<int>((x >> 23) & 0xFFu);
    if (exp == 0xFF) return static_cast<uint16_t>(sign | 0x7C00u | (mant ? 0x200u : 0u));
    const int e = exp - 127 + 15;
    if (e >= 0x1F) return static_cast<uint16_t>(sign | 0x7C00u);
    if (e <= 0) {  // a subnormal half, or zero
      if (e < -10) return static_cast<uint16_t>(sign);
      mant |= 0x800000u;
      const int shift = 14 - e;
      uint32_t h = mant >> shift;
      const uint32_t rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
      if (rem > half || (rem == half && (h & 1u))) ++h;
      return static_cast<uint16_t>(sign | h);
    }
    uint32_t h = sign | (static_cast<uint32_t>(e) << 10) | (mant >> 13);
    const uint32_t rem = mant & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // a carry correctly bumps the exponent
    return static_cast<uint16_t>(h);
  }
};

struct HalfToFloat {
  ONNXTRAIN_HD float operator()(uint16_t h) const {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1Fu, mant = h & 0x3FFu;
    if (exp == 0x1F) return bits_float(sign | 0x7F800000u | (mant << 13));
    if (exp != 0) return bits_float(sign | ((exp + 112) << 23) | (mant << 13));
    // Subnormal: mant * 2^-24 is exact in float.
    const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
};

struct FloatToBFloat16 {
  ONNXTRAIN_HD uint16_t operator()(float f) const {
    const uint32_t x = float_bits(f);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // NaN stays NaN
    return static_cast<uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
  }
};

struct BFloat16ToFloat {
  ONNXTRAIN_HD float operator()(uint16_t b) const { return bits_float(static_cast<uint32_t>(b) << 16); }
};

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
