// The allocation-free float32 GEMM (gemm.h). The Goto/BLIS loop nest, cut down to what training products need:
//   for each block of kNc columns of C, for each block of kKc steps of k:
//     for each strip of kMr rows: for each panel of kNr columns: a kMr x kNr tile of C += A strip · B panel.
// The tile broadcasts A's values straight from A, and loads the panel's rows of op(B) as vectors: from a copy packed
// into panels (one buffer per thread, made once), or straight from an untransposed B when few strips of rows would
// reuse the copy. Packing A cost more than it saved at W1's and W3's shapes (bench_gemm, docs/performance.md).
#include "executor/cpu/gemm.h"

// GCC 12 flags the intrinsics' own undefined pass-through operands (avx512fintrin.h) as maybe-uninitialized.
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <omp.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <exception>
#include <memory>
#include <new>
#include <stdexcept>
#include <utility>

#if defined(__AVX512F__)
#include "executor/cpu/avx512.h"
#endif

namespace onnxtrain::cpu {

#if defined(__AVX512F__)
namespace {

using avx512::lanes;
using avx512::ThreadBuffer;
using avx512::transpose16;

// A 14 x 32 tile of C lives in 28 zmm accumulators; each step of k loads two vectors of packed B and broadcasts 14
// values of A onto them: 28 FMAs per 16 loads, which keeps both FMA pipes busy. kKc x kNr of B (32 KiB) and
// kMr x kKc of A (14 KiB) are what each tile streams through.
constexpr int kMr = 14;
constexpr int kNr = 32;
constexpr int64_t kKc = 256;
constexpr int64_t kNc = 512;
constexpr int64_t kPackRows = 512;  // see serial_sgemm

// How a tile's sums meet C: the first block of k applies beta (0: C is not read), later ones add to it.
struct Update {
  float alpha, beta;
  bool first;
};

__m512 combine(__m512 sum, const float* c, __mmask16 m, const Update& u) {
  if (u.alpha != 1.0f) sum = _mm512_mul_ps(sum, _mm512_set1_ps(u.alpha));
  if (!u.first) return _mm512_add_ps(sum, _mm512_maskz_loadu_ps(m, c));
  if (u.beta == 0.0f) return sum;
  return _mm512_fmadd_ps(_mm512_set1_ps(u.beta), _mm512_maskz_loadu_ps(m, c), sum);
}

// R rows (R <= kMr) and V vectors of 16 columns (V = 1 for a last panel of at most 16) of C, columns masked by
// m0/m1, over kc steps of k. A(i, k) is a[i * lda + k], or with AT a[k * lda + i]: both are read in place.
template <int R, int V, bool AT, bool PACKED>
void tile(int64_t kc, const float* __restrict a, int64_t lda, const float* __restrict bp, int64_t bs,
          float* __restrict c, int64_t ldc, __mmask16 m0, __mmask16 m1, const Update& u) {
  __m512 acc[R][V];
#pragma GCC unroll 14
  for (int i = 0; i < R; ++i)
    for (int v = 0; v < V; ++v) acc[i][v] = _mm512_setzero_ps();
  for (int64_t k = 0; k < kc; ++k) {
    __m512 b[V];
    if constexpr (PACKED) {
      b[0] = _mm512_load_ps(bp + k * kNr);
      if constexpr (V == 2) b[1] = _mm512_load_ps(bp + k * kNr + 16);
    } else {
      b[0] = _mm512_maskz_loadu_ps(m0, bp + k * bs);
      if constexpr (V == 2) b[1] = _mm512_maskz_loadu_ps(m1, bp + k * bs + 16);
    }
#pragma GCC unroll 14
    for (int i = 0; i < R; ++i) {
      const __m512 av = _mm512_set1_ps(AT ? a[k * lda + i] : a[i * lda + k]);
      for (int v = 0; v < V; ++v) acc[i][v] = _mm512_fmadd_ps(av, b[v], acc[i][v]);
    }
  }
#pragma GCC unroll 14
  for (int i = 0; i < R; ++i) {
    float* row = c + i * ldc;
    _mm512_mask_storeu_ps(row, m0, combine(acc[i][0], row, m0, u));
    if constexpr (V == 2) _mm512_mask_storeu_ps(row + 16, m1, combine(acc[i][1], row + 16, m1, u));
  }
}

using TileFn = void (*)(int64_t, const float*, int64_t, const float*, int64_t, float*, int64_t, __mmask16, __mmask16,
                        const Update&);
// tile_table<V, AT, PACKED>()[R - 1] is the tile of R rows: the row count is a template argument so the
// accumulators stay in registers. PACKED tiles read B's panel with aligned, unmasked loads (2-3% faster at W3's
// shapes than the masked loads an in-place B needs for its last panel).
template <int V, bool AT, bool PACKED, int... R>
constexpr std::array<TileFn, sizeof...(R)> tile_table(std::integer_sequence<int, R...>) {
  return {&tile<R + 1, V, AT, PACKED>...};
}
template <int V, bool AT, bool PACKED>
constexpr auto kTiles = tile_table<V, AT, PACKED>(std::make_integer_sequence<int, kMr>{});
// The tiles for one product: [vectors - 1][rows - 1].
using TileSet = std::array<std::array<TileFn, kMr>, 2>;
template <bool AT, bool PACKED> constexpr TileSet kTileSet{kTiles<1, AT, PACKED>, kTiles<2, AT, PACKED>};

// Packs op(B)[pc : pc + kc, jc : jc + nc] into panels of kNr columns, bp[panel][k][kNr], zero-padding the last.
// A B stored [N, K] is transposed on the way, 16 x 16 blocks at a time in registers.
void pack_b(bool trans_b, const float* b, int64_t ldb, int64_t pc, int64_t kc, int64_t jc, int64_t nc, float* bp) {
  for (int64_t jr = 0; jr < nc; jr += kNr) {
    const int64_t nr = std::min<int64_t>(kNr, nc - jr);
    float* dst = bp + (jr / kNr) * kc * kNr;
    if (!trans_b) {
      const __mmask16 m0 = lanes(nr), m1 = lanes(nr - 16);
      for (int64_t k = 0; k < kc; ++k) {
        const float* src = b + (pc + k) * ldb + jc + jr;
        _mm512_store_ps(dst + k * kNr, _mm512_maskz_loadu_ps(m0, src));
        _mm512_store_ps(dst + k * kNr + 16, _mm512_maskz_loadu_ps(m1, src + 16));
      }
      continue;
    }
    for (int64_t k0 = 0; k0 < kc; k0 += 16) {
      const __mmask16 mk = lanes(kc - k0);
      for (int half = 0; half < 2; ++half) {
        __m512 r[16];
        for (int j = 0; j < 16; ++j) {
          const int64_t col = 16 * half + j;
          r[j] = col < nr ? _mm512_maskz_loadu_ps(mk, b + (jc + jr + col) * ldb + pc + k0) : _mm512_setzero_ps();
        }
        transpose16(r);
        for (int64_t k = 0; k < std::min<int64_t>(16, kc - k0); ++k)
          _mm512_store_ps(dst + (k0 + k) * kNr + 16 * half, r[k]);
      }
    }
  }
}

// This thread's packing buffer for one kKc x kNc block of B, allocated by the first product on the thread.
float* pack_buffer() {
  thread_local ThreadBuffer buffer;
  return buffer.at_least(kKc * kNc);
}

// This thread's buffer for a partial product (split-K products below).
float* partial_buffer(size_t elems) {
  thread_local ThreadBuffer buffer;
  return buffer.at_least(elems);
}

void serial_sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* a,
                  int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  // An untransposed B's rows are already the tile's vectors. Copying them into panels pays off when many strips
  // of rows reuse each panel (bench_gemm: W3's 1024-row products gain 2-4%, W1's 128-row ones lose 3-4%), and
  // when a panel's rows are many and far apart (W3's weight gradients, K = 1024 rows of 2 KiB: 1750 -> 1550 µs
  // in a training step, where B comes from L3 and its power-of-two stride maps the rows onto few L1 sets).
  const bool pack = trans_b || M >= kPackRows || K >= kPackRows;
  float* packed = pack ? pack_buffer() : nullptr;
  const TileSet& tiles = trans_a ? (pack ? kTileSet<true, true> : kTileSet<true, false>)
                                 : (pack ? kTileSet<false, true> : kTileSet<false, false>);
  for (int64_t jc = 0; jc < N; jc += kNc) {
    const int64_t nc = std::min(kNc, N - jc);
    for (int64_t pc = 0; pc < K; pc += kKc) {
      const int64_t kc = std::min(kKc, K - pc);
      const Update u{alpha, beta, pc == 0};
      if (pack) pack_b(trans_b, b, ldb, pc, kc, jc, nc, packed);
      for (int64_t ir = 0; ir < M; ir += kMr) {
        const size_t rows = static_cast<size_t>(std::min<int64_t>(kMr, M - ir) - 1);
        const float* ap = trans_a ? a + pc * lda + ir : a + ir * lda + pc;
        for (int64_t jr = 0; jr < nc; jr += kNr) {
          const int64_t nr = std::min<int64_t>(kNr, nc - jr);
          // The panel's rows of op(B): packed, or B's own rows.
          const float* bp = pack ? packed + (jr / kNr) * kc * kNr : b + pc * ldb + jc + jr;
          const TileFn tile_fn = tiles[nr > 16 ? 1 : 0][rows];
          tile_fn(kc, ap, lda, bp, pack ? kNr : ldb, c + ir * ldc + jc + jr, ldc, lanes(nr), lanes(nr - 16), u);
        }
      }
    }
  }
}

// Thread t multiplies steps [k0, k1) of the sum: thread 0 into C itself (with beta), the others into their
// partial buffers; after a barrier each thread adds the partials into its share of C's rows.
void split_k_sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* a,
                   int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc, int max_threads) {
  constexpr int kMaxThreads = 64;
  const int threads = std::min({max_threads, kMaxThreads, static_cast<int>(K / kKc)});
  std::array<float*, kMaxThreads> partial{};
  std::exception_ptr failed;
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    try {
      // Whole blocks of 16 steps per thread, every thread at least one (K >= 256 * threads).
      const int64_t units = K / 16;
      const int64_t k0 = units * t / nt * 16, k1 = t + 1 == nt ? K : units * (t + 1) / nt * 16;
      float* dst = t == 0 ? c : (partial[static_cast<size_t>(t)] = partial_buffer(static_cast<size_t>(M * N)));
      serial_sgemm(trans_a, trans_b, M, N, k1 - k0, alpha, trans_a ? a + k0 * lda : a + k0, lda,
                   trans_b ? b + k0 : b + k0 * ldb, ldb, t == 0 ? beta : 0.0f, dst, t == 0 ? ldc : N);
    } catch (...) {
#pragma omp critical(onnxtrain_own_sgemm)
      failed = std::current_exception();
    }
#pragma omp barrier
    if (!failed) {
      const int64_t r0 = M * t / nt, r1 = M * (t + 1) / nt;
      for (int s = 1; s < nt; ++s)
        for (int64_t i = r0; i < r1; ++i) {
          const float* p = partial[static_cast<size_t>(s)] + i * N;
          float* row = c + i * ldc;
          for (int64_t j = 0; j < N; ++j) row[j] += p[j];
        }
    }
  }
  if (failed) std::rethrow_exception(failed);
}

}  // namespace

