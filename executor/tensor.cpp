#include "executor/tensor.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <sstream>

#include "executor/device.h"
#include "executor/guarded.h"
#include "graph/error.h"

namespace onnxtrain {

std::string device_name(Device d) {
  switch (d) {
    case Device::CPU: return "cpu";
    case Device::CUDA: return "cuda";
    case Device::Guarded: return "guarded";
  }
  return "unknown";
}

int64_t numel_of(std::span<const int64_t> shape) {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
}

std::string shape_string(std::span<const int64_t> shape) {
  std::ostringstream s;
  s << '[';
  for (size_t i = 0; i < shape.size(); ++i) s << (i ? "," : "") << shape[i];
  s << ']';
  return s.str();
}

int64_t Tensor::numel() const { return numel_of(shape); }

// executor/cuda/runtime.cpp (the caching allocator), or executor/cuda/no_cuda.cpp (a clear error) without CUDA.
void* cuda_allocate(size_t bytes);
void cuda_free(void* p);

std::shared_ptr<void> allocate_host(size_t bytes) {
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t align = bytes >= kHuge ? kHuge : 64;
  const size_t rounded = (std::max<size_t>(bytes, 1) + align - 1) / align * align;
  void* p = std::aligned_alloc(align, rounded);
  if (!p) return nullptr;
#ifdef MADV_HUGEPAGE
  // Where the kernel leaves huge pages to madvise (the common default), large blocks get them only when asked.
  // Advised before the memset, so that the first touch already faults in 2 MiB pages. Failure is harmless.
  if (align == kHuge) madvise(p, rounded, MADV_HUGEPAGE);
#endif
  std::memset(p, 0, rounded);
  return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
}

Tensor Tensor::empty(DType t, std::vector<int64_t> shape, Device d) {
  Tensor r;
  r.dtype = t;
  r.device = d;
  r.shape = std::move(shape);
  size_t bytes = std::max<size_t>(r.nbytes(), 1);
  if (d == Device::CPU) {
    r.owner = allocate_host(bytes);
    if (!r.owner) throw Error("out of memory allocating " + std::to_string(bytes) + " bytes for " + r.describe());
  } else if (d == Device::Guarded) {
    r.owner = std::shared_ptr<void>(guarded_allocate(bytes), [](void* q) { guarded_free(q); });
  } else {
    void* p = cuda_allocate(bytes);
    r.owner = std::shared_ptr<void>(p, [](void* q) { cuda_free(q); });
  }
  r.data = r.owner.get();
  return r;
}

Tensor Tensor::view(DType t, std::vector<int64_t> shape, void* data, Device d) {
  Tensor r;
  r.dtype = t;
  r.device = d;
  r.shape = std::move(shape);
  r.data = data;
  return r;
}

Tensor Tensor::from_data(const TensorData& d) {
  Tensor t = empty(d.dtype, d.dims);
  if (d.bytes.size() != t.nbytes())
    throw Error("tensor data holds " + std::to_string(d.bytes.size()) + " bytes but " + t.describe() + " needs " +
                std::to_string(t.nbytes()));
  if (!d.bytes.empty()) std::memcpy(t.data, d.bytes.data(), d.bytes.size());
  return t;
}

Tensor Tensor::clone() const { return to(device); }

Tensor Tensor::to(Device d) const {
  Tensor t = empty(dtype, shape, d);
  if (device == Device::CPU && d == Device::CPU) {
    if (nbytes()) std::memcpy(t.data, data, nbytes());
  } else {
    copy_bytes(t.data, d, data, device, nbytes());
  }
  return t;
}

TensorData Tensor::to_data() const {
  TensorData d;
  d.dtype = dtype;
  d.dims = shape;
  d.bytes.resize(nbytes());
  copy_bytes(d.bytes.data(), Device::CPU, data, device, nbytes());
  return d;
}

std::string Tensor::describe() const { return dtype_name(dtype) + shape_string(shape); }

}  // namespace onnxtrain
