// MaxPool, AveragePool, LpPool, their global forms and the fused MaxPoolGrad / AveragePoolGrad on the CPU: the
// pooling family (its rules: gradients/rules/pool.cpp; CUDA: executor/cuda/pool.cu). The window geometry is
// conv_geometry.h's, canonicalised to three spatial dims; the loops run parallel over planes, so no two threads
// write the same output.
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "executor/ops/conv_geometry.h"
#include "executor/ops/pool.h"
#include "executor/cpu/kernel_util.h"
#include "executor/kernel.h"
#include "graph/error.h"

#if defined(__AVX512F__)
#include <immintrin.h>

#include "executor/cpu/avx512.h"
#endif

namespace onnxtrain {
namespace {

using ops::Dims3;
using ops::Geo;
using ops::kMaxSpatial;
using ops::out_shape;
using ops::pool_geometry;
using cpu::required_input;
using cpu::set_output;

// ---- pooling ---------------------------------------------------------------------------------------------

// Calls f(offset within the plane) for every input position of output (o0, o1, o2)'s pooling window that lies
// inside the input (padding is skipped). A template so the pooling loops stay inlined.
template <class F> inline void for_each_in_window(const Geo& g, int64_t o0, int64_t o1, int64_t o2, F&& f) {
  for (int64_t j0 = 0; j0 < g.k[0]; ++j0) {
    const int64_t i0 = o0 * g.s[0] - g.pb[0] + j0 * g.d[0];
    if (i0 < 0 || i0 >= g.in[0]) continue;
    for (int64_t j1 = 0; j1 < g.k[1]; ++j1) {
      const int64_t i1 = o1 * g.s[1] - g.pb[1] + j1 * g.d[1];
      if (i1 < 0 || i1 >= g.in[1]) continue;
      for (int64_t j2 = 0; j2 < g.k[2]; ++j2) {
        const int64_t i2 = o2 * g.s[2] - g.pb[2] + j2 * g.d[2];
        if (i2 < 0 || i2 >= g.in[2]) continue;
        f((i0 * g.in[1] + i1) * g.in[2] + i2);
      }
    }
  }
}

// The maxima of one output row (fixed o0, o1) of plane xp: best[o2] and their offsets arg[o2] within the plane
// (-1 where the window holds no input). Taps outer, the row inner: for each tap the row's in-bounds outputs
// read x at a fixed stride and update (best, arg) by selects, not branches (random data mispredicts a compare
// per tap otherwise; this loop was half of W2's training step). Per output the taps come in row-major order and
// the test keeps the first maximum and lets a NaN win, as in the reference. arg may be null (values only).
template <class T> void max_pool_row(const Geo& g, const T* xp, int64_t o0, int64_t o1, T* best, int64_t* arg) {
  std::fill(best, best + g.out[2], -std::numeric_limits<T>::infinity());
  if (arg) std::fill(arg, arg + g.out[2], int64_t{-1});
  for (int64_t j0 = 0; j0 < g.k[0]; ++j0) {
    const int64_t i0 = o0 * g.s[0] - g.pb[0] + j0 * g.d[0];
    if (i0 < 0 || i0 >= g.in[0]) continue;
    for (int64_t j1 = 0; j1 < g.k[1]; ++j1) {
      const int64_t i1 = o1 * g.s[1] - g.pb[1] + j1 * g.d[1];
      if (i1 < 0 || i1 >= g.in[1]) continue;
      const T* xr = xp + (i0 * g.in[1] + i1) * g.in[2];
      const int64_t base = (i0 * g.in[1] + i1) * g.in[2];
      for (int64_t j2 = 0; j2 < g.k[2]; ++j2) {
        // Outputs o2 whose tap i2 = o2*s - pb + j2*d lies in [0, in).
        const int64_t shift = j2 * g.d[2] - g.pb[2], s2 = g.s[2];
        const int64_t lo = shift >= 0 ? 0 : (-shift + s2 - 1) / s2;
        const int64_t hi = std::min(g.out[2], g.in[2] - shift <= 0 ? 0 : (g.in[2] - shift - 1) / s2 + 1);
        if (arg) {
          for (int64_t o2 = lo; o2 < hi; ++o2) {
            const T v = xr[shift + o2 * s2];
            const bool take = arg[o2] < 0 || v > best[o2] || (v != v && best[o2] == best[o2]);
            best[o2] = take ? v : best[o2];
            arg[o2] = take ? base + shift + o2 * s2 : arg[o2];
          }
        } else {
          for (int64_t o2 = lo; o2 < hi; ++o2) {
            const T v = xr[shift + o2 * s2];
            const bool take = v > best[o2] || (v != v && best[o2] == best[o2]);
            best[o2] = take ? v : best[o2];
          }
        }
      }
    }
  }
}

// Pools whose windows tile the plane: no padding, no dilation, stride equal to the kernel, every window inside
// the input, and a depth kernel of 1 (1-D and 2-D pools; the CNN's 2x2/2). Every input position then belongs to
// at most one window, so the maxima need no bounds checks and the gradient is written, not scattered. The
// general row loop above spends most of its time on window bookkeeping for windows this small: it was 38% of
// W2's process in `perf record` (MaxPool 21%, MaxPoolGrad 17%) once the convolutions ran blocked.
bool tiles_plane(const Geo& g) {
  for (size_t i = 0; i < kMaxSpatial; ++i)
    if (g.pb[i] != 0 || g.d[i] != 1 || g.s[i] != g.k[i] || g.out[i] * g.s[i] > g.in[i]) return false;
  return g.k[0] == 1;
}

// One output row of a tiled pool: for each window o (starting at r + o * kw, rows `row` apart) its maximum and
// the window-local tap index (i * kw + j) of that maximum, by the general loop's rule: taps in row-major order,
// the first maximum kept, a NaN wins. Branch-free selects: with branches, random data mispredicts about one
// compare per tap (that made this path no faster than the general one). KH, KW > 0 fix the window at compile
// time. (Vectorising across the row gains nothing: CNN rows are 7-28 windows, mostly a scalar epilogue.)
template <int KH, int KW, class T>
inline void tile_row_max(const T* r, int64_t row, int64_t kh, int64_t kw, int64_t n, T* best, int32_t* at) {
  if constexpr (KH > 0) {
    kh = KH;
    kw = KW;
  }
  for (int64_t o = 0; o < n; ++o) {
    const T* w = r + o * kw;
    T b = w[0];
    int32_t a = 0;
    for (int64_t i = 0; i < kh; ++i)
      for (int64_t j = 0; j < kw; ++j) {
        const T v = w[i * row + j];
        const bool take = (v > b) | ((v != v) & (b == b));
        b = take ? v : b;
        a = take ? static_cast<int32_t>(i * kw + j) : a;
      }
    best[o] = b;
    at[o] = a;
  }
}

// Calls f(window row start within the plane, output row start within the plane) for every output row.
template <class F> inline void for_each_tile_row(const Geo& g, F&& f) {
  for (int64_t o0 = 0; o0 < g.out[0]; ++o0)
    for (int64_t o1 = 0; o1 < g.out[1]; ++o1) f((o0 * g.in[1] + o1 * g.k[1]) * g.in[2], (o0 * g.out[1] + o1) * g.out[2]);
}

// Output rows are processed in pieces of at most kTileRow windows (stack buffers).
inline constexpr int64_t kTileRow = 256;

template <int KH, int KW, class T> void max_pool_tiled(const Geo& g, const T* x, T* y) {
  const int64_t isz = g.in_size(), osz = g.out_size(), row = g.in[2];
  cpu::parallel_for(g.N * g.C, g.N * g.C * isz > (1 << 15), [&](int64_t p) {
    const T* xp = x + p * isz;
    T* yp = y + p * osz;
    int32_t at[kTileRow];
    for_each_tile_row(g, [&](int64_t i, int64_t o) {
      for (int64_t c = 0; c < g.out[2]; c += kTileRow)
        tile_row_max<KH, KW>(xp + i + c * g.k[2], row, g.k[1], g.k[2], std::min(kTileRow, g.out[2] - c), yp + o + c, at);
    });
  });
}

// dX: dY at each window's maximum, zero elsewhere (and on the rows/columns no window covers).
template <int KH, int KW, class T> void max_pool_grad_tiled(const Geo& g, const T* dy, const T* x, T* dx) {
  const int64_t isz = g.in_size(), osz = g.out_size(), row = g.in[2];
  const bool covered = g.out[1] * g.k[1] == g.in[1] && g.out[2] * g.k[2] == g.in[2];
  const int64_t kh = KH > 0 ? KH : g.k[1], kw = KW > 0 ? KW : g.k[2];
  cpu::parallel_for(g.N * g.C, g.N * g.C * isz > (1 << 15), [&](int64_t p) {
    const T* xp = x + p * isz;
    const T* dyp = dy + p * osz;
    T* dxp = dx + p * isz;
    if (!covered) std::fill(dxp, dxp + isz, T(0));
    T best[kTileRow];
    int32_t at[kTileRow];
    for_each_tile_row(g, [&](int64_t i, int64_t o) {
      for (int64_t c = 0; c < g.out[2]; c += kTileRow) {
        const int64_t n = std::min(kTileRow, g.out[2] - c);
        T* d = dxp + i + c * kw;
        const T* v = dyp + o + c;
        tile_row_max<KH, KW>(xp + i + c * kw, row, kh, kw, n, best, at);
        for (int64_t a = 0; a < kh; ++a)
          for (int64_t b = 0; b < kw; ++b) {
            const int32_t tap = static_cast<int32_t>(a * kw + b);
            T* dr = d + a * row + b;
#pragma omp simd
            for (int64_t q = 0; q < n; ++q) dr[q * kw] = at[q] == tap ? v[q] : T(0);
          }
      }
    });
  });
}

// The 2x2/2 pool over a plane with even sides (W2's two pools), in passes that run along whole rows or the whole
// plane instead of 7-14 windows at a time, so they vectorise: (1) per pair of rows, the larger of the two taps of
// each column and which row it came from; (2) along the plane, whose rows are now half as many and each column
// pair is one window, the larger column. `takes(v, b)`: v replaces the running maximum b (the general loop's rule:
// greater, or a NaN over a number; the earlier tap wins ties and between NaNs).
template <class T> inline bool takes(T v, T b) { return (v > b) | ((v != v) & (b == b)); }

// c ? a : b by bit masks. The rows here are 14-28 long, so a good part of every pass is the vectorised loops'
// scalar remainder, where GCC compiles a float `?:` to a branch that random data mispredicts half the time
// (`perf annotate` put most of MaxPoolGrad's time on two such branches).
template <class T> inline T pick(bool c, T a, T b) {
  using U = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
  const U m = U(0) - static_cast<U>(c);
  return std::bit_cast<T>((std::bit_cast<U>(a) & m) | (std::bit_cast<U>(b) & ~m));
}

struct Pool2x2Scratch {
  std::vector<float> f;
  std::vector<double> d;
  std::vector<int32_t> row, col;
  template <class T> T* values() {
    if constexpr (std::is_same_v<T, float>) return f.data();
    else return d.data();
  }
};

bool is_even_2x2(const Geo& g) {
  return tiles_plane(g) && g.k[1] == 2 && g.k[2] == 2 && g.in[1] == 2 * g.out[1] && g.in[2] == 2 * g.out[2];
}

// (1) for the plane's row pairs: m[t] the larger of x's rows 2h and 2h+1 at column c (t = h * W + c) and, when
// row_of is given, 1 where the lower row won.
template <class T> inline void pool2x2_vertical(const Geo& g, const T* xp, T* m, int32_t* row_of) {
  const int64_t W = g.in[2], H2 = g.out[0] * g.out[1];
  for (int64_t h = 0; h < H2; ++h) {
    const T* a = xp + 2 * h * W;
    const T* c = a + W;
    T* mh = m + h * W;
    if (row_of) {
      int32_t* rh = row_of + h * W;
      for (int64_t x = 0; x < W; ++x) {
        const bool t = takes(c[x], a[x]);
        mh[x] = pick(t, c[x], a[x]);
        rh[x] = t;
      }
    } else {
      for (int64_t x = 0; x < W; ++x) mh[x] = pick(takes(c[x], a[x]), c[x], a[x]);
    }
  }
}

template <class T> void max_pool_2x2(const T* xp, T* yp, const Geo& g, Pool2x2Scratch& s) {
  T* m = s.values<T>();
  pool2x2_vertical(g, xp, m, nullptr);
  const int64_t n = g.out_size();
  for (int64_t q = 0; q < n; ++q) yp[q] = pick(takes(m[2 * q + 1], m[2 * q]), m[2 * q + 1], m[2 * q]);
}

// dX: each window's dY at its maximum's position, zero at the other three.
template <class T> void max_pool_grad_2x2(const T* dyp, const T* xp, T* dxp, const Geo& g, Pool2x2Scratch& s) {
  T* m = s.values<T>();
  int32_t* row_of = s.row.data();
  int32_t* col = s.col.data();
  pool2x2_vertical(g, xp, m, row_of);
  const int64_t n = g.out_size(), W = g.in[2], H2 = g.out[0] * g.out[1];
  // (2) the winning column of each window: the right one when it takes the left one's maximum, or ties it (or
  // is NaN with it) from an earlier tap (the top right tap 1 comes before the bottom left tap 2).
  for (int64_t q = 0; q < n; ++q) {
    const T a = m[2 * q], c = m[2 * q + 1];
    const bool earlier = row_of[2 * q + 1] < row_of[2 * q];
    col[q] = takes(c, a) | (((c == a) | ((c != c) & (a != a))) & earlier);
  }
  // (3) along the plane: dY in the winning column of each window, then split by row.
  for (int64_t q = 0; q < n; ++q) {
    m[2 * q] = pick(col[q] == 0, dyp[q], T(0));
    m[2 * q + 1] = pick(col[q] != 0, dyp[q], T(0));
  }
  for (int64_t h = 0; h < H2; ++h) {
    T* top = dxp + 2 * h * W;
    T* bottom = top + W;
    const T* e = m + h * W;
    const int32_t* r = row_of + h * W;
    for (int64_t x = 0; x < W; ++x) top[x] = pick(r[x] == 0, e[x], T(0));
    for (int64_t x = 0; x < W; ++x) bottom[x] = pick(r[x] != 0, e[x], T(0));
  }
}

#if defined(__AVX512F__)
// The same 2x2/2 pool on float32, 16 windows a vector, in one pass over each pair of rows: the two rows' 32 columns
// are split into the windows' four taps (even and odd columns of each row), and `takes` picks among them in tap
// order, as above. The passes above spent more time on their scratch rows than on the compares (W2's two
// MaxPoolGrads were 15% of its step, the MaxPools 7%).
struct Window2x2 {
  __m512 best;
  __mmask16 tap[4];  // which tap won, one mask per tap
};

inline __mmask16 takes16(__m512 v, __m512 b) {
  return _mm512_cmp_ps_mask(v, b, _CMP_GT_OQ) |
         (_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q) & _mm512_cmp_ps_mask(b, b, _CMP_ORD_Q));
}

// n <= 16 windows whose top rows start at top (the bottom rows at bottom): 2n columns of each row.
inline Window2x2 windows_2x2(const float* top, const float* bottom, int64_t n) {
  const __mmask16 m0 = cpu::avx512::lanes(2 * n), m1 = cpu::avx512::lanes(2 * n - 16);
  const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i odd = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
  const __m512 t0 = _mm512_maskz_loadu_ps(m0, top), t1 = _mm512_maskz_loadu_ps(m1, top + 16);
  const __m512 b0 = _mm512_maskz_loadu_ps(m0, bottom), b1 = _mm512_maskz_loadu_ps(m1, bottom + 16);
  const __m512 taps[4] = {_mm512_permutex2var_ps(t0, even, t1), _mm512_permutex2var_ps(t0, odd, t1),
                          _mm512_permutex2var_ps(b0, even, b1), _mm512_permutex2var_ps(b0, odd, b1)};
  Window2x2 w{taps[0], {}};
  __mmask16 later = 0;  // taken by a later tap
  __mmask16 took[4] = {0, 0, 0, 0};
  for (int t = 1; t < 4; ++t) {
    took[t] = takes16(taps[t], w.best);
    w.best = _mm512_mask_mov_ps(w.best, took[t], taps[t]);
  }
  for (int t = 3; t >= 1; --t) {
    w.tap[t] = took[t] & ~later;
    later |= took[t];
  }
  w.tap[0] = ~later;
  return w;
}

// Calls f(top row, bottom row, output row), offsets into the tensors, for each pair of rows of every plane.
template <class F> void for_each_row_pair(const Geo& g, F&& f) {
  const int64_t W = g.in[2], rows = g.out[0] * g.out[1], isz = g.in_size(), osz = g.out_size(), planes = g.N * g.C;
  cpu::parallel_for(planes, planes * isz > (1 << 15), [&](int64_t p) {
    for (int64_t h = 0; h < rows; ++h) f(p * isz + 2 * h * W, p * isz + (2 * h + 1) * W, p * osz + h * g.out[2]);
  });
}

void max_pool_2x2_avx512(const Geo& g, const float* x, float* y) {
  for_each_row_pair(g, [&](int64_t top, int64_t bottom, int64_t out) {
    for (int64_t w0 = 0; w0 < g.out[2]; w0 += 16) {
      const int64_t n = std::min<int64_t>(16, g.out[2] - w0);
      const Window2x2 w = windows_2x2(x + top + 2 * w0, x + bottom + 2 * w0, n);
      _mm512_mask_storeu_ps(y + out + w0, cpu::avx512::lanes(n), w.best);
    }
  });
}

// dX: each window's dY at its winning tap, zero at the other three; the taps are interleaved back into columns.
void max_pool_grad_2x2_avx512(const Geo& g, const float* dy, const float* x, float* dx) {
  const __m512i lo = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const __m512i hi = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
  for_each_row_pair(g, [&](int64_t top, int64_t bottom, int64_t out) {
    for (int64_t w0 = 0; w0 < g.out[2]; w0 += 16) {
      const int64_t n = std::min<int64_t>(16, g.out[2] - w0);
      const Window2x2 w = windows_2x2(x + top + 2 * w0, x + bottom + 2 * w0, n);
      const __m512 d = _mm512_maskz_loadu_ps(cpu::avx512::lanes(n), dy + out + w0);
      const __mmask16 m0 = cpu::avx512::lanes(2 * n), m1 = cpu::avx512::lanes(2 * n - 16);
      const int64_t rows[2] = {top, bottom};
      for (int r = 0; r < 2; ++r) {
        const __m512 left = _mm512_maskz_mov_ps(w.tap[2 * r], d), right = _mm512_maskz_mov_ps(w.tap[2 * r + 1], d);
        float* row = dx + rows[r] + 2 * w0;
        _mm512_mask_storeu_ps(row, m0, _mm512_permutex2var_ps(left, lo, right));
        _mm512_mask_storeu_ps(row + 16, m1, _mm512_permutex2var_ps(left, hi, right));
      }
    }
  });
}
#endif

// Which 2x2 path a dtype takes: the one pass above (float32 on AVX-512), or the passes before it, with scratch.
#if defined(__AVX512F__)
template <class T> constexpr bool kOnePass2x2 = std::is_same_v<T, float>;
#else
template <class T> constexpr bool kOnePass2x2 = false;
#endif

// Per-thread scratch for the 2x2 passes, sized at plan time for omp_get_max_threads() threads (run() allocates
// nothing), and a loop over planes that hands each call its thread's slot.
std::vector<Pool2x2Scratch> pool2x2_scratch(const Geo& g, bool is_double, bool gradient) {
  const size_t threads = static_cast<size_t>(std::max(1, omp_get_max_threads()));
  const size_t half = static_cast<size_t>(g.out[0] * g.out[1] * g.in[2]);
  std::vector<Pool2x2Scratch> s(threads);
  for (Pool2x2Scratch& t : s) {
    if (is_double) t.d.resize(half);
    else t.f.resize(half);
    if (gradient) {
      t.row.resize(half);
      t.col.resize(static_cast<size_t>(g.out_size()));
    }
  }
  return s;
}

template <class F> void for_each_plane(const Geo& g, std::vector<Pool2x2Scratch>& scratch, F&& f) {
  const int64_t planes = g.N * g.C;
  const int threads = std::min(static_cast<int>(scratch.size()), omp_get_max_threads());
  if (threads < 2 || planes < 2 || planes * g.in_size() <= (1 << 15)) {
    for (int64_t p = 0; p < planes; ++p) f(p, scratch[0]);
    return;
  }
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t p = 0; p < planes; ++p) f(p, scratch[static_cast<size_t>(omp_get_thread_num())]);
}