bool own_sgemm_available() { return true; }

void own_sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* a, int64_t lda,
               const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    // An empty sum: C = beta * C (beta 0 writes zeros without reading C).
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return;
  }
  const int max_threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  if (max_threads < 2) return serial_sgemm(trans_a, trans_b, M, N, K, alpha, a, lda, b, ldb, beta, c, ldc);
  // Long sums into a small C (weight gradients: K = the tokens of the batch) split K: each thread multiplies its
  // own rows of the activations and gradients, which it produced and has in cache, into a private partial C, and
  // the partials are added at the end. Reading half of both operands from the other core costs more than that
  // sum as soon as K (M + N) > 2 M N.
  if (K * (M + N) > 2 * M * N && K >= 2 * kKc) return split_k_sgemm(trans_a, trans_b, M, N, K, alpha, a, lda, b, ldb,
                                                                      beta, c, ldc, max_threads);
  // Otherwise threads take whole strips of rows when C is tall (each packs all of B, and reads only its rows of
  // A), else whole panels of columns (each packs only its columns of B): no thread waits on another.
  const bool by_rows = M >= N;
  const int64_t units = by_rows ? (M + kMr - 1) / kMr : (N + kNr - 1) / kNr;
  const int threads = static_cast<int>(std::min<int64_t>(max_threads, units));
  if (threads < 2) return serial_sgemm(trans_a, trans_b, M, N, K, alpha, a, lda, b, ldb, beta, c, ldc);
  std::exception_ptr failed;  // an exception must not leave a parallel region (pack_buffer's first allocation)
