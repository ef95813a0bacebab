// The allocation-free float32 convolutions (direct_conv.h).
//
// Layout: an image's input is copied into a zero-padded channels-last buffer xp[p0][p1][p2][channel], padded so
// every window lies inside it. Output pixel o then reads tap t of its window at xp + base(o) + off[t], and output
// pixels along the last spatial dim sit s2 pixels apart, so a strip of 14 of them over one tap and the group's
// input channels is a 14 x Cg matrix with row stride s2 * channels: exactly the A operand of a GEMM tile. The tile
// keeps 14 pixels x 32 output channels of sums in 28 zmm registers across all taps and channels, and writes them
// once into a channels-last result, which is transposed back into the [channel][pixel] tensor.
#include "executor/cpu/direct_conv.h"

// GCC 12 flags the intrinsics' own undefined pass-through operands (avx512fintrin.h) as maybe-uninitialized.
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <omp.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <utility>

#if defined(__AVX512F__)
#include "executor/cpu/avx512.h"
#endif

namespace onnxtrain::cpu {

#if defined(__AVX512F__)
namespace {

bool geometry_ok(const Geo& g) {
  if (g.N <= 0 || g.C <= 0 || g.M <= 0 || g.G <= 0 || g.C % g.G || g.M % g.G) return false;
  for (int i = 0; i < kMaxSpatial; ++i)
    if (g.pb[i] < 0 || g.out[i] <= 0 || g.in[i] <= 0 || g.s[i] <= 0 || g.d[i] <= 0) return false;
  return true;
}

// The extent of input each spatial dim's windows read: the padded buffer's dims for the forward pass.
Dims3 window_extent(const Geo& g) {
  Dims3 p;
  for (int i = 0; i < kMaxSpatial; ++i) p[i] = (g.out[i] - 1) * g.s[i] + (g.k[i] - 1) * g.d[i] + 1;
  return p;
}

// The padded dY of backward data: dX's extent plus the dilated kernel, dY placed (k - 1) * d - pb in.
Dims3 flipped_extent(const Geo& g) {
  Dims3 p;
  for (int i = 0; i < kMaxSpatial; ++i) p[i] = g.in[i] + (g.k[i] - 1) * g.d[i];
  return p;
}

// Each tap's offset in floats within a padded channels-last buffer of dims p with `channels` per pixel.
std::vector<int64_t> tap_offsets(const Geo& g, const Dims3& p, int64_t channels) {
  std::vector<int64_t> off;
  for (int64_t j0 = 0; j0 < g.k[0]; ++j0)
    for (int64_t j1 = 0; j1 < g.k[1]; ++j1)
      for (int64_t j2 = 0; j2 < g.k[2]; ++j2)
        off.push_back(((j0 * g.d[0] * p[1] + j1 * g.d[1]) * p[2] + j2 * g.d[2]) * channels);
  return off;
}

using avx512::lanes;
using avx512::ThreadBuffer;

constexpr int kMr = 14;  // output pixels per tile
constexpr int kNr = 32;  // output channels per tile (one panel of packed weights)

// R pixels (R <= kMr) x V vectors of 16 output channels (V = 1 for a panel of at most 16), channels masked by
// m0/m1. Pixel r's tap t, input channel c is a[r * rs + off[t] + c]; the weights are w[t][c][kNr]. RS > 0 is rs
// known at compile time: the 14 pixels are then one pointer plus constant displacements, where a run-time stride
// needs 14 pointers, more than the free registers (GCC parked them in vector registers and on the stack).
template <int R, int V, int RS>
void conv_tile(const float* __restrict a, int64_t rs, const int64_t* __restrict off, int64_t taps, int64_t gi,
               const float* __restrict w, float* __restrict y, int64_t ldy, __mmask16 m0, __mmask16 m1) {
  const int64_t stride = RS > 0 ? RS : rs;
  __m512 acc[R][V];
#pragma GCC unroll 14
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t t = 0; t < taps; ++t) {
    const float* at = a + off[t];
    const float* wt = w + t * gi * kNr;
    for (int64_t c = 0; c < gi; ++c, ++at, wt += kNr) {
      __m512 b[V];
      b[0] = _mm512_loadu_ps(wt);
      if constexpr (V == 2) b[1] = _mm512_loadu_ps(wt + 16);
#pragma GCC unroll 14
      for (int r = 0; r < R; ++r) {
        const __m512 av = _mm512_set1_ps(at[r * stride]);
        for (int v = 0; v < V; ++v) acc[r][v] = _mm512_fmadd_ps(av, b[v], acc[r][v]);
      }
    }
  }
#pragma GCC unroll 14
  for (int r = 0; r < R; ++r) {
    _mm512_mask_storeu_ps(y + r * ldy, m0, acc[r][0]);
    if constexpr (V == 2) _mm512_mask_storeu_ps(y + r * ldy + 16, m1, acc[r][1]);
  }
}

using TileFn = void (*)(const float*, int64_t, const int64_t*, int64_t, int64_t, const float*, float*, int64_t,
                        __mmask16, __mmask16);
template <int V, int RS, int... R>
constexpr std::array<TileFn, sizeof...(R)> tile_table(std::integer_sequence<int, R...>) {
  return {&conv_tile<R + 1, V, RS>...};
}
using TileSet = std::array<std::array<TileFn, kMr>, 2>;  // [vectors - 1][pixels - 1]
template <int RS>
constexpr TileSet kTileSet{tile_table<1, RS>(std::make_integer_sequence<int, kMr>{}),
                           tile_table<2, RS>(std::make_integer_sequence<int, kMr>{})};

// The tiles for a pixel stride: compiled for the channel counts of common layers (1, 16, 32, 64 at stride 1), else
// with the stride as an argument.
const TileSet& tiles_for(int64_t rs) {
  switch (rs) {
    case 1: return kTileSet<1>;
    case 16: return kTileSet<16>;
    case 32: return kTileSet<32>;
    case 64: return kTileSet<64>;
    default: return kTileSet<0>;
  }
}

// One convolution over a padded channels-last input, as the tiles see it.
struct Core {
  const float* x;               // [p0][p1][p2][ct]
  int64_t p1, p2, ct;           // padded dims 1 and 2, channels per pixel
  int64_t gi, go, ot, groups;   // input and output channels per group, output channels in all
  Dims3 out, s;                 // output dims and strides
  const int64_t* off;           // tap offsets (tap_offsets)
  int64_t taps;
  const float* w;               // packed: [group][panel][tap][gi][kNr]; depthwise: [tap][channel]
  float* y;                     // [out pixels][ot]
  // One channel in and out per group, as many groups as channels (gi = go = 1): the vectors run along the channels.
  bool depthwise = false;
  int64_t rows() const { return out[0] * out[1]; }
};

// Depthwise: R output pixels along the last dim x 16 channels (masked by m), y[r][c] = sum over taps t of
// w[t][c] * a[r * rs + off[t] + c]. One weight vector per tap serves all R pixels.
template <int R>
void depthwise_tile(const float* __restrict a, int64_t rs, const int64_t* __restrict off, int64_t taps,
                    const float* __restrict w, int64_t ldw, float* __restrict y, int64_t ldy, __mmask16 m) {
  __m512 acc[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t t = 0; t < taps; ++t) {
    const __m512 wv = _mm512_maskz_loadu_ps(m, w + t * ldw);
    const float* at = a + off[t];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[r] = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(m, at + r * rs), acc[r]);
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(y + r * ldy, m, acc[r]);
}

constexpr int kDepthwisePixels = 8;
using DepthwiseTileFn = void (*)(const float*, int64_t, const int64_t*, int64_t, const float*, int64_t, float*,
                                 int64_t, __mmask16);
template <int... R>
constexpr std::array<DepthwiseTileFn, sizeof...(R)> depthwise_table(std::integer_sequence<int, R...>) {
  return {&depthwise_tile<R + 1>...};
}
const std::array<DepthwiseTileFn, kDepthwisePixels> kDepthwiseTiles =
    depthwise_table(std::make_integer_sequence<int, kDepthwisePixels>{});

void run_depthwise_rows(const Core& k, int64_t r0, int64_t r1) {
  const int64_t rs = k.s[2] * k.ct;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t o0 = r / k.out[1], o1 = r % k.out[1];
    const float* in = k.x + (o0 * k.s[0] * k.p1 + o1 * k.s[1]) * k.p2 * k.ct;
    float* yrow = k.y + r * k.out[2] * k.ot;
    for (int64_t o2 = 0; o2 < k.out[2]; o2 += kDepthwisePixels) {
      const DepthwiseTileFn tile = kDepthwiseTiles[static_cast<size_t>(
          std::min<int64_t>(kDepthwisePixels, k.out[2] - o2) - 1)];
      for (int64_t c = 0; c < k.ct; c += 16)
        tile(in + o2 * rs + c, rs, k.off, k.taps, k.w + c, k.ct, yrow + o2 * k.ot + c, k.ot, lanes(k.ct - c));
    }
  }
}

