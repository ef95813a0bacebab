#include "executor/device.h"

#include <charconv>

#include "graph/error.h"

namespace onnxtrain {

void select_cuda_device(int index);  // executor/cuda/runtime.cpp or no_cuda.cpp

Device parse_device(std::string_view spec) {
  if (spec == "cpu") return Device::CPU;
  int index = 0;
  if (spec.substr(0, 4) == "cuda") {
    std::string_view rest = spec.substr(4);
    bool ok = rest.empty();
    if (!ok && rest[0] == ':' && rest.size() > 1) {
      auto [end, ec] = std::from_chars(rest.data() + 1, rest.data() + rest.size(), index);
      ok = ec == std::errc() && end == rest.data() + rest.size() && index >= 0;
    }
    if (ok) {
      select_cuda_device(index);
      return Device::CUDA;
    }
  }
  fail("device '" + std::string(spec) + "'", "expected \"cpu\", \"cuda\" or \"cuda:N\" (N a device index >= 0)");
}

}  // namespace onnxtrain
