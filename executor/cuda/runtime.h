#pragma once
// CUDA-side services for the kernels in executor/cuda/: the current stream (the session's, set by
// StreamScope), per-thread cuBLAS/cuDNN handles bound to it, error checks that throw with context, and launch
// geometry. Only files of the CUDA build include this.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstdint>
#include <string>

#include "executor/device.h"

namespace onnxtrain::cuda {

cudaStream_t stream();           // the current stream of this thread (the default stream when none is set)
cublasHandle_t cublas();         // bound to stream()
cublasLtHandle_t cublas_lt();
cudnnHandle_t cudnn();           // bound to stream()
// A scratch buffer of at least `bytes` on the device (cuBLASLt/cuDNN workspaces); valid until the next call
// on this thread, which is enough because kernels of one thread run one after another on one stream.
void* workspace(size_t bytes);

// Throw Error("<what>: <CUDA's message>") on failure.
void check(cudaError_t e, const char* what);
void check(cublasStatus_t s, const char* what);
void check(cudnnStatus_t s, const char* what);
// After a kernel launch: reports launch errors (bad geometry, missing sm image) with the kernel's name.
inline void check_launch(const char* kernel) { check(cudaGetLastError(), kernel); }

// Device memory from the caching allocator.
void* allocate(size_t bytes);
void release(void* p);

constexpr int kBlock = 256;
// Blocks for n elements with a grid-stride loop: enough to fill the device, never more than needed.
inline unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kBlock - 1) / kBlock;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 65535 * 8 ? 65535 * 8 : b));
}

}  // namespace onnxtrain::cuda