// Runs f.template operator()<KH, KW>() with the window fixed at compile time for the common 2x2 (and 1-D 2),
// at run time (0, 0) otherwise.
template <class F> void with_tile(const Geo& g, F&& f) {
  if (g.k[1] == 2 && g.k[2] == 2) return f.template operator()<2, 2>();
  if (g.k[1] == 1 && g.k[2] == 2) return f.template operator()<1, 2>();
  if (g.k[1] == 3 && g.k[2] == 3) return f.template operator()<3, 3>();
  f.template operator()<0, 0>();
}

template <class T> class MaxPoolKernel final : public Kernel {
 public:
  MaxPoolKernel(Geo g, bool indices, bool col_major)
      : g_(g), indices_(indices), col_major_(col_major), even_2x2_(!indices && is_even_2x2(g)) {
    if (even_2x2_ && !kOnePass2x2<T>) scratch_ = pool2x2_scratch(g_, std::is_same_v<T, double>, false);
  }

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const T* x = in[0]->ptr<T>();
    T* y = out[0]->ptr<T>();
    int64_t* idx = indices_ ? out[1]->ptr<int64_t>() : nullptr;
    const Geo g = g_;
    if (even_2x2_) {
#if defined(__AVX512F__)
      if constexpr (kOnePass2x2<T>) return max_pool_2x2_avx512(g, x, y);
#endif
      const int64_t isz = g.in_size(), osz = g.out_size();
      return for_each_plane(g, scratch_, [&](int64_t p, Pool2x2Scratch& s) { max_pool_2x2(x + p * isz, y + p * osz, g, s); });
    }
    if (!idx && tiles_plane(g))
      return with_tile(g, [&]<int KH, int KW>() { max_pool_tiled<KH, KW>(g, x, y); });
    const int64_t isz = g.in_size(), osz = g.out_size(), planes = g.N * g.C;
    cpu::parallel_for(planes, planes * osz * g.k_size() > (1 << 15), [&](int64_t p) {
      for (int64_t o0 = 0; o0 < g.out[0]; ++o0)
        for (int64_t o1 = 0; o1 < g.out[1]; ++o1) {
          const int64_t row = p * osz + (o0 * g.out[1] + o1) * g.out[2];
          int64_t* arg = idx ? idx + row : nullptr;
          max_pool_row(g, x + p * isz, o0, o1, y + row, arg);
          if (arg)
            for (int64_t o2 = 0; o2 < g.out[2]; ++o2)
              if (arg[o2] >= 0) arg[o2] = p * isz + (col_major_ ? col_major_index(g, arg[o2]) : arg[o2]);
        }
    });
  }

 private:
  // storage_order=1: the offset within the plane with the spatial dims in column-major order.
  static int64_t col_major_index(const Geo& g, int64_t at) {
    const int64_t i2 = at % g.in[2], i1 = (at / g.in[2]) % g.in[1], i0 = at / (g.in[2] * g.in[1]);
    const size_t off = kMaxSpatial - g.rank;
    const std::array<int64_t, 3> pos{i0, i1, i2};
    int64_t r = 0, mul = 1;
    for (size_t i = off; i < kMaxSpatial; ++i) {
      r += pos[i] * mul;
      mul *= g.in[i];
    }
    return r;
  }

  Geo g_;
  bool indices_, col_major_;
  bool even_2x2_;                        // the 2x2/2 pool on even sides, without Indices
  std::vector<Pool2x2Scratch> scratch_;  // its passes' scratch, where the one-pass path does not run
};

