// CUDA memory for Tensor. Compiled only when the toolkit is found (cmake/cuda.cmake); GPU kernels arrive
// with the GPU issue. Without a device at run time, allocation fails with a clear error.
#include <cuda_runtime.h>

#include <string>

#include "executor/tensor.h"
#include "graph/error.h"

namespace onnxtrain {

bool cuda_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

void* allocate_device(size_t bytes, Device d) {
  if (!cuda_available()) throw Error("device 'cuda' requested, but no CUDA device is visible to this process");
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess)
    throw Error("cudaMalloc of " + std::to_string(bytes) + " bytes failed: " + cudaGetErrorString(e));
  return p;
}

void free_device(void* p, Device) { cudaFree(p); }

}  // namespace onnxtrain