// Output rows [r0, r1) (a row: fixed o0, o1, all o2). The panel's weights (taps * gi * 32 floats) stay in cache
// across the row's strips; the strips read a few input rows.
void run_rows(const Core& k, int64_t r0, int64_t r1) {
  if (k.depthwise) return run_depthwise_rows(k, r0, r1);
  const int64_t panels = (k.go + kNr - 1) / kNr;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t o0 = r / k.out[1], o1 = r % k.out[1];
    const float* in = k.x + (o0 * k.s[0] * k.p1 + o1 * k.s[1]) * k.p2 * k.ct;
    float* yrow = k.y + r * k.out[2] * k.ot;
    for (int64_t g = 0; g < k.groups; ++g)
      for (int64_t panel = 0; panel < panels; ++panel) {
        const int64_t nr = std::min<int64_t>(kNr, k.go - panel * kNr);
        const float* wp = k.w + (g * panels + panel) * k.taps * k.gi * kNr;
        const TileFn* tiles = tiles_for(k.s[2] * k.ct)[nr > 16 ? 1 : 0].data();
        for (int64_t o2 = 0; o2 < k.out[2]; o2 += kMr) {
          const int64_t pixels = std::min<int64_t>(kMr, k.out[2] - o2);
          tiles[pixels - 1](in + o2 * k.s[2] * k.ct + g * k.gi, k.s[2] * k.ct, k.off, k.taps, k.gi, wp,
                            yrow + o2 * k.ot + g * k.go + panel * kNr, k.ot, lanes(nr), lanes(nr - 16));
        }
      }
  }
}

