#include "graph/dtype.h"

namespace onnxtrain {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::Float32: return 4;
    case DType::UInt8: return 1;
    case DType::Int8: return 1;
    case DType::UInt16: return 2;
    case DType::Int16: return 2;
    case DType::Int32: return 4;
    case DType::Int64: return 8;
    case DType::Bool: return 1;
    case DType::Float16: return 2;
    case DType::Float64: return 8;
    case DType::UInt32: return 4;
    case DType::UInt64: return 8;
    case DType::BFloat16: return 2;
    case DType::String:
    case DType::Undefined: return 0;
  }
  return 0;
}

std::string dtype_name(DType t) {
  switch (t) {
    case DType::Undefined: return "undefined";
    case DType::Float32: return "float32";
    case DType::UInt8: return "uint8";
    case DType::Int8: return "int8";
    case DType::UInt16: return "uint16";
    case DType::Int16: return "int16";
    case DType::Int32: return "int32";
    case DType::Int64: return "int64";
    case DType::String: return "string";
    case DType::Bool: return "bool";
    case DType::Float16: return "float16";
    case DType::Float64: return "float64";
    case DType::UInt32: return "uint32";
    case DType::UInt64: return "uint64";
    case DType::BFloat16: return "bfloat16";
  }
  // An out-of-range value can only come from a cast of an ONNX type we do not model (complex, float8, ...).
  return "dtype(" + std::to_string(static_cast<int32_t>(t)) + ")";
}

bool is_floating(DType t) {
  return t == DType::Float32 || t == DType::Float64 || t == DType::Float16 || t == DType::BFloat16;
}

}  // namespace onnxtrain