// onnxtrain.MaxPoolGrad(dY, X) -> dX, with MaxPool's attributes: each dY goes to its window's first maximum,
// found again from X (ONNX MaxPool outputs no indices unless asked), in one pass per plane. Its function body
// recomputes MaxPool's Indices and scatters dY into zeros with ScatterElements.
template <class T> class MaxPoolGradKernel final : public Kernel {
 public:
  explicit MaxPoolGradKernel(Geo g) : g_(g), even_2x2_(is_even_2x2(g)) {
    if (even_2x2_ && !kOnePass2x2<T>) scratch_ = pool2x2_scratch(g_, std::is_same_v<T, double>, true);
    // One row of maxima and offsets per thread, so run() allocates nothing.
    const size_t threads = static_cast<size_t>(std::max(1, omp_get_max_threads()));
    best_.resize(threads * static_cast<size_t>(g_.out[2]));
    arg_.resize(threads * static_cast<size_t>(g_.out[2]));
  }

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const T* dy = in[0]->ptr<T>();
    const T* x = in[1]->ptr<T>();
    T* dx = out[0]->ptr<T>();
    const Geo g = g_;
    if (even_2x2_) {
#if defined(__AVX512F__)
      if constexpr (kOnePass2x2<T>) return max_pool_grad_2x2_avx512(g, dy, x, dx);
#endif
      const int64_t isz = g.in_size(), osz = g.out_size();
      return for_each_plane(g, scratch_, [&](int64_t p, Pool2x2Scratch& s) {
        max_pool_grad_2x2(dy + p * osz, x + p * isz, dx + p * isz, g, s);
      });
    }
    if (tiles_plane(g))
      return with_tile(g, [&]<int KH, int KW>() { max_pool_grad_tiled<KH, KW>(g, dy, x, dx); });
    const int64_t isz = g.in_size(), osz = g.out_size(), planes = g.N * g.C;
    const int threads = static_cast<int>(best_.size() / static_cast<size_t>(g.out[2]));
    const auto plane = [&](int64_t p) {
      const size_t slot = static_cast<size_t>(omp_get_thread_num()) * static_cast<size_t>(g.out[2]);
      T* best = best_.data() + slot;
      int64_t* arg = arg_.data() + slot;
      T* dxp = dx + p * isz;
      std::fill(dxp, dxp + isz, T(0));
      for (int64_t o0 = 0; o0 < g.out[0]; ++o0)
        for (int64_t o1 = 0; o1 < g.out[1]; ++o1) {
          max_pool_row(g, x + p * isz, o0, o1, best, arg);
          const T* dyr = dy + p * osz + (o0 * g.out[1] + o1) * g.out[2];
          for (int64_t o2 = 0; o2 < g.out[2]; ++o2)
            if (arg[o2] >= 0) dxp[arg[o2]] += dyr[o2];
        }
    };
    // The scratch has a slot per thread of the plan. A plain loop for one thread or little work: an `omp
    // parallel` region mallocs a team even then.
    if (threads < 2 || !(planes * osz * g.k_size() > (1 << 15))) {
      for (int64_t p = 0; p < planes; ++p) plane(p);
    } else {
#pragma omp parallel for schedule(static) num_threads(threads)
      for (int64_t p = 0; p < planes; ++p) plane(p);
    }
  }

 private:
  Geo g_;
  bool even_2x2_;  // the 2x2/2 pool on even sides
  std::vector<T> best_;
  std::vector<int64_t> arg_;
  std::vector<Pool2x2Scratch> scratch_;  // its passes' scratch, where the one-pass path does not run
};

