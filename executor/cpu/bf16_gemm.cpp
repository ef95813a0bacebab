// The native bfloat16 GEMM (bf16_gemm.h). The loop nest of own_sgemm (gemm.cpp) with bfloat16 pairs:
//   for each block of kNc columns: pack op(B)[:, block] into panels of kNr columns, k in pairs;
//     for each strip of kMr rows: (pack the strip of A when it cannot be read in place)
//       for each panel: a kMr x kNr tile of float32 sums over all of K, then alpha, beta * C, one rounding.
// vdpbf16ps multiplies pairs: lane j of the accumulator gains a0 * b0[j] + a1 * b1[j], where (a0, a1) are two
// consecutive k of one row of A (one 32-bit word, broadcast) and (b0[j], b1[j]) the same two k of column j of B,
// packed next to each other. So B's panels hold, for each pair of k, 32 columns x 2 values (two vectors), and a
// row of A whose k are contiguous is read in place, pair by pair. K is padded to even with zeros.
// The kernels are compiled for AVX-512 BF16 whatever the build's -march, and only called after cpuid says the
// CPU has it; the rest of the file is plain C++.
#include "executor/cpu/bf16_gemm.h"

// GCC 12 flags the intrinsics' own undefined pass-through operands (avx512fintrin.h) as maybe-uninitialized.
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <omp.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <stdexcept>
#include <utility>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ONNXTRAIN_HAVE_BF16_KERNEL 1
#include <cpuid.h>
// GCC 12's AVX-512 headers build _mm512_cvtepi32_epi16 and _mm512_castsi256_si512 on an "undefined" register
// that -Wuninitialized then reports (a false positive, GCC bug 105593), once per inlined use.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#include <sys/syscall.h>
#include <unistd.h>
#else
#define ONNXTRAIN_HAVE_BF16_KERNEL 0
#endif

namespace onnxtrain::cpu {

namespace {
std::atomic<bool> g_forced_emulation{false};
std::atomic<bool> g_forced_avx512{false};
}  // namespace

bool bf16_native_supported() {
#if ONNXTRAIN_HAVE_BF16_KERNEL
  static const bool yes = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
  }();
  return yes;
#else
  return false;
#endif
}

bool bf16_native_enabled() { return bf16_native_supported() && !g_forced_emulation.load(); }

void force_bf16_emulation(bool on) { g_forced_emulation.store(on); }

std::string bf16_path_description() {
  if (!bf16_native_supported())
    return "bfloat16 MatMul/Gemm: float32 emulation (this CPU or build has no AVX-512 BF16; slower than float32)";
  if (g_forced_emulation.load()) return "bfloat16 MatMul/Gemm: float32 emulation (forced)";
  if (bf16_amx_supported() && !g_forced_avx512.load())
    return "bfloat16 MatMul/Gemm: native AMX-BF16 tiles (tdpbf16ps, float32 accumulation)";
  return "bfloat16 MatMul/Gemm: native AVX-512 BF16 (vdpbf16ps, float32 accumulation)";
}

bool bf16_amx_supported() {
#if ONNXTRAIN_HAVE_BF16_KERNEL
  static const bool yes = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
    const bool amx_bf16 = edx >> 22 & 1, amx_tile = edx >> 24 & 1;
    if (!amx_bf16 || !amx_tile || !bf16_native_supported()) return false;
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return yes;
#else
  return false;
#endif
}

void force_bf16_avx512_kernel(bool on) { g_forced_avx512.store(on); }

#if ONNXTRAIN_HAVE_BF16_KERNEL
// The instruction sets the kernels are compiled for; a macro because it is an attribute, which no function can be.
#define ONNXTRAIN_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

namespace {

constexpr int kMr = 14;        // rows of a tile: 14 x 2 accumulators + 2 vectors of B + a broadcast in 32 registers
constexpr int kNr = 32;        // columns of a tile and of a packed panel
constexpr int64_t kNc = 512;   // columns of B packed at a time

// A buffer per thread, grown by the first product that needs more and then reused (no allocation in a steady
// state).
class ThreadBytes {
 public:
  uint16_t* at_least(size_t elems) {
    if (capacity_ < elems) {
      const size_t bytes = (elems * sizeof(uint16_t) + 63) / 64 * 64;
      void* p = std::aligned_alloc(64, bytes);
      if (!p) throw std::bad_alloc();
      data_.reset(static_cast<uint16_t*>(p));
      capacity_ = bytes / sizeof(uint16_t);
    }
    return data_.get();
  }

