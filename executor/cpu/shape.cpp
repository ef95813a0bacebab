// Placeholder: filled in by the kernels work; registers nothing yet.
#include "executor/kernel.h"

namespace onnxtrain {

void register_cpu_shape(KernelRegistry& r) {}

}  // namespace onnxtrain
