#pragma once
// The plan-time part of Conv, ConvTranspose and onnxtrain.ConvGrad, shared by the CPU kernels
// (executor/cpu/conv.cpp) and their CUDA twins (executor/cuda/conv.cu): input checks, the window geometry
// (conv_geometry.h) and the output dtypes and shapes.
#include <array>

#include "executor/kernel.h"
#include "executor/ops/conv_geometry.h"

namespace onnxtrain::ops {

struct ConvAttrs {
  Geo g;
  bool has_bias = false;  // input B, checked to be [M] of X's dtype
};
ConvAttrs prepare_conv(PrepareContext& ctx);

struct ConvTransposeAttrs {
  Geo g;
  Dims3 right_pad{0, 0, 0};  // conv_transpose_geometry's end padding
  bool has_bias = false;
};
ConvTransposeAttrs prepare_conv_transpose(PrepareContext& ctx);

// onnxtrain.ConvGrad (dY, X, W) -> (dX, dW, dB): Conv's geometry over X (input 1), explicit pads and strides.
struct ConvGradAttrs {
  Geo g;
  std::array<bool, 3> want{};  // wanted_outputs
};
ConvGradAttrs prepare_conv_grad(PrepareContext& ctx);

}  // namespace onnxtrain::ops
