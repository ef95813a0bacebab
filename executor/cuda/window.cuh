#pragma once
// The window geometry on the device, shared by the convolution (conv.cu) and pooling (pool.cu) kernels: the CPU's
// ops::Geo (executor/ops/conv_geometry.h, parsed once at plan time) in a form a kernel takes by value, and the
// tap arithmetic in both directions.
#include <cstdint>
#include <memory>
#include <utility>

#include "executor/ops/conv_geometry.h"
#include "executor/kernel.h"

namespace onnxtrain::cuda {

// ops::Geo in a form a kernel takes by value.
struct DGeo {
  int64_t N, C, M, G;
  int64_t in[3], out[3], k[3], s[3], d[3], pb[3];
  __host__ __device__ int64_t isz() const { return in[0] * in[1] * in[2]; }
  __host__ __device__ int64_t osz() const { return out[0] * out[1] * out[2]; }
  __host__ __device__ int64_t ksz() const { return k[0] * k[1] * k[2]; }
};

inline DGeo device_geo(const ops::Geo& g) {
  DGeo d{g.N, g.C, g.M, g.G, {}, {}, {}, {}, {}, {}};
  for (int i = 0; i < 3; ++i) {
    d.in[i] = g.in[i];
    d.out[i] = g.out[i];
    d.k[i] = g.k[i];
    d.s[i] = g.s[i];
    d.d[i] = g.d[i];
    d.pb[i] = g.pb[i];
  }
  return d;
}

// The same geometry seen from the other side: the adjoint's input is the forward's output. Used for
// ConvGrad's dX, which is the ConvTranspose of dY by W.
inline DGeo transposed(DGeo g) {
  DGeo t = g;
  t.C = g.M;
  t.M = g.C;
  for (int i = 0; i < 3; ++i) {
    t.in[i] = g.out[i];
    t.out[i] = g.in[i];
  }
  return t;
}

__device__ inline void split3(int64_t at, const int64_t (&dims)[3], int64_t (&pos)[3]) {
  pos[2] = at % dims[2];
  at /= dims[2];
  pos[1] = at % dims[1];
  pos[0] = at / dims[1];
}

// Input position of output o's tap j along axis a, or -1 when it falls in the padding.
__device__ inline int64_t tap(const DGeo& g, int a, int64_t o, int64_t j) {
  const int64_t i = o * g.s[a] - g.pb[a] + j * g.d[a];
  return i >= 0 && i < g.in[a] ? i : -1;
}

// Output position whose tap j reads input position i along axis a (the inverse of tap), or -1.
__device__ inline int64_t tap_source(const DGeo& g, int a, int64_t i, int64_t j) {
  const int64_t t = i + g.pb[a] - j * g.d[a];
  if (t < 0 || t % g.s[a]) return -1;
  const int64_t o = t / g.s[a];
  return o < g.out[a] ? o : -1;
}

// Calls f(input offset, kernel offset) for each tap of output o's window that lies inside the input.
template <class F> __device__ inline void for_each_tap(const DGeo& g, const int64_t (&o)[3], F&& f) {
  for (int64_t j0 = 0; j0 < g.k[0]; ++j0) {
    const int64_t i0 = tap(g, 0, o[0], j0);
    if (i0 < 0) continue;
    for (int64_t j1 = 0; j1 < g.k[1]; ++j1) {
      const int64_t i1 = tap(g, 1, o[1], j1);
      if (i1 < 0) continue;
      for (int64_t j2 = 0; j2 < g.k[2]; ++j2) {
        const int64_t i2 = tap(g, 2, o[2], j2);
        if (i2 >= 0) f((i0 * g.in[1] + i1) * g.in[2] + i2, (j0 * g.k[1] + j1) * g.k[2] + j2);
      }
    }
  }
}

// The other way round: calls f(output offset, output position, kernel offset) for each output whose window
// reads input position i, and the tap it reads i with.
template <class F> __device__ inline void for_each_reader(const DGeo& g, const int64_t (&i)[3], F&& f) {
  for (int64_t j0 = 0; j0 < g.k[0]; ++j0) {
    const int64_t o0 = tap_source(g, 0, i[0], j0);
    if (o0 < 0) continue;
    for (int64_t j1 = 0; j1 < g.k[1]; ++j1) {
      const int64_t o1 = tap_source(g, 1, i[1], j1);
      if (o1 < 0) continue;
      for (int64_t j2 = 0; j2 < g.k[2]; ++j2) {
        const int64_t o2 = tap_source(g, 2, i[2], j2);
        if (o2 < 0) continue;
        const int64_t o[3] = {o0, o1, o2};
        f((o0 * g.out[1] + o1) * g.out[2] + o2, o, (j0 * g.k[1] + j1) * g.k[2] + j2);
      }
    }
  }
}

// A kernel of K<double> for double data, K<float> otherwise.
template <template <class> class K, class... A> std::unique_ptr<Kernel> by_dtype(DType t, A&&... a) {
  if (t == DType::Float64) return std::make_unique<K<double>>(std::forward<A>(a)...);
  return std::make_unique<K<float>>(std::forward<A>(a)...);
}

}  // namespace onnxtrain::cuda