#pragma omp parallel num_threads(threads)
  try {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t u0 = units * t / nt, u1 = units * (t + 1) / nt;
    if (by_rows) {
      const int64_t m0 = u0 * kMr, m1 = std::min(M, u1 * kMr);
      if (m1 > m0)
        serial_sgemm(trans_a, trans_b, m1 - m0, N, K, alpha, trans_a ? a + m0 : a + m0 * lda, lda, b, ldb, beta,
                     c + m0 * ldc, ldc);
    } else {
      const int64_t n0 = u0 * kNr, n1 = std::min(N, u1 * kNr);
      if (n1 > n0)
        serial_sgemm(trans_a, trans_b, M, n1 - n0, K, alpha, a, lda, trans_b ? b + n0 * ldb : b + n0, ldb, beta,
                     c + n0, ldc);
    }
  } catch (...) {
#pragma omp critical(onnxtrain_own_sgemm)
    failed = std::current_exception();
  }
  if (failed) std::rethrow_exception(failed);
}

#else  // no AVX-512: MatMul keeps dnnl_sgemm

bool own_sgemm_available() { return false; }

void own_sgemm(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*, int64_t, float,
               float*, int64_t) {
  throw std::logic_error("own_sgemm called in a build without AVX-512 (check own_sgemm_available())");
}

#endif

}  // namespace onnxtrain::cpu
