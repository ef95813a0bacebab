#pragma once
// Resize's plan-time tap tables, shared by the CPU kernel (executor/cpu/resize.cpp, which builds them) and its
// CUDA twin (executor/cuda/misc.cu, which uploads and applies them), so both backends interpolate with the
// same weights.
#include <cstdint>
#include <utility>
#include <vector>

namespace onnxtrain::cpu {

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

// What the CPU Resize kernel planned: the axes to resize, innermost first, applied one after another.
class ResizeTaps {
 public:
  virtual ~ResizeTaps() = default;
  virtual const std::vector<std::pair<size_t, AxisTaps>>& planned_axes() const = 0;
  virtual double extrapolation() const = 0;
};

}  // namespace onnxtrain::cpu