// dst[p0][p1][p2][channels] = 0, then x[c][i0][i1][i2] at (i + begin) where that lies inside p (begin >= 0).
void to_padded_channels_last(const float* x, int64_t channels, const Dims3& in, const Dims3& begin, const Dims3& p,
                             float* dst) {
  if (begin != Dims3{0, 0, 0} || p != in)  // otherwise every element is written below
    std::memset(dst, 0, static_cast<size_t>(p[0] * p[1] * p[2] * channels) * sizeof(float));
  const int64_t plane = in[0] * in[1] * in[2];
  const int64_t n2 = std::min(in[2], p[2] - begin[2]);
  if (n2 <= 0) return;
  for (int64_t i0 = 0; i0 < in[0] && i0 + begin[0] < p[0]; ++i0)
    for (int64_t i1 = 0; i1 < in[1] && i1 + begin[1] < p[1]; ++i1) {
      const float* src = x + (i0 * in[1] + i1) * in[2];
      float* out = dst + (((i0 + begin[0]) * p[1] + i1 + begin[1]) * p[2] + begin[2]) * channels;
      if (channels == 1)
        std::memcpy(out, src, static_cast<size_t>(n2) * sizeof(float));
      else
        avx512::transpose(channels, n2, src, plane, out, channels);
    }
}

// y[c][pixel] = yt[pixel][c] (+ b[c]).
void from_channels_last(const float* yt, int64_t pixels, int64_t channels, const float* b, float* y) {
  if (channels == 1)
    std::memcpy(y, yt, static_cast<size_t>(pixels) * sizeof(float));
  else
    avx512::transpose(pixels, channels, yt, channels, y, pixels);
  if (!b) return;
  for (int64_t c = 0; c < channels; ++c) {
    float* row = y + c * pixels;
    const float bc = b[c];
    for (int64_t i = 0; i < pixels; ++i) row[i] += bc;
  }
}

// Repacks weights into the tiles' panels: packed[group][panel][tap][i][kNr] = src(group, o, i, tap) for the
// group's output channel o = panel * kNr + lane, zero past the group's `go`.
template <class Src>
void pack_weights(int64_t groups, int64_t go, int64_t gi, int64_t taps, Src&& src, std::vector<float>& packed) {
  const int64_t panels = (go + kNr - 1) / kNr;
  packed.resize(static_cast<size_t>(groups * panels * taps * gi * kNr));
  float* p = packed.data();
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t panel = 0; panel < panels; ++panel)
      for (int64_t t = 0; t < taps; ++t)
        for (int64_t i = 0; i < gi; ++i, p += kNr)
          for (int64_t lane = 0; lane < kNr; ++lane) {
            const int64_t o = panel * kNr + lane;
            p[lane] = o < go ? src(g, o, i, t) : 0.0f;
          }
}

// Runs f(image, rows_parallel) for every image: in parallel over images when there are at least as many as
// threads (each thread in its own buffers); otherwise image by image, with rows_parallel telling f to split the
// image's rows across the threads.
template <class F> void for_each_image(int64_t images, F&& f) {
  const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  if (threads < 2 || images < threads) {
    for (int64_t n = 0; n < images; ++n) f(n, threads >= 2);
    return;
  }
  std::exception_ptr failed;  // an exception must not leave a parallel region (a buffer's first allocation)
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t n = 0; n < images; ++n) {
    try {
      f(n, false);
    } catch (...) {
#pragma omp critical(onnxtrain_direct_conv)
      failed = std::current_exception();
    }
  }
  if (failed) std::rethrow_exception(failed);
}

// f(begin, end) over [0, n): in one call, or split into a contiguous range per thread when asked.
template <class F> void split(int64_t n, bool parallel, F&& f) {
  if (!parallel || n < 2) return f(int64_t{0}, n);
#pragma omp parallel
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    f(n * t / nt, n * (t + 1) / nt);
  }
}

// A core's rows, split across threads when asked.
void run_core(const Core& k, bool rows_parallel) {
  split(k.rows(), rows_parallel, [&](int64_t r0, int64_t r1) { run_rows(k, r0, r1); });
}

// This thread's buffers: 0 the padded input, 1 the channels-last result (or padded dX), 2 the padded dY, 3 the
// partial dW and dB, 4 the scattered rows of backward data's strided path.
float* thread_buffer(int slot, size_t elems) {
  thread_local std::array<ThreadBuffer, 5> buffers;
  return buffers[static_cast<size_t>(slot)].at_least(elems);
}