template <class T> class AvgPoolKernel final : public Kernel {
 public:
  AvgPoolKernel(Geo g, bool include_pad) : g_(g), include_pad_(include_pad) {}

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const T* x = in[0]->ptr<T>();
    T* y = out[0]->ptr<T>();
    const Geo g = g_;
    const int64_t isz = g.in_size(), osz = g.out_size(), planes = g.N * g.C;
    cpu::parallel_for(planes, planes * osz * g.k_size() > (1 << 15), [&](int64_t p) {
      const T* xp = x + p * isz;
      for (int64_t o0 = 0; o0 < g.out[0]; ++o0)
        for (int64_t o1 = 0; o1 < g.out[1]; ++o1)
          for (int64_t o2 = 0; o2 < g.out[2]; ++o2) {
            T acc = 0;
            const std::array<int64_t, 3> o{o0, o1, o2};
            for_each_in_window(g, o0, o1, o2, [&](int64_t at) { acc += xp[at]; });
            y[p * osz + (o0 * g.out[1] + o1) * g.out[2] + o2] = acc / static_cast<T>(ops::avg_pool_count(g, o, include_pad_));
          }
    });
  }

 private:
  Geo g_;
  bool include_pad_;
};

// onnxtrain.AveragePoolGrad(dY, X) -> dX with AveragePool's attributes: each dY divided by its window's
// divisor (counted as the forward kernel counts it) and added at the window's taps inside X. The reciprocal
// divisors are computed once, at plan time.
template <class T> class AvgPoolGradKernel final : public Kernel {
 public:
  AvgPoolGradKernel(Geo g, bool include_pad) : g_(g), inv_(static_cast<size_t>(g.out_size())) {
    for (int64_t o0 = 0; o0 < g.out[0]; ++o0)
      for (int64_t o1 = 0; o1 < g.out[1]; ++o1)
        for (int64_t o2 = 0; o2 < g.out[2]; ++o2)
          inv_[static_cast<size_t>((o0 * g.out[1] + o1) * g.out[2] + o2)] =
              T(1) / static_cast<T>(ops::avg_pool_count(g, {o0, o1, o2}, include_pad));
  }

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const T* dy = in[0]->ptr<T>();
    T* dx = out[0]->ptr<T>();
    const Geo g = g_;
    const T* inv = inv_.data();
    const int64_t isz = g.in_size(), osz = g.out_size(), planes = g.N * g.C;
    cpu::parallel_for(planes, planes * osz * g.k_size() > (1 << 15), [&](int64_t p) {
      T* dxp = dx + p * isz;
      const T* dyp = dy + p * osz;
      std::fill(dxp, dxp + isz, T(0));
      for (int64_t o0 = 0; o0 < g.out[0]; ++o0)
        for (int64_t o1 = 0; o1 < g.out[1]; ++o1)
          for (int64_t o2 = 0; o2 < g.out[2]; ++o2) {
            const int64_t o = (o0 * g.out[1] + o1) * g.out[2] + o2;
            const T v = dyp[o] * inv[o];
            for_each_in_window(g, o0, o1, o2, [&](int64_t at) { dxp[at] += v; });
          }
    });
  }

 private:
  Geo g_;
  std::vector<T> inv_;
};