 private:
  struct Free {
    void operator()(uint16_t* p) const { std::free(p); }
  };
  std::unique_ptr<uint16_t, Free> data_;
  size_t capacity_ = 0;
};

uint16_t* b_buffer(size_t elems) {
  thread_local ThreadBytes buffer;
  return buffer.at_least(elems);
}

uint16_t* a_buffer(size_t elems) {
  thread_local ThreadBytes buffer;
  return buffer.at_least(elems);
}

inline uint16_t at(const Bf16Matrix& m, int64_t i, int64_t j) { return m.p[i * m.rs + j * m.cs]; }

// Packs op(B)[0:K, j0:j0 + nc] into panels of kNr columns: panel q at bp + q * kp * kNr, holding for each pair p of
// k the kNr columns' (B[2p, j], B[2p + 1, j]) next to each other. Missing columns and the odd K's last k are zeros.
ONNXTRAIN_BF16_TARGET void pack_b(const Bf16Matrix& b, int64_t K, int64_t kp, int64_t j0, int64_t nc, uint16_t* bp) {
  const int64_t pairs = kp / 2;
  for (int64_t jr = 0; jr < nc; jr += kNr) {
    const int64_t nr = std::min<int64_t>(kNr, nc - jr);
    uint16_t* dst = bp + (jr / kNr) * kp * kNr;
    if (b.cs == 1) {
      // Rows of B contiguous: two rows of 32 columns interleaved by one two-source permutation each half.
      alignas(64) static constexpr std::array<uint16_t, 32> kLo = {0,  32, 1,  33, 2,  34, 3,  35, 4,  36, 5,
                                                                    37, 6,  38, 7,  39, 8,  40, 9,  41, 10, 42,
                                                                    11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
      const __m512i lo = _mm512_load_si512(kLo.data());
      const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
      const __mmask32 m = nr >= 32 ? ~__mmask32(0) : (__mmask32(1) << nr) - 1;
      for (int64_t p = 0; p < pairs; ++p) {
        const uint16_t* r0 = b.p + 2 * p * b.rs + j0 + jr;
        const __m512i x = 2 * p < K ? _mm512_maskz_loadu_epi16(m, r0) : _mm512_setzero_si512();
        const __m512i y = 2 * p + 1 < K ? _mm512_maskz_loadu_epi16(m, r0 + b.rs) : _mm512_setzero_si512();
        _mm512_store_si512(dst + p * 2 * kNr, _mm512_permutex2var_epi16(x, lo, y));
        _mm512_store_si512(dst + p * 2 * kNr + kNr, _mm512_permutex2var_epi16(x, hi, y));
      }
      continue;
    }
    std::memset(dst, 0, static_cast<size_t>(kp * kNr) * sizeof(uint16_t));
    if (b.rs == 1) {
      // Columns of B contiguous (B stored transposed): each column's pairs are 32-bit words already.
      for (int64_t j = 0; j < nr; ++j) {
        const uint16_t* col = b.p + (j0 + jr + j) * b.cs;
        uint32_t* d = reinterpret_cast<uint32_t*>(dst) + j;
        for (int64_t p = 0; p < K / 2; ++p) {
          uint32_t w;
          std::memcpy(&w, col + 2 * p, sizeof w);
          d[p * kNr] = w;
        }
        if (K % 2) dst[(K / 2) * 2 * kNr + 2 * j] = col[K - 1];
      }
      continue;
    }
    for (int64_t k = 0; k < K; ++k)
      for (int64_t j = 0; j < nr; ++j) dst[(k / 2) * 2 * kNr + 2 * j + (k % 2)] = at(b, k, j0 + jr + j);
  }
}

// Copies rows [i0, i0 + rows) of op(A) into `dst`, row-major with row stride kp, the padding k zero.
ONNXTRAIN_BF16_TARGET void pack_a(const Bf16Matrix& a, int64_t K, int64_t kp, int64_t i0, int64_t rows, uint16_t* dst) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t k = K; k < kp; ++k) dst[i * kp + k] = 0;
  if (a.rs == 1) {
    // A stored transposed: for each k, the strip's rows are contiguous.
    for (int64_t k = 0; k < K; ++k) {
      const uint16_t* src = a.p + k * a.cs + i0;
      for (int64_t i = 0; i < rows; ++i) dst[i * kp + k] = src[i];
    }
    return;
  }
  for (int64_t i = 0; i < rows; ++i) {
    if (a.cs == 1) {
      std::memcpy(dst + i * kp, a.p + (i0 + i) * a.rs, static_cast<size_t>(K) * sizeof(uint16_t));
      continue;
    }
    for (int64_t k = 0; k < K; ++k) dst[i * kp + k] = at(a, i0 + i, k);
  }
}

