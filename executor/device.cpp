#include "executor/device.h"

#include <charconv>
#include <cstdlib>
#include <cstring>

#include "executor/guarded.h"
#include "graph/error.h"

namespace onnxtrain {

// executor/cuda/runtime.cpp, or executor/cuda/no_cuda.cpp (a clear error) without CUDA.
void select_cuda_device(int index);
void cuda_copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t n);
std::shared_ptr<void> cuda_make_stream();

void copy_bytes(void* dst, Device dd, const void* src, Device sd, size_t n) {
  if (n == 0) return;
  if (dd == Device::CUDA || sd == Device::CUDA) {
    if (dd == Device::Guarded || sd == Device::Guarded)
      fail("copy_bytes", "between the guarded test device and CUDA: stage through the host");
    cuda_copy_bytes(dst, dd, src, sd, n);
    return;
  }
  if (dd == Device::Guarded || sd == Device::Guarded) {
    guarded_copy(dst, src, n);
    return;
  }
  std::memmove(dst, src, n);
}

std::shared_ptr<void> make_stream(Device d) { return d == Device::CUDA ? cuda_make_stream() : nullptr; }

KernelScope::KernelScope(Device d) : opened_(d == Device::Guarded) {
  if (opened_) open_guarded_memory();
}
KernelScope::~KernelScope() {
  if (opened_) close_guarded_memory();
}

std::string default_device_name() {
  const char* env = std::getenv("ONNXTRAIN_DEVICE");
  return env && *env ? std::string(env) : std::string("cpu");
}

Device parse_device(std::string_view spec) {
  if (spec == "cpu") return Device::CPU;
  if (spec == "guarded") return Device::Guarded;
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
  fail("device '" + std::string(spec) + "'", "expected \"cpu\", \"cuda\", \"cuda:N\" (N a device index >= 0) or \"guarded\" (the test device)");
}

}  // namespace onnxtrain
