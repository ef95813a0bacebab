// The CUDA runtime layer: device selection, a caching allocator, streams, library handles. Host code only
// (compiled by the C++ compiler against the CUDA runtime); kernels live in the .cu files next to it.
#include "executor/cuda/runtime.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>

#include "graph/error.h"

namespace onnxtrain {

namespace {

std::string cuda_message(cudaError_t e) { return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e); }

// Caching allocator: cudaMalloc and cudaFree synchronise the device and cost tens of microseconds, so freed
// blocks are kept by size and handed out again. Sizes round up to 512 bytes; a request takes the smallest
// cached block that is large enough but not more than twice the size. When cudaMalloc fails, the cache is
// returned to the driver and the allocation retried once. Reuse is safe with respect to streams because every
// executor run ends by synchronising its stream, so a block is idle by the time a later run can free it.
class CachingAllocator {
 public:
  void* allocate(size_t bytes) {
    const size_t size = (std::max<size_t>(bytes, 1) + 511) / 512 * 512;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.lower_bound(size);
    if (it != free_.end() && it->first <= 2 * size) {
      void* p = it->second;
      stats_.cached -= it->first;
      stats_.in_use += it->first;
      live_[p] = it->first;
      free_.erase(it);
      return p;
    }
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, size);
    if (e != cudaSuccess) {
      cudaGetLastError();  // clear the sticky-free error state of a failed malloc
      release_cache();
      e = cudaMalloc(&p, size);
    }
    if (e != cudaSuccess)
      throw Error("CUDA: cannot allocate " + std::to_string(size) + " bytes of device memory (" +
                  std::to_string(stats_.in_use) + " bytes in use by onnxtrain): " + cuda_message(e));
    ++stats_.device_mallocs;
    stats_.in_use += size;
    live_[p] = size;
    return p;
  }
  void release(void* p) {
    if (!p) return;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(p);
    if (it == live_.end()) return;
    stats_.in_use -= it->second;
    stats_.cached += it->second;
    free_.emplace(it->second, p);
    live_.erase(it);
  }
  DeviceMemoryStats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

 private:
  void release_cache() {
    for (auto& [size, p] : free_) cudaFree(p);
    stats_.cached = 0;
    free_.clear();
  }
  std::mutex mu_;
  std::multimap<size_t, void*> free_;
  std::unordered_map<void*, size_t> live_;
  DeviceMemoryStats stats_;
};

CachingAllocator& allocator() {
  static auto* a = new CachingAllocator();  // never destroyed: tensors may outlive static destruction order
  return *a;
}

thread_local cudaStream_t t_stream = nullptr;

struct Handles {
  cublasHandle_t blas = nullptr;
  cublasLtHandle_t lt = nullptr;
  cudnnHandle_t dnn = nullptr;
  void* ws = nullptr;
  size_t ws_bytes = 0;
};
thread_local Handles t_handles;

}  // namespace

bool built_with_cuda() { return true; }

std::string cuda_unavailable_reason() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return "no CUDA device is visible to this process (" + cuda_message(e) + ")";
  if (n == 0) return "no CUDA device is visible to this process";
  return "";
}

bool cuda_available() { return cuda_unavailable_reason().empty(); }

void select_cuda_device(int index) {
  const std::string why = cuda_unavailable_reason();
  if (!why.empty()) throw Error("device 'cuda:" + std::to_string(index) + "' requested, but " + why);
  int n = 0;
  cudaGetDeviceCount(&n);
  if (index >= n)
    throw Error("device 'cuda:" + std::to_string(index) + "' requested, but this process sees " + std::to_string(n) +
                " CUDA device(s) (cuda:0.." + "cuda:" + std::to_string(n - 1) + ")");
  cuda::check(cudaSetDevice(index), "cudaSetDevice");
}