inline __mmask16 lanes(int64_t n) {
  return n >= 16 ? __mmask16(0xFFFF) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
}

// Transposes the 16 x 16 block of 32-bit words r[row][column] in place (2 x 2, 4 x 4, then 16 x 16 by 128-bit
// lanes): avx512::transpose16's shuffles, here for the kernel's own target (that header needs the build's -march).
ONNXTRAIN_BF16_TARGET inline void transpose16x16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0xDD);
    t[i + 8] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0xDD);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xDD);
    r[i + 4] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0x88);
    r[i + 12] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0xDD);
  }
}

// All of op(A) into `dst`, row-major [rows][kp] with rows = M rounded up to 16, padding zero. A stored transposed
// (a weight gradient's activations, A = X^T) goes 16 rows x 32 k at a time: two stored rows (k, k + 1) interleave
// into one word per row of op(A), and a 16 x 16 transpose of those words gives 16 rows of 32 k.
ONNXTRAIN_BF16_TARGET void pack_a_all(const Bf16Matrix& a, int64_t M, int64_t K, int64_t kp, uint16_t* dst) {
  const int64_t rows = (M + 15) / 16 * 16;
  if (a.rs != 1 || a.cs == 1) {
    pack_a(a, K, kp, 0, M, dst);
    std::memset(dst + M * kp, 0, static_cast<size_t>((rows - M) * kp) * sizeof(uint16_t));
    return;
  }
  alignas(64) static constexpr std::array<uint16_t, 32> kPairs = {0,  32, 1,  33, 2,  34, 3,  35, 4,  36, 5,
                                                                   37, 6,  38, 7,  39, 8,  40, 9,  41, 10, 42,
                                                                   11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  const __m512i pairs = _mm512_load_si512(kPairs.data());
  for (int64_t i0 = 0; i0 < rows; i0 += 16) {
    const __mmask16 m = static_cast<__mmask16>(M - i0 >= 16 ? 0xFFFF : (1u << (M - i0)) - 1);
    for (int64_t k0 = 0; k0 < kp; k0 += 32) {
      __m512i r[16];
      for (int p = 0; p < 16; ++p) {
        const int64_t k = k0 + 2 * p;
        const __m512i lo = k < K ? _mm512_zextsi256_si512(_mm256_maskz_loadu_epi16(m, a.p + k * a.cs + i0))
                                 : _mm512_setzero_si512();
        const __m512i hi = k + 1 < K ? _mm512_zextsi256_si512(_mm256_maskz_loadu_epi16(m, a.p + (k + 1) * a.cs + i0))
                                     : _mm512_setzero_si512();
        r[p] = _mm512_permutex2var_epi16(lo, pairs, hi);
      }
      transpose16x16(r);
      for (int i = 0; i < 16; ++i) _mm512_storeu_si512(dst + (i0 + i) * kp + k0, r[i]);
    }
  }
}

// How a finished tile meets Y: alpha, then beta * C broadcast by its strides (c.p null: no C).
struct Epilogue {
  float alpha, beta;
  Bf16Matrix c;
};

// float32 -> bfloat16 bits, round to nearest even, NaN kept NaN: FloatToBFloat16 (graph/float16.h), 16 lanes.
ONNXTRAIN_BF16_TARGET inline __m256i round_bf16(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i rounded = _mm512_srli_epi32(
      _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF),
                                              _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1)))),
      16);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(bits, _mm512_set1_epi32(0x7FFFFFFF)),
                                                _mm512_set1_epi32(0x7F800000));
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet));
}

