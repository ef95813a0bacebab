#pragma once
// The plan-time part of the optimizer's update ops (onnxtrain.AdamUpdate and its variants,
// formulas/optimizer_updates.h), shared by the CPU kernels (executor/cpu/fused_update.cpp) and their CUDA twins
// (executor/cuda/training_ops.cu): input checks and output dtypes and shapes.
#include "executor/kernel.h"
#include "formulas/optimizer_updates.h"

namespace onnxtrain::ops {

// Checks the arrays (P, G, M, V[, Vmax]: float32 or float64, one type and shape) and the scalars (one element of
// that type each, read at run time since the learning rate and step change), and sets every output to P's type
// and shape.
void prepare_adam_update(PrepareContext& ctx, formulas::AdamDecay decay, bool amsgrad);

}  // namespace onnxtrain::ops
