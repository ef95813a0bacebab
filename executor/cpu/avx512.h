#pragma once
// Pieces shared by the AVX-512 kernels (gemm.cpp, direct_conv.cpp). Include only under __AVX512F__.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>

namespace onnxtrain::cpu::avx512 {

// The first n (clamped to 0..16) lanes of a vector.
inline __mmask16 lanes(int64_t n) {
  return n >= 16 ? __mmask16(0xFFFF) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
}

// Transposes the 16 x 16 block r[row][column] in place (three rounds of shuffles: 2 x 2, 4 x 4, then 16 x 16 by
// 128-bit lanes).
inline void transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    const __m512d t0 = _mm512_castps_pd(t[i]), t1 = _mm512_castps_pd(t[i + 1]);
    const __m512d t2 = _mm512_castps_pd(t[i + 2]), t3 = _mm512_castps_pd(t[i + 3]);
    r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(t0, t2));
    r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(t0, t2));
    r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(t1, t3));
    r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(t1, t3));
  }
  for (int h = 0; h < 16; h += 8)
    for (int i = 0; i < 4; ++i) {
      t[h + i] = _mm512_shuffle_f32x4(r[h + i], r[h + i + 4], 0x88);
      t[h + i + 4] = _mm512_shuffle_f32x4(r[h + i], r[h + i + 4], 0xdd);
    }
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
  }
}

// dst[j * ldd + i] = src[i * lds + j] for a rows x cols block, 16 x 16 at a time in registers.
inline void transpose(int64_t rows, int64_t cols, const float* src, int64_t lds, float* dst, int64_t ldd) {
  for (int64_t i0 = 0; i0 < rows; i0 += 16) {
    const int64_t ni = rows - i0 < 16 ? rows - i0 : 16;
    for (int64_t j0 = 0; j0 < cols; j0 += 16) {
      const int64_t nj = cols - j0 < 16 ? cols - j0 : 16;
      const __mmask16 mj = lanes(nj), mi = lanes(ni);
      __m512 r[16];
      for (int64_t i = 0; i < 16; ++i)
        r[i] = i < ni ? _mm512_maskz_loadu_ps(mj, src + (i0 + i) * lds + j0) : _mm512_setzero_ps();
      transpose16(r);
      for (int64_t j = 0; j < nj; ++j) _mm512_mask_storeu_ps(dst + (j0 + j) * ldd + i0, mi, r[j]);
    }
  }
}

// A 64-byte-aligned float buffer that grows to the largest size asked for, so a steady state of the same shapes
// allocates nothing. The kernels keep one per thread (thread_local): made by the first call on each thread.
class ThreadBuffer {
 public:
  float* at_least(size_t elems) {
    if (capacity_ < elems) {
      const size_t bytes = (elems * sizeof(float) + 63) / 64 * 64;
      void* p = std::aligned_alloc(64, bytes);
      if (!p) throw std::bad_alloc();
      data_.reset(static_cast<float*>(p));
      capacity_ = bytes / sizeof(float);
    }
    return data_.get();
  }

 private:
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float, Free> data_;
  size_t capacity_ = 0;
};

}  // namespace onnxtrain::cpu::avx512