ONNXTRAIN_BF16_TARGET inline __m512 widen_bf16(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// 16 sums of a row of Y (lanes m): alpha, plus beta times C's 16 values at c (null: no C), rounded once, stored at y.
ONNXTRAIN_BF16_TARGET inline void finish(__m512 s, __mmask16 m, const Epilogue& e, const uint16_t* c, uint16_t* y) {
  if (e.alpha != 1.0f) s = _mm512_mul_ps(_mm512_set1_ps(e.alpha), s);
  if (c) {
    __m512 cv;
    if (e.c.cs == 1) {
      cv = widen_bf16(_mm256_maskz_loadu_epi16(m, c));
    } else if (e.c.cs == 0) {
      cv = widen_bf16(_mm256_set1_epi16(static_cast<short>(*c)));
    } else {
      alignas(32) uint16_t tmp[16] = {};
      for (int j = 0; j < 16; ++j)
        if (m >> j & 1) tmp[j] = c[j * e.c.cs];
      cv = widen_bf16(_mm256_load_si256(reinterpret_cast<const __m256i*>(tmp)));
    }
    s = _mm512_fmadd_ps(_mm512_set1_ps(e.beta), cv, s);
  }
  _mm256_mask_storeu_epi16(y, m, round_bf16(s));
}

// R rows and V vectors of 16 columns (V = 1 for a last panel of at most 16) of Y over `pairs` pairs of k.
// A(i, 2p..2p+1) is the 32-bit word at a + i * lda + 2p; the panel is bp[p][kNr][2]. Y's tile is at y (rows ldy
// apart), C's at c (its strides), columns masked by m0/m1.
template <int R, int V>
ONNXTRAIN_BF16_TARGET void tile(int64_t pairs, const uint16_t* __restrict a, int64_t lda, const uint16_t* __restrict bp,
                                uint16_t* __restrict y, int64_t ldy, __mmask16 m0, __mmask16 m1, const Epilogue& e,
                                const uint16_t* c) {
  __m512 acc[R][V];
#pragma GCC unroll 14
  for (int i = 0; i < R; ++i)
    for (int v = 0; v < V; ++v) acc[i][v] = _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    __m512bh b[V];
    b[0] = (__m512bh)_mm512_load_si512(bp + p * 2 * kNr);
    if constexpr (V == 2) b[1] = (__m512bh)_mm512_load_si512(bp + p * 2 * kNr + kNr);
#pragma GCC unroll 14
    for (int i = 0; i < R; ++i) {
      int32_t w;
      std::memcpy(&w, a + i * lda + 2 * p, sizeof w);
      const __m512bh av = (__m512bh)_mm512_set1_epi32(w);
      for (int v = 0; v < V; ++v) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], av, b[v]);
    }
  }
#pragma GCC unroll 14
  for (int i = 0; i < R; ++i)
    for (int v = 0; v < V; ++v)
      finish(acc[i][v], v == 0 ? m0 : m1, e, c ? c + i * e.c.rs + v * 16 * e.c.cs : nullptr, y + i * ldy + v * 16);
}

using TileFn = void (*)(int64_t, const uint16_t*, int64_t, const uint16_t*, uint16_t*, int64_t, __mmask16, __mmask16,
                        const Epilogue&, const uint16_t*);
// tile_table<V>()[R - 1] is the tile of R rows: the row count is a template argument so the accumulators stay in
// registers.
template <int V, int... R> constexpr std::array<TileFn, sizeof...(R)> tile_table(std::integer_sequence<int, R...>) {
  return {&tile<R + 1, V>...};
}
constexpr std::array<std::array<TileFn, kMr>, 2> kTiles{tile_table<1>(std::make_integer_sequence<int, kMr>{}),
                                                         tile_table<2>(std::make_integer_sequence<int, kMr>{})};

