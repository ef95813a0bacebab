#pragma once
// Tensor: a typed, shaped view of device memory, optionally owning it. Plans hand kernels views into their
// arena; user-facing APIs return owning tensors.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "graph/dtype.h"
#include "graph/ir.h"

namespace onnxtrain {

// Guarded is the test device (executor/guarded.h): host memory that only kernels and copies may touch, running
// the CPU kernels, so that CI without a GPU catches host code that would dereference device memory.
enum class Device : uint8_t { CPU = 0, CUDA = 1, Guarded = 2 };
std::string device_name(Device d);  // "cpu", "cuda", "guarded"
// Whether host code may read and write the memory of d directly (only the CPU's).
inline bool host_accessible(Device d) { return d == Device::CPU; }

struct Tensor {
  DType dtype = DType::Undefined;
  Device device = Device::CPU;
  std::vector<int64_t> shape;
  void* data = nullptr;
  std::shared_ptr<void> owner;  // keeps owned memory alive; empty for views

  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  size_t rank() const { return shape.size(); }
  bool defined() const { return dtype != DType::Undefined; }
  template <class T> T* ptr() { return static_cast<T*>(data); }
  template <class T> const T* ptr() const { return static_cast<const T*>(data); }
  template <class T> std::span<T> span() { return {ptr<T>(), static_cast<size_t>(numel())}; }
  template <class T> std::span<const T> span() const { return {ptr<T>(), static_cast<size_t>(numel())}; }

  // Allocates 64-byte aligned, zero-initialised host memory (device memory through the CUDA backend).
  static Tensor empty(DType t, std::vector<int64_t> shape, Device d = Device::CPU);
  static Tensor view(DType t, std::vector<int64_t> shape, void* data, Device d = Device::CPU);
  static Tensor from_data(const TensorData& d);  // owning host copy
  template <class T> static Tensor from_vector(std::vector<int64_t> shape, const std::vector<T>& v) {
    Tensor t = empty(dtype_of<T>(), std::move(shape));  // host memory: written directly
    std::copy(v.begin(), v.end(), t.ptr<T>());
    return t;
  }
  Tensor clone() const;       // owning deep copy on the same device
  Tensor to(Device d) const;  // owning copy on d (host<->device copies happen here, at a session's edges)
  TensorData to_data() const;  // host copy as TensorData
  std::string describe() const;  // "float32[32,64]"
};

// Zeroed host memory, 64-byte aligned. Blocks of 2 MiB and more are 2 MiB aligned and advised as transparent
// huge pages (docs/performance.md, "Huge pages").
std::shared_ptr<void> allocate_host(size_t bytes);

int64_t numel_of(std::span<const int64_t> shape);
std::string shape_string(std::span<const int64_t> shape);

}  // namespace onnxtrain
