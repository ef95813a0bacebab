// CUDA memory for Tensor. Compiled only when the toolkit is found (cmake/cuda.cmake); GPU kernels arrive
// with the GPU issue. Without a device at run time, allocation fails with a clear error.
#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "graph/error.h"

namespace onnxtrain {

bool cuda_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

void* cuda_allocate(size_t bytes) {
  if (!cuda_available()) throw Error("device 'cuda' requested, but no CUDA device is visible to this process");
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess)
    throw Error("cudaMalloc of " + std::to_string(bytes) + " bytes failed: " + cudaGetErrorString(e));
  return p;
}

void cuda_free(void* p) { cudaFree(p); }

}  // namespace onnxtrain
