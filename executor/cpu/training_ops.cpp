// Placeholder: the ai.onnx.preview.training kernels (Momentum, Adam, Adagrad) arrive with the optimizers work.
#include "executor/kernel.h"

namespace onnxtrain {

void register_cpu_training_ops(KernelRegistry& r) {}

}  // namespace onnxtrain
