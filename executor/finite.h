#pragma once
// Numerical guards (docs/reliability.md): finding NaN/Inf in tensors without allocating, and the error that
// reports one.
#include <cstdint>
#include <string>

#include "executor/tensor.h"
#include "graph/error.h"

namespace onnxtrain {

// Thrown when a guarded value is NaN or Inf. `value` is the tensor's name; the message says where it came
// from and how many elements are affected.
class NonFiniteError : public Error {
 public:
  NonFiniteError(const std::string& message, std::string value) : Error(message), value_(std::move(value)) {}
  const std::string& value() const { return value_; }

 private:
  std::string value_;
};

struct NonFiniteCount {
  int64_t count = 0;  // NaN and Inf elements
  int64_t first = -1;  // flat index of the first one
};
// Counts the NaN/Inf elements of a floating-point tensor (float16/bfloat16/float32/float64) on any device;
// other dtypes count as finite. On the host it allocates nothing; a device tensor is first copied to the host.
NonFiniteCount count_non_finite(const Tensor& t);

// "3 of 16384 elements are NaN or Inf (the first at flat index 17 is nan)". Reads the element named, on any
// device.
std::string describe_non_finite(const Tensor& t, const NonFiniteCount& c);

}  // namespace onnxtrain
