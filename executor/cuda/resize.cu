// Resize on CUDA (CPU kernel: executor/cpu/resize.cpp; rule: gradients/rules/resize.cpp).
//
// Its factory takes the node's checks, output shape and tap tables from ops::prepare_resize
// (executor/ops/resize_taps.h), as the CPU factory does, so the coordinate modes and interpolation weights have one
// source and the CPU factory is not run. The tap tables are applied axis by axis, innermost first,
// accumulating in double like the CPU kernel.
#include <algorithm>
#include <memory>

#include "executor/cuda/common.h"
#include "executor/cuda/device_util.cuh"
#include "executor/ops/resize_taps.h"
#include "graph/error.h"

namespace onnxtrain::cuda {
namespace {

// A plan-time host vector as a device tensor.
template <class V> Tensor upload(const std::vector<V>& v) {
  Tensor h = Tensor::empty(dtype_of<V>(), {static_cast<int64_t>(v.size())});
  std::copy(v.begin(), v.end(), h.ptr<V>());
  return h.to(Device::CUDA);
}

// ---- Resize ----------------------------------------------------------------------------------------------

struct AxisStage {
  int64_t pre, in, out, post, n;
  const int64_t* index;
  const double* weight;
  const uint8_t* outside;
};

template <class S, class D> __global__ void resize_axis_kernel(AxisStage a, double extrapolation, const S* src, D* dst) {
  const int64_t total = a.pre * a.out * a.post;
  for (int64_t e = global_index(); e < total; e += grid_stride()) {
    const int64_t row = e / a.post, q = e % a.post, p = row / a.out, o = row % a.out;
    double acc = 0;
    if (a.outside[o]) {
      acc = extrapolation;
    } else {
      for (int64_t k = 0; k < a.n; ++k) {
        const double w = a.weight[o * a.n + k];
        if (w != 0) acc += w * static_cast<double>(src[(p * a.in + a.index[o * a.n + k]) * a.post + q]);
      }
    }
    dst[e] = static_cast<D>(acc);
  }
}

template <class T> class ResizeKernel final : public Kernel {
 public:
  ResizeKernel(std::vector<AxisStage> stages, std::vector<Tensor> tables, double extrapolation, int64_t scratch)
      : stages_(std::move(stages)), tables_(std::move(tables)), extrapolation_(extrapolation) {
    for (Tensor& b : buf_) b = Tensor::empty(DType::Float64, {scratch}, Device::CUDA);
  }
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    if (out[0]->numel() == 0) return;
    const size_t last = stages_.size() - 1;
    for (size_t s = 0; s < stages_.size(); ++s) {
      const AxisStage& a = stages_[s];
      const unsigned blocks = blocks_for(a.pre * a.out * a.post);
      double* next = buf_[s % 2].ptr<double>();
      const double* prev = buf_[(s + 1) % 2].ptr<double>();
      // Input T only in the first stage, output T only in the last; double in between.
      if (s == 0 && s == last)
        resize_axis_kernel<<<blocks, kBlock, 0, stream()>>>(a, extrapolation_, in[0]->ptr<T>(), out[0]->ptr<T>());
      else if (s == 0)
        resize_axis_kernel<<<blocks, kBlock, 0, stream()>>>(a, extrapolation_, in[0]->ptr<T>(), next);
      else if (s == last)
        resize_axis_kernel<<<blocks, kBlock, 0, stream()>>>(a, extrapolation_, prev, out[0]->ptr<T>());
      else
        resize_axis_kernel<<<blocks, kBlock, 0, stream()>>>(a, extrapolation_, prev, next);
      check_launch("Resize kernel");
    }
  }

 private:
  std::vector<AxisStage> stages_;
  std::vector<Tensor> tables_;  // device tap tables the stages point into
  double extrapolation_;
  Tensor buf_[2];
};

// The CPU factory (the second argument) is not run: ops::prepare_resize is the shared plan-time part.
std::unique_ptr<Kernel> make_resize(PrepareContext& ctx) {
  const ops::ResizePlan plan = ops::prepare_resize(ctx);
  if (plan.axes.empty()) return std::make_unique<DeviceCopyKernel>();
  std::vector<int64_t> shape = ctx.inputs[0].shape;
  std::vector<AxisStage> stages;
  std::vector<Tensor> tables;
  int64_t scratch = 1;
  for (const auto& [axis, t] : plan.axes) {
    AxisStage a{1, t.in, t.out, 1, t.n, nullptr, nullptr, nullptr};
    for (size_t i = 0; i < shape.size(); ++i) {
      if (i < axis) a.pre *= shape[i];
      if (i > axis) a.post *= shape[i];
    }
    tables.push_back(upload(t.index));
    a.index = tables.back().ptr<int64_t>();
    tables.push_back(upload(t.weight));
    a.weight = tables.back().ptr<double>();
    tables.push_back(upload(t.outside));
    a.outside = tables.back().ptr<uint8_t>();
    stages.push_back(a);
    shape[axis] = t.out;
    scratch = std::max(scratch, a.pre * a.out * a.post);
  }
  if (ctx.inputs[0].dtype == DType::Float64)
    return std::make_unique<ResizeKernel<double>>(std::move(stages), std::move(tables), plan.extrapolation, scratch);
  return std::make_unique<ResizeKernel<float>>(std::move(stages), std::move(tables), plan.extrapolation, scratch);
}

}  // namespace

void register_cuda_resize(KernelRegistry& r) { twin(r, "Resize", make_resize); }

}  // namespace onnxtrain::cuda
