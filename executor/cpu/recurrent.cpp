// CPU kernels of the recurrent op family (see register_cpu_recurrent in executor/kernel.h).
#include "executor/cpu/kernel_util.h"
#include "executor/kernel.h"

namespace onnxtrain {

void register_cpu_recurrent(KernelRegistry& /*r*/) {}

}  // namespace onnxtrain
