#pragma once
// The session edge (docs/gpu.md, "Host and device memory"): the only ways host code reads or writes a tensor
// that may live on a device (a session's weights, optimizer state, learning rate, step counter, loss scale, the
// loss it returns). Each goes through copy_bytes, so it is right on the CPU, on CUDA and on the guarded test
// device alike. Host code never dereferences Tensor::data of a store tensor itself.
#include <string>
#include <string_view>

#include "executor/device.h"
#include "executor/tensor.h"
#include "graph/error.h"

namespace onnxtrain {

// The one element of a scalar tensor of dtype T. `what` names it in errors (a view: a training step calls these,
// and must not allocate).
template <class T>
T read_scalar(const Tensor& t, std::string_view what) {
  if (t.dtype != dtype_of<T>() || t.numel() != 1)
    fail(std::string(what), "expected a " + dtype_name(dtype_of<T>()) + " scalar, got " + t.describe());
  T v{};
  copy_bytes(&v, Device::CPU, t.data, t.device, sizeof(T));
  return v;
}

template <class T>
void write_scalar(Tensor& t, T v, std::string_view what) {
  if (t.dtype != dtype_of<T>() || t.numel() != 1)
    fail(std::string(what), "expected a " + dtype_name(dtype_of<T>()) + " scalar, got " + t.describe());
  copy_bytes(t.data, t.device, &v, Device::CPU, sizeof(T));
}

// A float32 or float64 scalar as a double (a loss, a metric).
double read_number(const Tensor& t, std::string_view what);

// Copies src's bytes into dst (the same dtype and shape, checked: errors name `what`), across any two devices.
void copy_into(Tensor& dst, const Tensor& src, const std::string& what);
void copy_into(Tensor& dst, const TensorData& src, const std::string& what);

}  // namespace onnxtrain
