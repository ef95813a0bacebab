#include "training/npy.h"

#include "graph/error.h"

#include <fstream>
#include <string>

namespace onnxtrain {

void write_npy(const std::filesystem::path& p, const Tensor& t) {
  std::string descr = t.dtype == DType::Float32 ? "<f4" : t.dtype == DType::Float64 ? "<f8" : t.dtype == DType::Int64 ? "<i8" : "";
  if (descr.empty()) fail(p.string(), "cannot write " + dtype_name(t.dtype) + " to .npy (float32, float64, int64 only)");
  std::string shape = "(";
  for (int64_t d : t.shape) shape += std::to_string(d) + ",";
  shape += ")";
  std::string header = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::ofstream f(p, std::ios::binary);
  f.write("\x93NUMPY\x01\x00", 8);
  uint16_t len = static_cast<uint16_t>(header.size());
  f.put(static_cast<char>(len & 0xff));
  f.put(static_cast<char>(len >> 8));
  f << header;
  f.write(static_cast<const char*>(t.data), static_cast<std::streamsize>(t.nbytes()));
  if (!f) fail(p.string(), "could not write the file");
}

}  // namespace onnxtrain
