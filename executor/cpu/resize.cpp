// Resize (opset 11+) on the CPU (rule: gradients/rules/resize.cpp; CUDA twin: executor/cuda/resize.cu): nearest
// (every nearest_mode), linear and cubic, with antialias, exclude_outside, every coordinate_transformation_mode
// (tf_crop_and_resize with its extrapolation value), scales or sizes, the opset-18 axes and
// keep_aspect_ratio_policy. The node's checks, output shape and per-axis tap tables are ops::prepare_resize
// (executor/ops/resize_taps.h), which the CUDA twin calls too; this kernel applies the axes one after another
// (innermost first, as the ONNX reference does), accumulating in double like the reference.
#include <algorithm>
#include <cstring>
#include <memory>

#include "executor/broadcast.h"  // parallel_chunks
#include "executor/cpu/kernel_util.h"
#include "executor/kernel.h"
#include "executor/ops/resize_taps.h"

namespace onnxtrain {
namespace {

using ops::AxisTaps;

template <class T> class ResizeKernel final : public Kernel {
 public:
  ResizeKernel(std::vector<int64_t> in_shape, std::vector<std::pair<size_t, AxisTaps>> axes, double extrapolation)
      : in_shape_(std::move(in_shape)), axes_(std::move(axes)), extrapolation_(extrapolation) {}

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const T* x = in[0]->ptr<T>();
    T* y = out[0]->ptr<T>();
    const int64_t n_in = in[0]->numel();
    if (out[0]->numel() == 0) return;
    if (axes_.empty()) {
      if (in[0]->data != out[0]->data) std::memcpy(y, x, static_cast<size_t>(n_in) * sizeof(T));
      return;
    }
    cur_.assign(x, x + n_in);
    std::vector<int64_t> shape = in_shape_;
    for (const auto& axis_taps : axes_) {
      // Not a structured binding: clang 14 (the sanitizer build) cannot capture one in the lambda below.
      const size_t axis = axis_taps.first;
      const AxisTaps& taps = axis_taps.second;
      int64_t pre = 1, post = 1;
      for (size_t i = 0; i < shape.size(); ++i) {
        if (i < axis) pre *= shape[i];
        if (i > axis) post *= shape[i];
      }
      next_.assign(static_cast<size_t>(pre * taps.out * post), 0.0);
      parallel_chunks(pre * taps.out, std::max<int64_t>(1, cpu::kCostlyGrain / std::max<int64_t>(post, 1)),
                      [&](int64_t s, int64_t e) {
                        for (int64_t row = s; row < e; ++row) {
                          const int64_t p = row / taps.out, o = row % taps.out;
                          double* dst = next_.data() + row * post;
                          if (taps.outside[o]) {
                            std::fill(dst, dst + post, extrapolation_);
                            continue;
                          }
                          for (int64_t k = 0; k < taps.n; ++k) {
                            const double w = taps.weight[o * taps.n + k];
                            if (w == 0) continue;
                            const double* src = cur_.data() + (p * taps.in + taps.index[o * taps.n + k]) * post;
                            for (int64_t q = 0; q < post; ++q) dst[q] += w * src[q];
                          }
                        }
                      });
      std::swap(cur_, next_);
      shape[axis] = taps.out;
    }
    for (size_t i = 0; i < cur_.size(); ++i) y[i] = static_cast<T>(cur_[i]);
  }

 private:
  std::vector<int64_t> in_shape_;
  std::vector<std::pair<size_t, AxisTaps>> axes_;  // innermost first
  double extrapolation_;
  std::vector<double> cur_, next_;
};

std::unique_ptr<Kernel> make_resize(PrepareContext& ctx) {
  ops::ResizePlan p = ops::prepare_resize(ctx);
  const KernelInput& x = ctx.inputs[0];
  if (x.dtype == DType::Float32) return std::make_unique<ResizeKernel<float>>(x.shape, std::move(p.axes), p.extrapolation);
  if (x.dtype == DType::Float64) return std::make_unique<ResizeKernel<double>>(x.shape, std::move(p.axes), p.extrapolation);
  cpu::fail_dtype(ctx);
}

}  // namespace

void register_cpu_resize(KernelRegistry& r) {
  cpu::add(r, "Resize", 11, {DType::Float32, DType::Float64}, make_resize);
}

}  // namespace onnxtrain
