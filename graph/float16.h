#pragma once
// float32 <-> float16 / bfloat16 conversions, written once for host and device (ONNXTRAIN_HD): the graph's
// scalar constants (TensorData::scalar_as), the CPU Cast kernels and their CUDA twins (executor/half.h) all
// round with these, so the CPU tests check the GPU's rounding too. Both round to nearest even, as numpy's
// astype and torch's .half()/.bfloat16() do; overflow gives infinity, NaN stays NaN.
#include <cstdint>
#include <cstring>

#include "graph/hd.h"

namespace onnxtrain {

// Through memcpy, which device code has too.
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

// IEEE binary16 bits of f.
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
    // A carry out of the mantissa correctly bumps the exponent (and reaches infinity at the top).
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
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

// bfloat16 bits of f: the top half of its float32 bits, rounded.
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

}  // namespace onnxtrain