// Backward data's scatter path: dxp (the padded channels-last dX, zeroed) += each output pixel's row of dr, which
// holds, group by group and tap by tap, the input channels' gradient under that tap of the pixel's window.
void col2im_add(const Geo& g, const Dims3& p, const float* dr, const int64_t* off, float* dxp) {
  const int64_t cg = g.C / g.G, taps = g.k_size(), row = taps * g.C;
  for (int64_t o0 = 0; o0 < g.out[0]; ++o0)
    for (int64_t o1 = 0; o1 < g.out[1]; ++o1)
      for (int64_t o2 = 0; o2 < g.out[2]; ++o2, dr += row) {
        float* base = dxp + ((o0 * g.s[0] * p[1] + o1 * g.s[1]) * p[2] + o2 * g.s[2]) * g.C;
        for (int64_t grp = 0; grp < g.G; ++grp)
          for (int64_t t = 0; t < taps; ++t) {
            float* dst = base + off[t] + grp * cg;
            const float* src = dr + (grp * taps + t) * cg;
            // Whole vectors, then scalars: neighbouring windows overlap, and a masked store does not forward to
            // the masked load of the next tap that reads it (W2's one-channel layer ran 6x slower that way).
            int64_t c = 0;
            for (; c + 16 <= cg; c += 16)
              _mm512_storeu_ps(dst + c, _mm512_add_ps(_mm512_loadu_ps(dst + c), _mm512_loadu_ps(src + c)));
            for (; c < cg; ++c) dst[c] += src[c];
          }
      }
}

// x[c][i] = src[i + begin][c] (src padded channels-last of dims p); 0 where i + begin lies outside p (input the
// windows never read).
void from_padded_channels_last(const float* src, int64_t channels, const Dims3& in, const Dims3& begin,
                               const Dims3& p, float* x) {
  const int64_t plane = in[0] * in[1] * in[2];
  const int64_t n2 = std::clamp<int64_t>(p[2] - begin[2], 0, in[2]);
  for (int64_t i0 = 0; i0 < in[0]; ++i0)
    for (int64_t i1 = 0; i1 < in[1]; ++i1) {
      float* dst = x + (i0 * in[1] + i1) * in[2];
      const bool inside = i0 + begin[0] < p[0] && i1 + begin[1] < p[1];
      const int64_t n = inside ? n2 : 0;
      if (n > 0) {
        const float* row = src + (((i0 + begin[0]) * p[1] + i1 + begin[1]) * p[2] + begin[2]) * channels;
        if (channels == 1)
          std::memcpy(dst, row, static_cast<size_t>(n) * sizeof(float));
        else
          avx512::transpose(n, channels, row, channels, dst, plane);
      }
      if (n < in[2])
        for (int64_t c = 0; c < channels; ++c) std::fill(dst + c * plane + n, dst + c * plane + in[2], 0.0f);
    }
}

// A tile of dW (rows: taps and input channels; columns: output channels) summed over every output pixel of one
// image: pixel p's row r value is xp[pixel(p) + off[r]] (xp the padded channels-last input), its column values are
// dyt[p][m]. Added into out (row stride ldo). Consecutive rows read xp at base + r, so need no offsets.
struct WeightPass {
  const float* xp;        // [p0][p1][p2][C]
  int64_t p1, p2, C;
  Dims3 out, s;
  const float* dy;        // dY channels-last: output pixel (o0, o1, o2) at dy + o0 * dy_s0 + o1 * dy_s1 + o2 * M
  int64_t dy_s0, dy_s1, M;
};

template <int R, int V, bool CONSECUTIVE>
void weight_tile(const WeightPass& w, const int64_t* __restrict off, int64_t col, float* __restrict out, int64_t ldo,
                 __mmask16 m0, __mmask16 m1) {
  __m512 acc[R][V];
  int64_t o[R];
#pragma GCC unroll 14
  for (int r = 0; r < R; ++r) {
    o[r] = CONSECUTIVE ? off[0] + r : off[r];
    for (int v = 0; v < V; ++v) acc[r][v] = _mm512_setzero_ps();
  }
  const int64_t step = w.s[2] * w.C;
  for (int64_t o0 = 0; o0 < w.out[0]; ++o0)
    for (int64_t o1 = 0; o1 < w.out[1]; ++o1) {
      const float* a = w.xp + (o0 * w.s[0] * w.p1 + o1 * w.s[1]) * w.p2 * w.C;
      const float* b = w.dy + o0 * w.dy_s0 + o1 * w.dy_s1 + col;
      for (int64_t o2 = 0; o2 < w.out[2]; ++o2, a += step, b += w.M) {
        __m512 bv[V];
        bv[0] = _mm512_maskz_loadu_ps(m0, b);
        if constexpr (V == 2) bv[1] = _mm512_maskz_loadu_ps(m1, b + 16);
#pragma GCC unroll 14
        for (int r = 0; r < R; ++r) {
          const __m512 av = _mm512_set1_ps(a[o[r]]);
          for (int v = 0; v < V; ++v) acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
        }
      }
    }
#pragma GCC unroll 14
  for (int r = 0; r < R; ++r) {
    float* row = out + r * ldo;
    _mm512_mask_storeu_ps(row, m0, _mm512_add_ps(_mm512_maskz_loadu_ps(m0, row), acc[r][0]));
    if constexpr (V == 2)
      _mm512_mask_storeu_ps(row + 16, m1, _mm512_add_ps(_mm512_maskz_loadu_ps(m1, row + 16), acc[r][1]));
  }
}

