#pragma once
// The DLPack exchange ABI (https://dmlc.github.io/dlpack/latest/c_api.html), the unversioned form every producer
// (torch, numpy, jax, cupy) hands out from __dlpack__() in a capsule named "dltensor". Declared here rather than
// taken from a package: it is a frozen C ABI of four structs, and the pip build has no system header to find.
#include <cstdint>

namespace onnxtrain::py_binding::dlpack {

enum DeviceType : int32_t { kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3 };
enum TypeCode : uint8_t { kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4, kDLBool = 6 };

struct Device {
  int32_t device_type;
  int32_t device_id;
};
struct DataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  Device device;
  int32_t ndim;
  DataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; null means C-contiguous
  uint64_t byte_offset;
};
struct ManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(ManagedTensor* self);
};

}  // namespace onnxtrain::py_binding::dlpack
