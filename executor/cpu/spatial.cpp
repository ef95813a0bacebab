// CPU kernels of the spatial op family (see register_cpu_spatial in executor/kernel.h).
#include "executor/cpu/kernel_util.h"
#include "executor/kernel.h"

namespace onnxtrain {

void register_cpu_spatial(KernelRegistry& /*r*/) {}

}  // namespace onnxtrain
