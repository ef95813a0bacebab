#pragma once
// The CPU kernels of the optimizer's update ops (onnxtrain.AdamUpdate, SgdUpdate, AdagradUpdate and their variants;
// formulas/optimizer_updates.h): one loop per weight that evaluates the formula on each element, keeping it in
// registers, reading each array once and writing each result once. The op's standard-ONNX function body is
// the same template on graph values, and this file is compiled with -ffp-contract=off, so the kernel and the body run
// as standard ops agree bit for bit (tests/optimizers/test_update_formulas.cpp).
#include "executor/kernel.h"

namespace onnxtrain {

// Registers them (called by register_cpu_training_ops, their family's registration: executor/cpu/training_ops.cpp).
void add_cpu_optimizer_update_kernels(KernelRegistry& r);

}  // namespace onnxtrain
