#pragma once
// The plan-time part of the optimizer's update ops (onnxtrain.AdamUpdate, SgdUpdate, AdagradUpdate and their
// variants, formulas/optimizer_updates.h), shared by the CPU kernels (executor/cpu/fused_update.cpp) and their CUDA
// twins (executor/cuda/training_ops.cu): input checks and output dtypes and shapes.
#include <cstddef>

#include "executor/kernel.h"
#include "formulas/optimizer_updates.h"

namespace onnxtrain::ops {

// Every update op's inputs: `arrays` tensors (float32 or float64, one type and shape: the weight, its gradient,
// its state), then with `flag` one bool scalar (SGD's first step), then `scalars` one-element tensors of the arrays'
// type (read at run time, since the learning rate and step change). Sets the `outputs` outputs to the weight's type
// and shape.
void prepare_update(PrepareContext& ctx, size_t arrays, bool flag, size_t scalars, size_t outputs);

inline void prepare_adam_update(PrepareContext& ctx, formulas::AdamDecay decay, bool amsgrad) {
  const auto arrays = static_cast<size_t>(formulas::adam_array_inputs(amsgrad));
  prepare_update(ctx, arrays, false, static_cast<size_t>(formulas::adam_scalar_inputs(decay)), arrays - 1);
}
inline void prepare_sgd_update(PrepareContext& ctx, bool l2, formulas::SgdMomentum momentum) {
  const bool with_buffer = momentum != formulas::SgdMomentum::None;
  prepare_update(ctx, static_cast<size_t>(formulas::sgd_array_inputs(momentum)), with_buffer,
                 static_cast<size_t>(formulas::sgd_scalar_inputs(l2, momentum)), with_buffer ? 2 : 1);
}
inline void prepare_adagrad_update(PrepareContext& ctx, bool l2) { prepare_update(ctx, 3, false, l2 ? 3 : 2, 2); }

}  // namespace onnxtrain::ops