// LpPool / GlobalLpPool: Y = (sum over the window of |x|^p)^(1/p); padding adds zeros, so it is skipped. The
// sums run in double; p = 1 and 2 avoid pow.
template <class T> T lp_norm(double sum, int64_t p) {
  return static_cast<T>(p == 1 ? sum : p == 2 ? std::sqrt(sum) : std::pow(sum, 1.0 / static_cast<double>(p)));
}
inline double lp_term(double v, int64_t p) {
  return p == 1 ? std::abs(v) : p == 2 ? v * v : std::pow(std::abs(v), static_cast<double>(p));
}

template <class T> class LpPoolKernel final : public Kernel {
 public:
  LpPoolKernel(Geo g, int64_t p) : g_(g), p_(p) {}

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const T* x = in[0]->ptr<T>();
    T* y = out[0]->ptr<T>();
    const Geo g = g_;
    const int64_t p = p_, isz = g.in_size(), osz = g.out_size(), planes = g.N * g.C;
    cpu::parallel_for(planes, planes * osz * g.k_size() > (1 << 13), [&](int64_t pl) {
      const T* xp = x + pl * isz;
      for (int64_t o0 = 0; o0 < g.out[0]; ++o0)
        for (int64_t o1 = 0; o1 < g.out[1]; ++o1)
          for (int64_t o2 = 0; o2 < g.out[2]; ++o2) {
            double acc = 0;
            for_each_in_window(g, o0, o1, o2, [&](int64_t at) { acc += lp_term(static_cast<double>(xp[at]), p); });
            y[pl * osz + (o0 * g.out[1] + o1) * g.out[2] + o2] = lp_norm<T>(acc, p);
          }
    });
  }

 private:
  Geo g_;
  int64_t p_;
};

