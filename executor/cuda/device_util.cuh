#pragma once
// Device-side helpers for the .cu files: grid-stride loops and broadcast offsets.
#include <cstdint>

#include "executor/broadcast.h"
#include "executor/cuda/runtime.h"
#include "graph/error.h"

namespace onnxtrain::cuda {

// A BroadcastPlan in a form a kernel takes by value (kernel parameters live in constant memory).
template <int N> struct Strides {
  int rank = 0;
  int64_t dims[BroadcastPlan::kMaxRank];
  int64_t st[N][BroadcastPlan::kMaxRank];

  __device__ void offsets(int64_t i, int64_t (&off)[N]) const {
    for (int k = 0; k < N; ++k) off[k] = 0;
    for (int d = rank - 1; d >= 0; --d) {
      const int64_t c = i % dims[d];
      i /= dims[d];
      for (int k = 0; k < N; ++k) off[k] += c * st[k][d];
    }
  }
};

template <int N> Strides<N> strides_of(const BroadcastPlan& p) {
  Strides<N> s;
  s.rank = static_cast<int>(p.rank());
  for (size_t d = 0; d < p.rank(); ++d) {
    s.dims[d] = p.dims[d];
    for (int k = 0; k < N; ++k) s.st[k][d] = p.stride(static_cast<size_t>(k), d);
  }
  return s;
}

__device__ inline int64_t global_index() { return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ inline int64_t grid_stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

}  // namespace onnxtrain::cuda
