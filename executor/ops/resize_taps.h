#pragma once
// Resize's plan-time part (executor/ops/resize_taps.cpp): the node's checks, its output shape and the tap tables,
// shared by the CPU kernel (executor/cpu/resize.cpp) and its CUDA twin (executor/cuda/resize.cu, which uploads and
// applies them), so both backends interpolate with the same weights and neither runs the other's factory.
// Device-neutral: plain host data, and the cubic kernel (which GridSample's bicubic mode uses too).
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "executor/kernel.h"

namespace onnxtrain::ops {

// One resized axis: output o reads inputs index[o*n + k] with weights weight[o*n + k], or is the extrapolation
// value when outside[o] (tf_crop_and_resize beyond the input).
struct AxisTaps {
  int64_t in = 0, out = 0, n = 0;
  std::vector<int64_t> index;
  std::vector<double> weight;
  std::vector<uint8_t> outside;

  bool identity() const {
    if (in != out) return false;
    for (int64_t o = 0; o < out; ++o) {
      if (outside[o]) return false;
      for (int64_t k = 0; k < n; ++k) {
        const double w = weight[o * n + k];
        if (w != 0 && !(w == 1 && index[o * n + k] == o)) return false;
      }
    }
    return true;
  }
};

// Keys' cubic convolution kernel with parameter A (Resize's cubic_coeff_a, -0.75 for GridSample's bicubic),
// at signed distance x from the tap; and its derivative in x (GridSample's grid gradient).
inline double cubic_kernel(double A, double x) {
  x = std::abs(x);
  if (x <= 1) return ((A + 2) * x - (A + 3)) * x * x + 1;
  if (x < 2) return ((A * x - 5 * A) * x + 8 * A) * x - 4 * A;
  return 0.0;
}
inline double cubic_kernel_slope(double A, double x) {
  const double s = x < 0 ? -1.0 : 1.0;
  x = std::abs(x);
  if (x <= 1) return s * (3 * (A + 2) * x - 2 * (A + 3)) * x;
  if (x < 2) return s * ((3 * A * x - 10 * A) * x + 8 * A);
  return 0.0;
}

// What a Resize node plans: the axes to resize, innermost first, applied one after another (none: a copy), and the
// value of outputs outside the input (tf_crop_and_resize).
struct ResizePlan {
  std::vector<std::pair<size_t, AxisTaps>> axes;
  double extrapolation = 0;
};

// Checks the inputs and attributes (scales or sizes, roi, the opset-18 axes and keep_aspect_ratio_policy), sets
// output 0 (X's dtype, the resized shape) and returns the tap tables. The kernels only pick their element type.
ResizePlan prepare_resize(PrepareContext& ctx);

}  // namespace onnxtrain::ops
