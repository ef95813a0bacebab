// Placeholder: trigonometric and activation kernels arrive with the op-coverage work.
#include "executor/kernel.h"

namespace onnxtrain {

void register_cpu_activation(KernelRegistry& r) {}

}  // namespace onnxtrain