// Tensor::empty's hooks (executor/tensor.cpp).
void* cuda_allocate(size_t bytes) {
  const std::string why = cuda_unavailable_reason();
  if (!why.empty()) throw Error("device 'cuda' requested, but " + why);
  void* p = allocator().allocate(bytes);
  // Tensor::empty promises zeroed memory, on the device as on the host.
  cuda::check(cudaMemsetAsync(p, 0, bytes, t_stream), "cudaMemsetAsync");
  return p;
}
void cuda_free(void* p) { allocator().release(p); }

// copy_bytes (executor/device.cpp) for every pair that involves CUDA memory.
void cuda_copy_bytes(void* dst, Device dd, const void* src, Device sd, size_t n) {
  const cudaMemcpyKind kind = dd == Device::CPU ? cudaMemcpyDeviceToHost
                              : sd == Device::CPU ? cudaMemcpyHostToDevice
                                                  : cudaMemcpyDeviceToDevice;
  cuda::check(cudaMemcpyAsync(dst, src, n, kind, t_stream), "cudaMemcpyAsync");
  // Device-to-device copies stay ordered on the stream; a copy that touches host memory must be finished
  // before the caller reads (or frees) that memory.
  if (kind != cudaMemcpyDeviceToDevice) cuda::check(cudaStreamSynchronize(t_stream), "cudaStreamSynchronize after a copy");
}

std::shared_ptr<void> cuda_make_stream() {
  const std::string why = cuda_unavailable_reason();
  if (!why.empty()) throw Error("a CUDA stream was requested, but " + why);
  cudaStream_t s = nullptr;
  cuda::check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  return std::shared_ptr<void>(s, [](void* q) { cudaStreamDestroy(static_cast<cudaStream_t>(q)); });
}

StreamScope::StreamScope(void* stream) : previous_(t_stream) { t_stream = static_cast<cudaStream_t>(stream); }
StreamScope::~StreamScope() { t_stream = static_cast<cudaStream_t>(previous_); }

void synchronize(void* stream) {
  if (stream) cuda::check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "cudaStreamSynchronize");
}

DeviceMemoryStats device_memory_stats() { return allocator().stats(); }

namespace cuda {

cudaStream_t stream() { return t_stream; }

cublasHandle_t cublas() {
  if (!t_handles.blas) check(cublasCreate(&t_handles.blas), "cublasCreate");
  check(cublasSetStream(t_handles.blas, t_stream), "cublasSetStream");
  return t_handles.blas;
}

cublasLtHandle_t cublas_lt() {
  if (!t_handles.lt) check(cublasLtCreate(&t_handles.lt), "cublasLtCreate");
  return t_handles.lt;
}

cudnnHandle_t cudnn() {
  if (!t_handles.dnn) check(cudnnCreate(&t_handles.dnn), "cudnnCreate");
  check(cudnnSetStream(t_handles.dnn, t_stream), "cudnnSetStream");
  return t_handles.dnn;
}

void* workspace(size_t bytes) {
  if (bytes > t_handles.ws_bytes) {
    // The old buffer may still be read by queued work; wait before handing it back.
    if (t_handles.ws) {
      check(cudaStreamSynchronize(t_stream), "cudaStreamSynchronize");
      release(t_handles.ws);
    }
    t_handles.ws = allocate(bytes);
    t_handles.ws_bytes = bytes;
  }
  return t_handles.ws;
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("CUDA: ") + what + ": " + cuda_message(e));
}
void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw Error(std::string("cuBLAS: ") + what + ": " + cublasGetStatusName(s) + " (" + cublasGetStatusString(s) + ")");
}
void check(cudnnStatus_t s, const char* what) {
  if (s != CUDNN_STATUS_SUCCESS) throw Error(std::string("cuDNN: ") + what + ": " + cudnnGetErrorString(s));
}

void* allocate(size_t bytes) { return allocator().allocate(bytes); }
void release(void* p) { allocator().release(p); }

}  // namespace cuda
}  // namespace onnxtrain