using WeightTileFn = void (*)(const WeightPass&, const int64_t*, int64_t, float*, int64_t, __mmask16, __mmask16);
template <int V, bool CONSECUTIVE, int... R>
constexpr std::array<WeightTileFn, sizeof...(R)> weight_table(std::integer_sequence<int, R...>) {
  return {&weight_tile<R + 1, V, CONSECUTIVE>...};
}
// kWeightTiles[consecutive][vectors - 1][rows - 1]
const std::array<std::array<std::array<WeightTileFn, kMr>, 2>, 2> kWeightTiles{
    {{weight_table<1, false>(std::make_integer_sequence<int, kMr>{}),
      weight_table<2, false>(std::make_integer_sequence<int, kMr>{})},
     {weight_table<1, true>(std::make_integer_sequence<int, kMr>{}),
      weight_table<2, true>(std::make_integer_sequence<int, kMr>{})}}};

// Depthwise backward data's scatter path: dxp (padded channels-last dX, zeroed) += w[t][c] * dY[o][c] under every
// tap t of output pixel o's window. dY is channels-last ([pixel][C], unpadded), w [tap][C].
void depthwise_scatter(const Geo& g, const Dims3& p, const float* dyt, const float* w, const int64_t* off,
                       float* dxp) {
  const int64_t taps = g.k_size(), C = g.C;
  for (int64_t o0 = 0; o0 < g.out[0]; ++o0)
    for (int64_t o1 = 0; o1 < g.out[1]; ++o1)
      for (int64_t o2 = 0; o2 < g.out[2]; ++o2, dyt += C) {
        float* base = dxp + ((o0 * g.s[0] * p[1] + o1 * g.s[1]) * p[2] + o2 * g.s[2]) * C;
        for (int64_t c = 0; c < C; c += 16) {
          const __mmask16 m = lanes(C - c);
          const __m512 dv = _mm512_maskz_loadu_ps(m, dyt + c);
          for (int64_t t = 0; t < taps; ++t) {
            float* dst = base + off[t] + c;
            const __m512 wv = _mm512_maskz_loadu_ps(m, w + t * C + c);
            _mm512_mask_storeu_ps(dst, m, _mm512_fmadd_ps(wv, dv, _mm512_maskz_loadu_ps(m, dst)));
          }
        }
      }
}

// Depthwise dW for T taps (offsets off) and 16 channels from c (masked by m), summed over every output pixel of one
// image: sum over pixels o of dY[o][c] * xp[pixel(o) + off[t] + c]. Written to out[t][16].
template <int T>
void depthwise_weight_tile(const WeightPass& w, const int64_t* __restrict off, int64_t c, __mmask16 m,
                           float* __restrict out) {
  __m512 acc[T];
  int64_t o[T];
#pragma GCC unroll 12
  for (int t = 0; t < T; ++t) {
    acc[t] = _mm512_setzero_ps();
    o[t] = off[t] + c;
  }
  const int64_t step = w.s[2] * w.C;
  for (int64_t o0 = 0; o0 < w.out[0]; ++o0)
    for (int64_t o1 = 0; o1 < w.out[1]; ++o1) {
      const float* a = w.xp + (o0 * w.s[0] * w.p1 + o1 * w.s[1]) * w.p2 * w.C;
      const float* b = w.dy + o0 * w.dy_s0 + o1 * w.dy_s1 + c;
      for (int64_t o2 = 0; o2 < w.out[2]; ++o2, a += step, b += w.M) {
        const __m512 dv = _mm512_maskz_loadu_ps(m, b);
#pragma GCC unroll 12
        for (int t = 0; t < T; ++t) acc[t] = _mm512_fmadd_ps(dv, _mm512_maskz_loadu_ps(m, a + o[t]), acc[t]);
      }
    }
#pragma GCC unroll 12
  for (int t = 0; t < T; ++t) _mm512_storeu_ps(out + t * 16, acc[t]);
}

constexpr int kDepthwiseTaps = 12;  // taps per weight tile: 12 sums, the dY vector and the loads in 32 registers
using DepthwiseWeightFn = void (*)(const WeightPass&, const int64_t*, int64_t, __mmask16, float*);
template <int... T>
constexpr std::array<DepthwiseWeightFn, sizeof...(T)> depthwise_weight_table(std::integer_sequence<int, T...>) {
  return {&depthwise_weight_tile<T + 1>...};
}
const std::array<DepthwiseWeightFn, kDepthwiseTaps> kDepthwiseWeightTiles =
    depthwise_weight_table(std::make_integer_sequence<int, kDepthwiseTaps>{});

// One channel in and out per group, as many groups as channels.
bool depthwise(const Geo& g) { return g.G == g.C && g.M == g.C; }

// Depthwise weights as [tap][channel] (the vectors run along the channels); flipped: tap t takes taps - 1 - t.
void pack_depthwise(const Geo& g, const float* w, bool flipped, std::vector<float>& packed) {
  const int64_t taps = g.k_size();
  packed.resize(static_cast<size_t>(taps * g.C));
  for (int64_t c = 0; c < g.C; ++c)
    for (int64_t t = 0; t < taps; ++t)
      packed[static_cast<size_t>(t * g.C + c)] = w[c * taps + (flipped ? taps - 1 - t : t)];
}

}  // namespace

// The tiles' columns are output channels (for backward data, X's channels; for backward weights, the product's
// columns are dY's): with fewer than half a vector of them per group most lanes would idle, and oneDNN's dedicated
// kernels do better. A depthwise convolution (1 of 16 lanes) has tiles of its own, whose lanes are all channels.
constexpr int64_t kMinChannels = 8;

