#pragma once
// The plan-time part of the normalizations that have kernels on both backends (LayerNormalization,
// InstanceNormalization, GroupNormalization, BatchNormalization and the fused LayerNormalizationGrad and
// BatchNormalizationGrad), shared by the CPU kernels (executor/cpu/norm.cpp) and their CUDA twins
// (executor/cuda/norm.cu): input checks, attributes, output dtypes and shapes, and the row geometry both
// kernels walk. Each prepare_* function fails naming the node, as the kernels' factories did.
#include <cstdint>
#include <vector>

#include "executor/kernel.h"

namespace onnxtrain::ops {

// LayerNormalization: X read as `rows` rows of `len` elements, everything from `axis` on (`row_shape`).
struct LayerNormAttrs {
  int64_t axis = 0, rows = 1, len = 1;
  std::vector<int64_t> row_shape;
  bool has_bias = false;
  DType stash = DType::Float32;  // Mean and InvStdDev's type (stash_type 1 or 11)
  double eps = 1e-5;
};
// Scale and B must broadcast to row_shape; Y, Mean and InvStdDev (1 to 3 outputs) are set.
LayerNormAttrs prepare_layer_norm(PrepareContext& ctx);

// InstanceNormalization and GroupNormalization: `rows` rows of `len` elements; the affine parameter changes
// every `plane` elements, element i of the tensor using parameter (i / plane) % channels.
struct RowNormGeometry {
  int64_t rows = 0, len = 0, plane = 0, channels = 0;
  double eps = 1e-5;
};
RowNormGeometry prepare_instance_norm(PrepareContext& ctx);
// Opset 18 has one scale/bias per group (deprecated); opset 21 one per channel.
RowNormGeometry prepare_group_norm(PrepareContext& ctx);

// BatchNormalization over X [n, c, spatial...], `plane` the product of the spatial dims.
struct BatchNormAttrs {
  int64_t n = 0, c = 0, plane = 1;
  double eps = 1e-5, momentum = 0.9;
  bool training = false;  // opset 14+ training_mode=1: batch statistics, running statistics as outputs 1 and 2
};
BatchNormAttrs prepare_batch_norm(PrepareContext& ctx);

// onnxtrain.BatchNormalizationGrad (dY, X, Scale) -> (dX, dScale, dBias); the same geometry, no momentum.
BatchNormAttrs prepare_batch_norm_grad(PrepareContext& ctx);

// onnxtrain.LayerNormalizationGrad (dY, X, Scale, Mean, InvStdDev) -> (dX, dScale, dBias): `rows` rows of `len`.
struct LayerNormGradGeometry {
  int64_t rows = 1, len = 1;
};
LayerNormGradGeometry prepare_layer_norm_grad(PrepareContext& ctx);

}  // namespace onnxtrain::ops
