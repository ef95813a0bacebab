#pragma once
// The plan-time part of the shape family's ops whose CUDA kernels need no CPU kernel (the views Reshape, Flatten,
// Squeeze and Unsqueeze, Gather, and the plan-time values Shape, Size, Constant, ConstantOfShape and Range), shared by the CPU kernels (executor/cpu/shape.cpp) and their CUDA twins
// (executor/cuda/shape.cu): input checks, attributes and plan-time inputs, and the output dtypes and shapes. The
// data-movement ops the CUDA backend traces through the CPU kernel (Transpose, Slice, ...) are not here:
// executor/ops/README.md says why.
#include <cstdint>

#include "executor/kernel.h"
#include "executor/tensor.h"

namespace onnxtrain::ops {

// Each sets output 0 to the input's dtype and the new shape (same number of elements); the kernels copy bytes
// or view them.
void prepare_reshape(PrepareContext& ctx);
void prepare_flatten(PrepareContext& ctx);
void prepare_squeeze(PrepareContext& ctx);
void prepare_unsqueeze(PrepareContext& ctx);

// Gather along `axis`: data read as [outer, n, inner]; indices int32 or int64, checked when the kernels run.
struct GatherGeometry {
  int64_t outer = 1, n = 0, inner = 1;
};
GatherGeometry prepare_gather(PrepareContext& ctx);

// Ops whose output is known at plan time: each sets output 0 and returns its value (a host tensor), which the CPU
// kernel writes and the plan folds; CUDA plans only ever fold them (cuda/shape.cu, fold_only).
Tensor prepare_shape(PrepareContext& ctx);  // reads through a folded Transpose (kShapePerm, plan_fusion.h)
Tensor prepare_size(PrepareContext& ctx);
Tensor prepare_constant(PrepareContext& ctx);
Tensor prepare_range(PrepareContext& ctx);
// ConstantOfShape: the one-element fill value (attribute `value`, float32 0 by default).
TensorData prepare_constant_of_shape(PrepareContext& ctx);

}  // namespace onnxtrain::ops