// The channels along a vector: the output (or, for backward data, input) channels of a group, or every channel of a
// depthwise convolution, whose kernels run along the channels instead.
static bool wide_out(const Geo& g) { return (depthwise(g) ? g.C : g.M / g.G) >= kMinChannels; }
static bool wide_in(const Geo& g) { return (depthwise(g) ? g.C : g.C / g.G) >= kMinChannels; }

bool DirectConv::supports_forward(const Geo& g) { return geometry_ok(g) && wide_out(g); }

// Backward data as the flipped forward convolution: stride 1, begin pads within the dilated kernel, and X's channels
// per group (the tile's columns) at least half a vector.
static bool flips(const Geo& g) {
  if (!wide_in(g)) return false;
  for (int i = 0; i < kMaxSpatial; ++i)
    if (g.s[i] != 1 || g.pb[i] > (g.k[i] - 1) * g.d[i]) return false;
  return true;
}

// Otherwise the scatter path, which adds each tap's X channels into the padded dX as vectors: with fewer than 8
// channels those become scalar adds chained through memory where neighbouring windows overlap (a one-channel layer
// ran at 0.29x oneDNN's gemm:jit in bench_conv), so both paths need 8 X channels per group.
bool DirectConv::supports_backward_data(const Geo& g) { return geometry_ok(g) && wide_in(g); }

bool DirectConv::supports_backward_weights(const Geo& g) { return geometry_ok(g) && wide_out(g); }

bool DirectConv::supports_backward(const Geo& g, bool dx, bool dw) {
  return geometry_ok(g) && (!dx || supports_backward_data(g)) && (!dw || supports_backward_weights(g));
}

DirectConv::DirectConv(const Geo& g)
    : g_(g),
      forward_off_(tap_offsets(g, window_extent(g), g.C)),
      flipped_off_(tap_offsets(g, flipped_extent(g), g.M)),
      depthwise_(depthwise(g)) {
  if (depthwise_) {  // [tap][channel] weights; dW by tiles of taps, not by these rows
    packed_.reserve(static_cast<size_t>(g.k_size() * g.C));
    return;
  }
  // Room for either direction's repacked weights, so that no call allocates them.
  const int64_t cg = g.C / g.G, mg = g.M / g.G;
  const auto size = [&](int64_t go, int64_t gi) { return g.G * ((go + kNr - 1) / kNr) * g.k_size() * gi * kNr; };
  packed_.reserve(static_cast<size_t>(
      std::max({size(mg, cg), size(cg, mg), g.G * ((g.k_size() * cg + kNr - 1) / kNr) * mg * kNr})));
  // Backward weights' rows (tap, channel) of each group, 14 at a time.
  const int64_t rows = g.k_size() * cg;
  for (int64_t grp = 0; grp < g.G; ++grp)
    for (int64_t first = 0; first < rows; first += kMr) {
      RowTile rt;
      rt.group = grp;
      rt.first = first;
      rt.rows = static_cast<int>(std::min<int64_t>(kMr, rows - first));
      rt.consecutive = true;
      for (int r = 0; r < rt.rows; ++r) {
        const int64_t row = first + r;
        rt.off[static_cast<size_t>(r)] = forward_off_[static_cast<size_t>(row / cg)] + grp * cg + row % cg;
        rt.consecutive = rt.consecutive && rt.off[static_cast<size_t>(r)] == rt.off[0] + r;
      }
      row_tiles_.push_back(rt);
    }
}

void DirectConv::forward(const float* x, const float* w, const float* b, float* y) {
  const Geo& g = g_;
  const int64_t cg = g.C / g.G, mg = g.M / g.G, taps = g.k_size();
  if (depthwise_)
    pack_depthwise(g, w, false, packed_);
  else
    pack_weights(g.G, mg, cg, taps, [&](int64_t grp, int64_t o, int64_t i, int64_t t) {
      return w[((grp * mg + o) * cg + i) * taps + t];
    }, packed_);
  const Dims3 p = window_extent(g);
  const int64_t isz = g.in_size(), osz = g.out_size();
  const size_t padded = static_cast<size_t>(p[0] * p[1] * p[2] * g.C), result = static_cast<size_t>(osz * g.M);
  for_each_image(g.N, [&](int64_t n, bool rows_parallel) {
    float* xp = thread_buffer(0, padded);
    float* yt = thread_buffer(1, result);
    to_padded_channels_last(x + n * g.C * isz, g.C, g.in, g.pb, p, xp);
    const Core k{xp, p[1], p[2], g.C, cg, mg, g.M, g.G, g.out, g.s, forward_off_.data(), taps, packed_.data(), yt,
                 depthwise_};
    run_core(k, rows_parallel);
    from_channels_last(yt, osz, g.M, b, y + n * g.M * osz);
  });
}

void DirectConv::backward_data(const float* dy, const float* w, float* dx) {
  backward(dy, nullptr, w, dx, nullptr, nullptr);
}

void DirectConv::backward_weights(const float* dy, const float* x, float* dw, float* db) {
  backward(dy, x, nullptr, nullptr, dw, db);
}