// ---- AMX: where the CPU has AMX-BF16 (Sapphire Rapids and later), tiles instead of vdpbf16ps ----
// vdpbf16ps does two products per lane, but these cores issue it at half the rate of an FMA, so it is no faster
// than float32 (bench: 70-90 against 100-150 GFLOP/s on one thread). An AMX tile multiply (tdpbf16ps) takes a
// 16 x 32 block of A and 32 x 16 of B per instruction. The B panels above are already in the pair-interleaved
// layout AMX reads (a tile row is one pair of k for 16 columns), so only K's padding changes: to a multiple of 32.
#define ONNXTRAIN_AMX_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,amx-tile,amx-bf16")))

constexpr int64_t kAmxMr = 32;  // rows of a block: two 16-row tiles of A, 2 x 2 tiles of C

// AMX unless a test asked for the vdpbf16ps kernel.
bool amx_ready() { return bf16_amx_supported() && !g_forced_avx512.load(); }

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles 0-3: C (16 x 16 float32), 4-5: A (16 rows x 32 bfloat16), 6-7: B (16 pairs x 16 columns).
ONNXTRAIN_AMX_TARGET void amx_configure() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
}

ONNXTRAIN_AMX_TARGET void amx_release() { _tile_release(); }

// acc[32][32] (or its first 16 rows when !TWO) = A block (rows lda apart, kp k each) x panel (kp / 2 pairs).
template <bool TWO>
ONNXTRAIN_AMX_TARGET void amx_block(int64_t kp, const uint16_t* a, int64_t lda, const uint16_t* bp, float* acc) {
  constexpr int64_t kRow = 2 * kNr * sizeof(uint16_t);  // bytes from one pair of k to the next in a panel
  _tile_zero(0);
  _tile_zero(1);
  if constexpr (TWO) {
    _tile_zero(2);
    _tile_zero(3);
  }
  const int64_t a_stride = lda * static_cast<int64_t>(sizeof(uint16_t));
  for (int64_t k = 0; k < kp; k += 32) {
    const uint16_t* pb = bp + (k / 2) * 2 * kNr;
    _tile_loadd(4, a + k, a_stride);
    _tile_loadd(6, pb, kRow);
    _tile_loadd(7, pb + 32, kRow);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    if constexpr (TWO) {
      _tile_loadd(5, a + 16 * lda + k, a_stride);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  constexpr int64_t kAccRow = kNr * sizeof(float);
  _tile_stored(0, acc, kAccRow);
  _tile_stored(1, acc + 16, kAccRow);
  if constexpr (TWO) {
    _tile_stored(2, acc + 16 * kNr, kAccRow);
    _tile_stored(3, acc + 16 * kNr + 16, kAccRow);
  }
}

ONNXTRAIN_BF16_TARGET void finish_block(const float* acc, int64_t rows, int64_t nr, const Epilogue& e,
                                        const uint16_t* c, uint16_t* y, int64_t ldy) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t v = 0; v * 16 < nr; ++v)
      finish(_mm512_load_ps(acc + i * kNr + v * 16), lanes(nr - 16 * v), e,
             c ? c + i * e.c.rs + v * 16 * e.c.cs : nullptr, y + i * ldy + v * 16);
}

