#pragma once
// The plan-time part of the pooling ops that have kernels on both backends (MaxPool, AveragePool, their fused
// gradients, GlobalAveragePool and GlobalMaxPool), shared by the CPU kernels (executor/cpu/pool.cpp) and their
// CUDA twins (executor/cuda/pool.cu): input checks, attributes, the window geometry (conv_geometry.h) and the
// output dtypes and shapes.
#include <cstdint>

#include "executor/kernel.h"
#include "executor/ops/conv_geometry.h"

namespace onnxtrain::ops {

struct MaxPoolAttrs {
  Geo g;
  bool indices = false;       // the Indices output is named
  bool column_major = false;  // storage_order 1
};
MaxPoolAttrs prepare_max_pool(PrepareContext& ctx);
// onnxtrain.MaxPoolGrad (dY, X) -> dX: MaxPool's geometry over X (input 1); dY must be MaxPool's output.
Geo prepare_max_pool_grad(PrepareContext& ctx);

struct AvgPoolAttrs {
  Geo g;
  bool include_pad = false;  // count_include_pad
};
AvgPoolAttrs prepare_avg_pool(PrepareContext& ctx);
// onnxtrain.AveragePoolGrad (dY, X) -> dX: explicit attributes only (its function body reads them), no dilations.
AvgPoolAttrs prepare_avg_pool_grad(PrepareContext& ctx);

// GlobalAveragePool / GlobalMaxPool over X [N, C, spatial...]: N * C planes of `size` elements each.
struct GlobalPoolGeometry {
  int64_t planes = 0, size = 1;
};
GlobalPoolGeometry prepare_global_pool(PrepareContext& ctx);

}  // namespace onnxtrain::ops