template <class T> class GlobalLpPoolKernel final : public Kernel {
 public:
  GlobalLpPoolKernel(int64_t planes, int64_t size, int64_t p) : planes_(planes), size_(size), p_(p) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const T* x = in[0]->ptr<T>();
    T* y = out[0]->ptr<T>();
    cpu::parallel_for(planes_, planes_ * size_ > (1 << 13), [&](int64_t pl) {
      double acc = 0;
      for (int64_t i = 0; i < size_; ++i) acc += lp_term(static_cast<double>(x[pl * size_ + i]), p_);
      y[pl] = lp_norm<T>(acc, p_);
    });
  }

 private:
  int64_t planes_, size_, p_;
};

// LpPool's p: an int from opset 2 (opset 1's float p is not supported); ONNX leaves p < 1 undefined.
int64_t lp_pool_p(PrepareContext& ctx) {
  const int64_t p = ctx.node.attr_int("p", 2);
  if (p < 1) ctx.fail("p must be >= 1, got " + std::to_string(p));
  return p;
}

template <class T, bool Max> class GlobalPoolKernel final : public Kernel {
 public:
  GlobalPoolKernel(int64_t planes, int64_t size) : planes_(planes), size_(size) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const T* x = in[0]->ptr<T>();
    T* y = out[0]->ptr<T>();
    cpu::parallel_for(planes_, planes_ * size_ > (1 << 15), [&](int64_t p) {
      const T* xp = x + p * size_;
      if constexpr (Max) {
        T m = -std::numeric_limits<T>::infinity();
        for (int64_t i = 0; i < size_; ++i)
          if (xp[i] > m || std::isnan(xp[i])) m = xp[i];
        y[p] = m;
      } else {
        double s = 0;  // a large spatial plane loses float digits otherwise
        for (int64_t i = 0; i < size_; ++i) s += xp[i];
        y[p] = static_cast<T>(s / static_cast<double>(size_));
      }
    });
  }

 private:
  int64_t planes_, size_;
};