void serial_amx(int64_t M, int64_t N, int64_t K, const Bf16Matrix& a, const Bf16Matrix& b, const Epilogue& e,
                uint16_t* y, int64_t ldy) {
  const int64_t kp = (K + 31) / 32 * 32;
  // B's block stays in L2 (about 256 KiB of it) while every strip of A passes over it.
  const int64_t nc_max = std::clamp<int64_t>(256 * 1024 / (2 * kp) / kNr * kNr, kNr, 1024);
  const int64_t nc_block = std::min(nc_max, (N + kNr - 1) / kNr * kNr);
  uint16_t* bp = b_buffer(static_cast<size_t>(kp * nc_block));
  // A is read in place when each tile row is 32 k of one of A's rows (only a last, partial strip is copied, as the
  // tiles' rows past M must exist); otherwise all of A is copied once, before the blocks of B.
  const bool in_place = a.cs == 1 && K % 32 == 0;
  uint16_t* ap = a_buffer(static_cast<size_t>((in_place ? kAmxMr : (M + 15) / 16 * 16) * kp));
  if (!in_place) pack_a_all(a, M, K, kp, ap);
  alignas(64) float acc[kAmxMr * kNr];
  amx_configure();
  for (int64_t jc = 0; jc < N; jc += nc_block) {
    const int64_t nc = std::min(nc_block, N - jc);
    pack_b(b, K, kp, jc, nc, bp);
    for (int64_t ir = 0; ir < M; ir += kAmxMr) {
      const int64_t rows = std::min(kAmxMr, M - ir);
      const bool two = rows > 16;
      const int64_t padded = two ? 32 : 16;
      const uint16_t* as = ap + ir * kp;
      int64_t lda = kp;
      if (in_place && rows == padded) {
        as = a.p + ir * a.rs;
        lda = a.rs;
      } else if (in_place) {
        if (jc == 0) {
          pack_a(a, K, kp, ir, rows, ap);
          std::memset(ap + rows * kp, 0, static_cast<size_t>((padded - rows) * kp) * sizeof(uint16_t));
        }
        as = ap;
      }
      for (int64_t jr = 0; jr < nc; jr += kNr) {
        const int64_t nr = std::min<int64_t>(kNr, nc - jr);
        const uint16_t* panel = bp + (jr / kNr) * kp * kNr;
        if (two) amx_block<true>(kp, as, lda, panel, acc);
        else amx_block<false>(kp, as, lda, panel, acc);
        const int64_t j = jc + jr;
        finish_block(acc, rows, nr, e, e.c.p ? e.c.p + ir * e.c.rs + j * e.c.cs : nullptr, y + ir * ldy + j, ldy);
      }
    }
  }
  amx_release();
}

// One product on this thread.
void serial_gemm(int64_t M, int64_t N, int64_t K, const Bf16Matrix& a, const Bf16Matrix& b, const Epilogue& e,
                 uint16_t* y, int64_t ldy) {
  if (amx_ready()) return serial_amx(M, N, K, a, b, e, y, ldy);
  const int64_t kp = K + (K % 2);
  // A row whose k are contiguous and even in number is read in place; otherwise each strip is copied first.
  const bool a_in_place = a.cs == 1 && K % 2 == 0 && M > 0;
  uint16_t* bp = b_buffer(static_cast<size_t>(kp * std::min(kNc, (N + kNr - 1) / kNr * kNr)));
  uint16_t* ap = a_in_place ? nullptr : a_buffer(static_cast<size_t>(kMr * kp));
  for (int64_t jc = 0; jc < N; jc += kNc) {
    const int64_t nc = std::min(kNc, N - jc);
    pack_b(b, K, kp, jc, nc, bp);
    for (int64_t ir = 0; ir < M; ir += kMr) {
      const int64_t rows = std::min<int64_t>(kMr, M - ir);
      const uint16_t* as = a.p + ir * a.rs;
      int64_t lda = a.rs;
      if (!a_in_place) {
        pack_a(a, K, kp, ir, rows, ap);
        as = ap;
        lda = kp;
      }
      for (int64_t jr = 0; jr < nc; jr += kNr) {
        const int64_t nr = std::min<int64_t>(kNr, nc - jr);
        const int64_t j = jc + jr;
        const uint16_t* c = e.c.p ? e.c.p + ir * e.c.rs + j * e.c.cs : nullptr;
        kTiles[nr > 16 ? 1 : 0][static_cast<size_t>(rows - 1)](kp / 2, as, lda, bp + (jr / kNr) * kp * kNr,
                                                                y + ir * ldy + j, ldy, lanes(nr), lanes(nr - 16), e, c);
      }
    }
  }
}

