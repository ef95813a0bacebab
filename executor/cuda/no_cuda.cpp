// Built when onnxtrain is configured without CUDA: every GPU entry point throws one clear error.
#include <cstddef>

#include "graph/error.h"

namespace onnxtrain {

bool cuda_available() { return false; }

void* cuda_allocate(size_t) {
  throw Error("device 'cuda' requested, but onnxtrain was built without CUDA (no CUDA toolkit was found at "
              "configure time; rebuild with -DONNXTRAIN_CUDA=ON on a machine with the toolkit)");
}

void cuda_free(void*) {}

}  // namespace onnxtrain