std::unique_ptr<Kernel> make_max_pool(PrepareContext& ctx) {
  const ops::MaxPoolAttrs a = ops::prepare_max_pool(ctx);
  const DType t = ctx.inputs[0].dtype;
  if (t == DType::Float32) return std::make_unique<MaxPoolKernel<float>>(a.g, a.indices, a.column_major);
  if (t == DType::Float64) return std::make_unique<MaxPoolKernel<double>>(a.g, a.indices, a.column_major);
  cpu::fail_dtype(ctx);
}

std::unique_ptr<Kernel> make_max_pool_grad(PrepareContext& ctx) {
  const Geo g = ops::prepare_max_pool_grad(ctx);
  const DType t = ctx.inputs[1].dtype;
  if (t == DType::Float32) return std::make_unique<MaxPoolGradKernel<float>>(g);
  if (t == DType::Float64) return std::make_unique<MaxPoolGradKernel<double>>(g);
  cpu::fail_dtype(ctx);
}

std::unique_ptr<Kernel> make_avg_pool(PrepareContext& ctx) {
  const ops::AvgPoolAttrs a = ops::prepare_avg_pool(ctx);
  const DType t = ctx.inputs[0].dtype;
  if (t == DType::Float32) return std::make_unique<AvgPoolKernel<float>>(a.g, a.include_pad);
  if (t == DType::Float64) return std::make_unique<AvgPoolKernel<double>>(a.g, a.include_pad);
  cpu::fail_dtype(ctx);
}

