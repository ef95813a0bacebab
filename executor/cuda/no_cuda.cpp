// Built when onnxtrain is configured without CUDA: every GPU entry point throws one clear error.
#include <string>

#include "executor/tensor.h"
#include "graph/error.h"

namespace onnxtrain {

bool cuda_available() { return false; }

void* allocate_device(size_t bytes, Device d) {
  throw Error("device '" + device_name(d) +
              "' requested, but onnxtrain was built without CUDA (no CUDA toolkit was found at configure time; "
              "rebuild with -DONNXTRAIN_CUDA=ON on a machine with the toolkit)");
}

void free_device(void*, Device) {}

}  // namespace onnxtrain
