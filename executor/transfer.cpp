#include "executor/transfer.h"

namespace onnxtrain {

double read_number(const Tensor& t, std::string_view what) {
  if (t.numel() != 1) fail(std::string(what), "expected a scalar, got " + t.describe());
  if (t.dtype == DType::Float32) return read_scalar<float>(t, what);
  if (t.dtype == DType::Float64) return read_scalar<double>(t, what);
  fail(std::string(what), "expected a floating-point scalar, got " + t.describe());
}

void copy_into(Tensor& dst, const Tensor& src, const std::string& what) {
  if (src.dtype != dst.dtype || src.shape != dst.shape) fail(what, "expected " + dst.describe() + ", got " + src.describe());
  copy_bytes(dst.data, dst.device, src.data, src.device, dst.nbytes());
}

void copy_into(Tensor& dst, const TensorData& src, const std::string& what) {
  if (src.dtype != dst.dtype || src.dims != dst.shape)
    fail(what, "expected " + dst.describe() + ", got " + dtype_name(src.dtype) + shape_string(src.dims));
  if (src.bytes.size() != dst.nbytes())
    fail(what, "holds " + std::to_string(src.bytes.size()) + " bytes but " + dst.describe() + " needs " +
                   std::to_string(dst.nbytes()));
  copy_bytes(dst.data, dst.device, src.bytes.data(), Device::CPU, dst.nbytes());
}

}  // namespace onnxtrain