std::unique_ptr<Kernel> make_avg_pool_grad(PrepareContext& ctx) {
  const ops::AvgPoolAttrs a = ops::prepare_avg_pool_grad(ctx);
  const DType t = ctx.inputs[1].dtype;
  if (t == DType::Float32) return std::make_unique<AvgPoolGradKernel<float>>(a.g, a.include_pad);
  if (t == DType::Float64) return std::make_unique<AvgPoolGradKernel<double>>(a.g, a.include_pad);
  cpu::fail_dtype(ctx, 1);
}

template <bool Max> std::unique_ptr<Kernel> make_global_pool(PrepareContext& ctx) {
  const ops::GlobalPoolGeometry g = ops::prepare_global_pool(ctx);
  const DType t = ctx.inputs[0].dtype;
  if (t == DType::Float32) return std::make_unique<GlobalPoolKernel<float, Max>>(g.planes, g.size);
  if (t == DType::Float64) return std::make_unique<GlobalPoolKernel<double, Max>>(g.planes, g.size);
  cpu::fail_dtype(ctx);
}

std::unique_ptr<Kernel> make_lp_pool(PrepareContext& ctx) {
  const Geo g = pool_geometry(ctx);
  const DType t = ctx.inputs[0].dtype;
  const int64_t p = lp_pool_p(ctx);
  set_output(ctx, 0, t, out_shape(g, g.C));
  if (t == DType::Float32) return std::make_unique<LpPoolKernel<float>>(g, p);
  if (t == DType::Float64) return std::make_unique<LpPoolKernel<double>>(g, p);
  cpu::fail_dtype(ctx);
}

std::unique_ptr<Kernel> make_global_lp_pool(PrepareContext& ctx) {
  const KernelInput& x = required_input(ctx, 0, "X");
  if (x.shape.size() < 3) ctx.fail("X " + shape_string(x.shape) + " must have rank >= 3");
  const int64_t p = lp_pool_p(ctx);
  std::vector<int64_t> out{x.shape[0], x.shape[1]};
  int64_t size = 1;
  for (size_t i = 2; i < x.shape.size(); ++i) {
    out.push_back(1);
    size *= x.shape[i];
  }
  set_output(ctx, 0, x.dtype, out);
  const int64_t planes = x.shape[0] * x.shape[1];
  if (x.dtype == DType::Float32) return std::make_unique<GlobalLpPoolKernel<float>>(planes, size, p);
  if (x.dtype == DType::Float64) return std::make_unique<GlobalLpPoolKernel<double>>(planes, size, p);
  cpu::fail_dtype(ctx);
}

}  // namespace

void register_cpu_pool(KernelRegistry& r) {
  const std::vector<DType> flt = {DType::Float32, DType::Float64};
  cpu::add(r, "MaxPool", 1, flt, make_max_pool);
  cpu::add(r, "onnxtrain", "MaxPoolGrad", 1, flt, make_max_pool_grad);
  cpu::add(r, "AveragePool", 1, flt, make_avg_pool);
  cpu::add(r, "onnxtrain", "AveragePoolGrad", 1, flt, make_avg_pool_grad);
  cpu::add(r, "GlobalAveragePool", 1, flt, make_global_pool<false>);
  cpu::add(r, "GlobalMaxPool", 1, flt, make_global_pool<true>);
  cpu::add(r, "LpPool", 2, flt, make_lp_pool);
  cpu::add(r, "GlobalLpPool", 2, flt, make_global_lp_pool);
}

}  // namespace onnxtrain
