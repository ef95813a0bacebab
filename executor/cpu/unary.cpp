// Placeholder: filled in by the kernels work; registers nothing yet.
#include "executor/kernel.h"

namespace onnxtrain {

void register_cpu_unary(KernelRegistry& r) {}

}  // namespace onnxtrain
