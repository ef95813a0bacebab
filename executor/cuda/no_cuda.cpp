// Built when onnxtrain is configured without CUDA: every GPU entry point throws one clear error.
#include <cstddef>
#include <cstring>

#include "executor/device.h"
#include "graph/error.h"

namespace onnxtrain {

namespace {
const char* const kNoCuda =
    "onnxtrain was built without CUDA (no CUDA toolkit was found at configure time; rebuild with "
    "-DONNXTRAIN_CUDA=ON on a machine with the toolkit)";
}

bool built_with_cuda() { return false; }
bool cuda_available() { return false; }
std::string cuda_unavailable_reason() { return kNoCuda; }
void select_cuda_device(int index) { throw Error("device 'cuda:" + std::to_string(index) + "' requested, but " + kNoCuda); }

void* cuda_allocate(size_t) { throw Error(std::string("device 'cuda' requested, but ") + kNoCuda); }
void cuda_free(void*) {}

void cuda_copy_bytes(void*, Device, const void*, Device, size_t) {
  throw Error(std::string("copy to or from a CUDA tensor: ") + kNoCuda);
}

std::shared_ptr<void> cuda_make_stream() { throw Error(std::string("a CUDA stream was requested, but ") + kNoCuda); }
StreamScope::StreamScope(void*) : previous_(nullptr) {}
StreamScope::~StreamScope() = default;
void synchronize(void*) {}
DeviceMemoryStats device_memory_stats() { return {}; }

}  // namespace onnxtrain