// One product on `threads` threads: whole strips of rows each when Y is tall (each packs all of B), else whole
// panels of columns (each packs only its columns of B), as own_sgemm splits.
void parallel_gemm(int64_t M, int64_t N, int64_t K, const Bf16Matrix& a, const Bf16Matrix& b, const Epilogue& e,
                   uint16_t* y, int64_t ldy, int max_threads) {
  const bool by_rows = M >= N;
  const int64_t mr = amx_ready() ? kAmxMr : kMr;
  const int64_t units = by_rows ? (M + mr - 1) / mr : (N + kNr - 1) / kNr;
  const int threads = static_cast<int>(std::min<int64_t>(max_threads, units));
  if (threads < 2) return serial_gemm(M, N, K, a, b, e, y, ldy);
  std::exception_ptr failed;  // an exception must not leave a parallel region (a buffer's first allocation)
#pragma omp parallel num_threads(threads)
  try {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t u0 = units * t / nt, u1 = units * (t + 1) / nt;
    if (by_rows) {
      const int64_t m0 = u0 * mr, m1 = std::min(M, u1 * mr);
      Bf16Matrix as = a;
      as.p += m0 * a.rs;
      Epilogue es = e;
      if (es.c.p) es.c.p += m0 * e.c.rs;
      if (m1 > m0) serial_gemm(m1 - m0, N, K, as, b, es, y + m0 * ldy, ldy);
    } else {
      const int64_t n0 = u0 * kNr, n1 = std::min(N, u1 * kNr);
      Bf16Matrix bs = b;
      bs.p += n0 * b.cs;
      Epilogue es = e;
      if (es.c.p) es.c.p += n0 * e.c.cs;
      if (n1 > n0) serial_gemm(M, n1 - n0, K, a, bs, es, y + n0, ldy);
    }
  } catch (...) {
#pragma omp critical(onnxtrain_bf16_gemm)
    failed = std::current_exception();
  }
  if (failed) std::rethrow_exception(failed);
}

// K = 0: Y = beta * C (or zeros), rounded.
void empty_sum(int64_t M, int64_t N, const Epilogue& e, uint16_t* y, int64_t ldy) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      float v = 0.0f;
      if (e.c.p) {
        const uint32_t bits = static_cast<uint32_t>(at(e.c, i, j)) << 16;
        float cv;
        std::memcpy(&cv, &bits, sizeof cv);
        v = e.beta * cv;
      }
      const uint32_t x = [&] {
        uint32_t u;
        std::memcpy(&u, &v, sizeof u);
        return u;
      }();
      y[i * ldy + j] = (x & 0x7FFFFFFFu) > 0x7F800000u ? static_cast<uint16_t>((x >> 16) | 0x40u)
                                                       : static_cast<uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
    }
}

}  // namespace

void bf16_gemm(int64_t M, int64_t N, int64_t K, Bf16Matrix a, Bf16Matrix b, float alpha, Bf16Matrix c, float beta,
               uint16_t* y, int64_t ldy, std::span<const int64_t> offsets) {
  if (!bf16_native_supported()) throw std::logic_error("bf16_gemm called on a CPU without AVX-512 BF16");
  const int64_t count = static_cast<int64_t>(offsets.size() / 3);
  if (M <= 0 || N <= 0 || count == 0) return;
  const Epilogue e{alpha, beta, c};
  auto one = [&](int64_t t, int threads) {
    Bf16Matrix at = a, bt = b;
    at.p += offsets[static_cast<size_t>(3 * t)];
    bt.p += offsets[static_cast<size_t>(3 * t + 1)];
    uint16_t* yt = y + offsets[static_cast<size_t>(3 * t + 2)];
    if (K <= 0) return empty_sum(M, N, e, yt, ldy);
    if (threads < 2) return serial_gemm(M, N, K, at, bt, e, yt, ldy);
    parallel_gemm(M, N, K, at, bt, e, yt, ldy, threads);
  };
  const int max_threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  // A batch of at least as many products as threads (attention's heads) runs a product per thread; a batch of
  // fewer runs each product on all threads.
  if (max_threads < 2 || count < max_threads) {
    for (int64_t t = 0; t < count; ++t) one(t, max_threads);
    return;
  }
  std::exception_ptr failed;
#pragma omp parallel for schedule(static) num_threads(max_threads)
  for (int64_t t = 0; t < count; ++t) {
    try {
      one(t, 1);
    } catch (...) {
#pragma omp critical(onnxtrain_bf16_gemm)
      failed = std::current_exception();
    }
  }
  if (failed) std::rethrow_exception(failed);
}

#else  // not x86-64: bfloat16 products keep the emulation

void bf16_gemm(int64_t, int64_t, int64_t, Bf16Matrix, Bf16Matrix, float, Bf16Matrix, float, uint16_t*, int64_t,
               std::span<const int64_t>) {
  throw std::logic_error("bf16_gemm called in a build without the AVX-512 BF16 kernel");
}

#endif

}  // namespace onnxtrain::cpu
