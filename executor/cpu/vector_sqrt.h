#pragma once
// Elementwise square root in vector instructions, shared by the Sqrt kernel and the fused elementwise kernel.
#include <cmath>
#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace onnxtrain::cpu {

// Adam takes sqrt(v) of every weight each step, and GCC keeps std::sqrt scalar (a branch and a libm call for
// errno on negative inputs) unless -fno-math-errno: that loop was about 9% of a W1-sk fit (docs/performance.md).
// The vector sqrt instructions are correctly rounded like std::sqrt, so the results are the same.
// GCC 12 warns falsely inside its own AVX-512 intrinsics (as for Eigen in eigen_map.h).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
inline void sqrt_span(const float* x, float* y, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_sqrt_ps(_mm512_loadu_ps(x + i)));
#elif defined(__AVX__)
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_sqrt_ps(_mm256_loadu_ps(x + i)));
#elif defined(__SSE2__)
  for (; i + 4 <= n; i += 4) _mm_storeu_ps(y + i, _mm_sqrt_ps(_mm_loadu_ps(x + i)));
#endif
  for (; i < n; ++i) y[i] = std::sqrt(x[i]);
}

inline void sqrt_span(const double* x, double* y, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 8 <= n; i += 8) _mm512_storeu_pd(y + i, _mm512_sqrt_pd(_mm512_loadu_pd(x + i)));
#elif defined(__AVX__)
  for (; i + 4 <= n; i += 4) _mm256_storeu_pd(y + i, _mm256_sqrt_pd(_mm256_loadu_pd(x + i)));
#elif defined(__SSE2__)
  for (; i + 2 <= n; i += 2) _mm_storeu_pd(y + i, _mm_sqrt_pd(_mm_loadu_pd(x + i)));
#endif
  for (; i < n; ++i) y[i] = std::sqrt(x[i]);
}
#pragma GCC diagnostic pop

}  // namespace onnxtrain::cpu