// Image by image, so that each image's dY is made channels-last once for both directions and is still in cache for
// the second. Threads take whole images, summing dW and dB into partial buffers of their own.
void DirectConv::backward(const float* dy, const float* x, const float* w, float* dx, float* dw, float* db) {
  const Geo& g = g_;
  const int64_t cg = g.C / g.G, mg = g.M / g.G, taps = g.k_size();
  const int64_t isz = g.in_size(), osz = g.out_size(), panels = (mg + kNr - 1) / kNr;
  // Backward data by the flipped kernel reads dY padded for it; the scatter path and backward weights alone read it
  // as it is.
  const bool flip = dx && flips(g), scatter = dx && !flip;
  Dims3 q = g.out, begin{0, 0, 0};
  if (flip) {
    q = flipped_extent(g);
    for (int i = 0; i < kMaxSpatial; ++i) begin[i] = (g.k[i] - 1) * g.d[i] - g.pb[i];
  }
  if (dx && depthwise_) {
    pack_depthwise(g, w, flip, packed_);
  } else if (flip) {
    // The flipped kernel with the roles of the channels swapped: dX's channel c is an output, dY's m an input.
    pack_weights(g.G, cg, mg, taps, [&](int64_t grp, int64_t o, int64_t i, int64_t t) {
      return w[((grp * mg + i) * cg + o) * taps + (taps - 1 - t)];
    }, packed_);
  } else if (scatter) {
    // A pointwise product per pixel: dY's channels against every (tap, X channel) column of the group.
    pack_weights(g.G, taps * cg, mg, 1, [&](int64_t grp, int64_t o, int64_t i, int64_t) {
      return w[((grp * mg + i) * cg + o % cg) * taps + o / cg];
    }, packed_);
  }
  const int64_t dy_s1 = q[2] * g.M, dy_s0 = q[1] * dy_s1, dy_at = begin[0] * dy_s0 + begin[1] * dy_s1 + begin[2] * g.M;
  const Dims3 p = window_extent(g);
  const size_t padded_x = static_cast<size_t>(p[0] * p[1] * p[2] * g.C);
  const size_t padded_dy = static_cast<size_t>(q[0] * q[1] * q[2] * g.M);
  const size_t partial = static_cast<size_t>(taps * cg * g.M + g.M);  // dW as [group][tap][c][m of group], dB
  constexpr int kMaxThreads = 64;
  const int available = omp_in_parallel() ? 1 : std::min(omp_get_max_threads(), kMaxThreads);
  const int threads = static_cast<int>(std::min<int64_t>(available, g.N));
  // One image: the threads split its rows (backward data) and its tiles of dW instead. Only outside the images'
  // own parallel region: nested there, a region would run on one thread (and libgomp mallocs its team).
  const bool rows_parallel = threads == 1 && available > 1;
  std::array<float*, kMaxThreads> partials{};
  const auto work = [&](int t, int nt) {
    float* part = nullptr;
    if (dw || db) {
      part = partials[static_cast<size_t>(t)] = thread_buffer(3, partial);
      std::fill(part, part + partial, 0.0f);
    }
    for (int64_t n = g.N * t / nt; n < g.N * (t + 1) / nt; ++n) {
      const float* dyn = dy + n * g.M * osz;
      if (dx || dw) {
        float* dyp = thread_buffer(2, padded_dy);
        to_padded_channels_last(dyn, g.M, g.out, begin, q, dyp);
        if (scatter && depthwise_) {
          float* dxp = thread_buffer(1, padded_x);
          std::memset(dxp, 0, padded_x * sizeof(float));
          depthwise_scatter(g, p, dyp, packed_.data(), forward_off_.data(), dxp);
          from_padded_channels_last(dxp, g.C, g.in, g.pb, p, dx + n * g.C * isz);
        } else if (scatter) {
          float* dr = thread_buffer(4, static_cast<size_t>(osz * taps * g.C));
          const int64_t zero = 0;
          const Core k{dyp, q[1], q[2], g.M, mg, taps * cg, taps * g.C, g.G, g.out, {1, 1, 1}, &zero, 1,
                       packed_.data(), dr};
          run_core(k, rows_parallel);
          float* dxp = thread_buffer(1, padded_x);
          std::memset(dxp, 0, padded_x * sizeof(float));
          col2im_add(g, p, dr, forward_off_.data(), dxp);
          from_padded_channels_last(dxp, g.C, g.in, g.pb, p, dx + n * g.C * isz);
        }
        if (flip) {
          float* dxt = thread_buffer(1, static_cast<size_t>(isz * g.C));
          const Core k{dyp, q[1], q[2], g.M, mg, cg, g.C, g.G, g.in, {1, 1, 1}, flipped_off_.data(), taps,
                       packed_.data(), dxt, depthwise_};
          run_core(k, rows_parallel);
          from_channels_last(dxt, isz, g.C, nullptr, dx + n * g.C * isz);
        }
        if (dw) {
          float* xp = thread_buffer(0, padded_x);
          to_padded_channels_last(x + n * g.C * isz, g.C, g.in, g.pb, p, xp);
          const WeightPass pass{xp, p[1], p[2], g.C, g.out, g.s, dyp + dy_at, dy_s0, dy_s1, g.M};
          if (depthwise_) {
            // Tiles of 16 channels x up to 12 taps; dW's partial is [channel][tap].
            const int64_t tap_tiles = (taps + kDepthwiseTaps - 1) / kDepthwiseTaps;
            split((g.C + 15) / 16 * tap_tiles, rows_parallel, [&](int64_t i0, int64_t i1) {
              for (int64_t i = i0; i < i1; ++i) {
                const int64_t c = i / tap_tiles * 16, t0 = i % tap_tiles * kDepthwiseTaps;
                const int64_t nt = std::min<int64_t>(kDepthwiseTaps, taps - t0), nc = std::min<int64_t>(16, g.C - c);
                alignas(64) float sums[kDepthwiseTaps * 16];
                kDepthwiseWeightTiles[static_cast<size_t>(nt - 1)](pass, forward_off_.data() + t0, c, lanes(nc),
                                                                   sums);
                for (int64_t j = 0; j < nc; ++j)
                  for (int64_t t = 0; t < nt; ++t) part[(c + j) * taps + t0 + t] += sums[t * 16 + j];
              }
            });
          } else {
            // With fewer images than threads, the threads share this image by tiles of dW: each tile sums over
            // every pixel into its own part of dW, so they need no partial sums of their own.
            const int64_t tiles = static_cast<int64_t>(row_tiles_.size()) * panels;
            split(tiles, rows_parallel, [&](int64_t i0, int64_t i1) {
              for (int64_t i = i0; i < i1; ++i) {
                const RowTile& rt = row_tiles_[static_cast<size_t>(i / panels)];
                const int64_t panel = i % panels;
                const int64_t col = rt.group * mg + panel * kNr, nr = std::min<int64_t>(kNr, mg - panel * kNr);
                kWeightTiles[rt.consecutive][nr > 16][rt.rows - 1](
                    pass, rt.off.data(), col, part + rt.group * taps * cg * mg + rt.first * mg + panel * kNr, mg,
                    lanes(nr), lanes(nr - 16));
              }
            });
          }
        }
      }
      if (db) {
        float* dbp = part + taps * cg * g.M;
        for (int64_t m = 0; m < g.M; ++m) {
          const float* row = dyn + m * osz;
          __m512 sum = _mm512_setzero_ps();
          for (int64_t j = 0; j < osz; j += 16)
            sum = _mm512_add_ps(sum, _mm512_maskz_loadu_ps(lanes(osz - j), row + j));
          dbp[m] += _mm512_reduce_add_ps(sum);
        }
      }
    }
  };
  int team = 1;  // the threads that ran (the runtime may give fewer than asked)
  if (threads < 2) {
    work(0, 1);  // not `omp parallel num_threads(1)`: libgomp mallocs a team for every such region
  } else {
    std::exception_ptr failed;
#pragma omp parallel num_threads(threads)
    {
      if (omp_get_thread_num() == 0) team = omp_get_num_threads();
      try {
        work(omp_get_thread_num(), omp_get_num_threads());
      } catch (...) {
#pragma omp critical(onnxtrain_direct_conv)
        failed = std::current_exception();
      }
    }
    if (failed) std::rethrow_exception(failed);
  }
  // Sum the threads' partials into dW's [m][c][tap] order, and dB.
  if (dw)
    for (int64_t grp = 0; grp < g.G; ++grp)
      for (int64_t o = 0; o < mg; ++o)
        for (int64_t c = 0; c < cg; ++c)
          for (int64_t tap = 0; tap < taps; ++tap) {
            const int64_t at = grp * taps * cg * mg + (tap * cg + c) * mg + o;
            float s = partials[0][at];
            for (int th = 1; th < team; ++th) s += partials[static_cast<size_t>(th)][at];
            dw[((grp * mg + o) * cg + c) * taps + tap] = s;
          }
  if (db)
    for (int64_t m = 0; m < g.M; ++m) {
      float s = 0.0f;
      for (int th = 0; th < team; ++th) s += partials[static_cast<size_t>(th)][taps * cg * g.M + m];
      db[m] = s;
    }
}

#else  // no AVX-512: Conv keeps oneDNN

bool DirectConv::supports_forward(const Geo&) { return false; }
bool DirectConv::supports_backward_data(const Geo&) { return false; }
bool DirectConv::supports_backward_weights(const Geo&) { return false; }
bool DirectConv::supports_backward(const Geo&, bool, bool) { return false; }

DirectConv::DirectConv(const Geo& g) : g_(g) {}

void DirectConv::forward(const float*, const float*, const float*, float*) {
  throw std::logic_error("DirectConv used in a build without AVX-512 (check DirectConv::supports_forward)");
}
void DirectConv::backward_data(const float*, const float*, float*) {
  throw std::logic_error("DirectConv used in a build without AVX-512 (check DirectConv::supports_backward_data)");
}
void DirectConv::backward_weights(const float*, const float*, float*, float*) {
  throw std::logic_error("DirectConv used in a build without AVX-512 (check DirectConv::supports_backward_weights)");
}
void DirectConv::backward(const float*, const float*, const float*, float*, float*, float*) {
  throw std::logic_error("DirectConv used in a build without AVX-512 (check DirectConv::supports_backward_*)");
}

#endif

}  // namespace onnxtrain::cpu
