#pragma once
// The plan-time part of onnxtrain.GatherGrad and onnxtrain.SumToShape, shared by the CPU kernels
// (executor/cpu/gather_grad.cpp) and their CUDA twins (executor/cuda/gather_grad.cu): input checks, the target
// shape (a plan-time input), and dX's dtype and shape.
#include <cstdint>
#include <vector>

#include "executor/kernel.h"

namespace onnxtrain::ops {

// dX (the target shape) read as [outer, n, inner] around Gather's axis; dY as [outer, m, inner] with m the
// number of indices.
struct GatherGradGeometry {
  int64_t outer = 1, n = 0, m = 1, inner = 1;
};

// Checks dY against Gather's output shape for the target shape, axis and indices (int32 or int64), sets dX.
GatherGradGeometry prepare_gather_grad(PrepareContext& ctx);

// dY's axes summed away (leading ones and those where the target has 1) and dY's shape with them kept as 1.
struct SumToShapeAxes {
  std::vector<int64_t> axes, kept;
};

// Checks that the target shape broadcasts to dY and sets dX (dY's dtype). The dtype is each kernel's to check:
// the CPU runs float16/bfloat16 through its float32 kernel (cpu/half_matmul.cpp), which its CUDA twin shares.
SumToShapeAxes prepare_sum_to_shape(PrepareContext& ctx);

}  // namespace onnxtrain::ops
