// Resize, Einsum, Dropout and onnxtrain.DropoutMask on CUDA.
//
// Resize and Einsum run their CPU factory at plan time and take its plan (executor/ops/resize_taps.h,
// executor/ops/einsum_plan.h), so the equation, coordinate modes and interpolation weights have one source.
// Resize applies the tap tables axis by axis, innermost first, accumulating in double like the CPU kernel;
// Einsum runs one thread per output element over the summed indices, in the CPU's order.
// Dropout draws from a counter-based stream of its own (a splitmix64 hash of seed, run and element), not the
// CPU's sequential MT19937 stream, so masks differ between the devices; see docs/gpu.md. DropoutMask (LoRA's
// adapter dropout) is counter-based on both devices, with the same formula: the same masks.
#include <algorithm>
#include <memory>
#include <random>

#include "executor/cuda/common.h"
#include "executor/cuda/device_util.cuh"
#include "executor/ops/einsum_plan.h"
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

std::unique_ptr<Kernel> make_resize(PrepareContext& ctx, const KernelFactory& host) {
  const std::unique_ptr<Kernel> cpu_kernel = host(ctx);
  const auto* plan = dynamic_cast<const ops::ResizeTaps*>(cpu_kernel.get());
  if (!plan) ctx.fail("internal: the CPU Resize kernel did not expose its tap tables");
  if (plan->planned_axes().empty()) return std::make_unique<DeviceCopyKernel>();
  std::vector<int64_t> shape = ctx.inputs[0].shape;
  std::vector<AxisStage> stages;
  std::vector<Tensor> tables;
  int64_t scratch = 1;
  for (const auto& [axis, t] : plan->planned_axes()) {
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
    return std::make_unique<ResizeKernel<double>>(std::move(stages), std::move(tables), plan->extrapolation(), scratch);
  return std::make_unique<ResizeKernel<float>>(std::move(stages), std::move(tables), plan->extrapolation(), scratch);
}

// ---- Einsum ----------------------------------------------------------------------------------------------

constexpr int kMaxOperands = 6;
constexpr int kMaxIndices = 10;

template <class T> struct EinsumGeom {
  int nt, no, ns;
  int64_t nsum;
  int64_t out_dims[kMaxIndices], sum_dims[kMaxIndices];
  int64_t ost[kMaxOperands][kMaxIndices], sst[kMaxOperands][kMaxIndices];
  const T* src[kMaxOperands];
};

template <class T> __global__ void einsum_kernel(int64_t nout, EinsumGeom<T> g, T* y) {
  for (int64_t o = global_index(); o < nout; o += grid_stride()) {
    int64_t base[kMaxOperands] = {};
    for (int64_t r = o, q = g.no - 1; q >= 0; --q) {
      const int64_t c = r % g.out_dims[q];
      r /= g.out_dims[q];
      for (int t = 0; t < g.nt; ++t) base[t] += c * g.ost[t][q];
    }
    T acc = T(0);
    for (int64_t s = 0; s < g.nsum; ++s) {
      int64_t off[kMaxOperands];
      for (int t = 0; t < g.nt; ++t) off[t] = base[t];
      for (int64_t r = s, q = g.ns - 1; q >= 0; --q) {
        const int64_t c = r % g.sum_dims[q];
        r /= g.sum_dims[q];
        for (int t = 0; t < g.nt; ++t) off[t] += c * g.sst[t][q];
      }
      T prod = T(1);
      for (int t = 0; t < g.nt; ++t) prod *= g.src[t][off[t]];
      acc += prod;
    }
    y[o] = acc;
  }
}

template <class T> class EinsumKernel final : public Kernel {
 public:
  explicit EinsumKernel(EinsumGeom<T> g) : g_(g) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const int64_t nout = out[0]->numel();
    if (nout == 0) return;
    EinsumGeom<T> g = g_;
    for (int t = 0; t < g.nt; ++t) g.src[t] = in[static_cast<size_t>(t)]->ptr<T>();
    einsum_kernel<<<blocks_for(nout), kBlock, 0, stream()>>>(nout, g, out[0]->ptr<T>());
    check_launch("Einsum kernel");
  }

 private:
  EinsumGeom<T> g_;
};

std::unique_ptr<Kernel> make_einsum(PrepareContext& ctx, const KernelFactory& host) {
  const std::unique_ptr<Kernel> cpu_kernel = host(ctx);
  const auto* planned = dynamic_cast<const ops::EinsumPlanned*>(cpu_kernel.get());
  if (!planned) ctx.fail("internal: the CPU Einsum kernel did not expose its plan");
  const ops::EinsumPlan& p = planned->plan();
  const size_t nt = p.out_strides.size();
  if (nt > static_cast<size_t>(kMaxOperands) || p.out_dims.size() > static_cast<size_t>(kMaxIndices) ||
      p.sum_dims.size() > static_cast<size_t>(kMaxIndices))
    ctx.fail("the CUDA Einsum takes at most " + std::to_string(kMaxOperands) + " operands and " +
             std::to_string(kMaxIndices) + " output and summed indices each");
  std::unique_ptr<Kernel> k;
  dispatch<float, double, int32_t, int64_t>(ctx.inputs[0].dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    EinsumGeom<T> g{};
    g.nt = static_cast<int>(nt);
    g.no = static_cast<int>(p.out_dims.size());
    g.ns = static_cast<int>(p.sum_dims.size());
    g.nsum = 1;
    for (int q = 0; q < g.no; ++q) g.out_dims[q] = p.out_dims[q];
    for (int q = 0; q < g.ns; ++q) g.nsum *= g.sum_dims[q] = p.sum_dims[q];
    for (size_t t = 0; t < nt; ++t) {
      for (int q = 0; q < g.no; ++q) g.ost[t][q] = p.out_strides[t][q];
      for (int q = 0; q < g.ns; ++q) g.sst[t][q] = p.sum_strides[t][q];
    }
    k = std::make_unique<EinsumKernel<T>>(g);
  });
  if (!k) ops::fail_dtype(ctx);
  return k;
}

// ---- Dropout ---------------------------------------------------------------------------------------------
// ratio and training_mode are read on the device (they may change between runs without a host round trip).
// Element i of run r draws u in [0, 1) from splitmix64(key ^ (r * 2^32 + i) * golden); with a seed every run
// uses r = 0 (the same mask each time, as on the CPU), without one r counts runs from a random key.

__host__ __device__ inline uint64_t splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

template <class T>
__global__ void dropout_kernel(int64_t n, uint64_t key, const void* ratio_p, bool ratio_double, double fixed_ratio,
                               const bool* training_p, const T* x, T* y, bool* mask) {
  const bool training = training_p && *training_p;
  const double ratio =
      ratio_p ? (ratio_double ? *static_cast<const double*>(ratio_p) : static_cast<double>(*static_cast<const float*>(ratio_p)))
              : fixed_ratio;
  const bool drop = training && ratio != 0.0;
  const T scale = static_cast<T>(1.0 / (1.0 - ratio));
  for (int64_t i = global_index(); i < n; i += grid_stride()) {
    bool keep = true;
    if (drop) keep = static_cast<double>(splitmix64(key ^ static_cast<uint64_t>(i)) >> 11) * 0x1.0p-53 >= ratio;
    y[i] = !drop ? x[i] : keep ? x[i] * scale : T(0);
    if (mask) mask[i] = keep;
  }
}

template <class T> class DropoutKernel final : public Kernel {
 public:
  DropoutKernel(bool has_ratio, bool has_mode, bool seeded, uint64_t key)
      : has_ratio_(has_ratio), has_mode_(has_mode), seeded_(seeded), key_(key) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const int64_t n = out[0]->numel();
    if (n == 0) return;
    const Tensor* r = has_ratio_ && in.size() > 1 ? in[1] : nullptr;
    const Tensor* m = has_mode_ && in.size() > 2 ? in[2] : nullptr;
    bool* mask = out.size() > 1 && out[1] ? out[1]->ptr<bool>() : nullptr;
    const uint64_t key = key_ ^ ((seeded_ ? 0 : runs_++) << 32) * 0x9e3779b97f4a7c15ULL;
    dropout_kernel<<<blocks_for(n), kBlock, 0, stream()>>>(n, key, r ? r->data : nullptr,
                                                           r && r->dtype == DType::Float64, 0.5,
                                                           m ? m->ptr<bool>() : nullptr, in[0]->ptr<T>(),
                                                           out[0]->ptr<T>(), mask);
    check_launch("Dropout kernel");
  }

 private:
  bool has_ratio_, has_mode_, seeded_;
  uint64_t key_;
  uint64_t runs_ = 0;
};

std::unique_ptr<Kernel> make_dropout(PrepareContext& ctx, const KernelFactory& host) {
  host_prepare(ctx, host);
  // Before opset 12 the CPU factory accepts only is_test=1: no training mode input, so always the identity.
  const bool inputs_form = ctx.opset >= 12;
  const bool has_ratio = inputs_form && ops::has_input(ctx, 1), has_mode = inputs_form && ops::has_input(ctx, 2);
  if (has_ratio && ctx.inputs[1].dtype != DType::Float32 && ctx.inputs[1].dtype != DType::Float64)
    ctx.fail("ratio must be float32 or float64, got " + dtype_name(ctx.inputs[1].dtype));
  const bool seeded = ctx.node.has_attr("seed");
  const uint64_t key = seeded ? splitmix64(static_cast<uint64_t>(ctx.node.attr_int("seed", 0)))
                              : (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  if (ctx.inputs[0].dtype == DType::Float64) return std::make_unique<DropoutKernel<double>>(has_ratio, has_mode, seeded, key);
  return std::make_unique<DropoutKernel<float>>(has_ratio, has_mode, seeded, key);
}

// ---- onnxtrain.DropoutMask (LoRA's adapter dropout) --------------------------------------------------------
// The CPU kernel's formula (executor/cpu/misc.cpp), one thread per element, the counter read on the device: a
// function of (seed, counter, element) alone, so both devices draw the same masks.

__global__ void dropout_mask_kernel(int64_t n, uint64_t key, double ratio, const int64_t* counter, bool* mask) {
  const uint64_t run = splitmix64(key ^ static_cast<uint64_t>(*counter));
  for (int64_t i = global_index(); i < n; i += grid_stride())
    mask[i] = static_cast<double>(splitmix64(run + static_cast<uint64_t>(i)) >> 11) * 0x1.0p-53 >= ratio;
}

class DropoutMaskKernel final : public Kernel {
 public:
  DropoutMaskKernel(uint64_t key, double ratio) : key_(key), ratio_(ratio) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const int64_t n = out[0]->numel();
    if (n == 0) return;
    dropout_mask_kernel<<<blocks_for(n), kBlock, 0, stream()>>>(n, key_, ratio_, in[1]->ptr<int64_t>(),
                                                                out[0]->ptr<bool>());
    check_launch("DropoutMask kernel");
  }

 private:
  uint64_t key_;
  double ratio_;
};

std::unique_ptr<Kernel> make_dropout_mask(PrepareContext& ctx, const KernelFactory& host) {
  host_prepare(ctx, host);  // the CPU factory checks the counter, ratio and seed and sets the output
  return std::make_unique<DropoutMaskKernel>(splitmix64(static_cast<uint64_t>(ctx.node.attr_int("seed", 0))),
                                             static_cast<double>(ctx.node.attr_float("ratio", 0.0f)));
}

}  // namespace

void register_cuda_misc(KernelRegistry& r) {
  twin(r, "Resize", make_resize);
  twin(r, "Einsum", make_einsum);
  twin(r, "Dropout", make_dropout);
  twin(r, "onnxtrain", "DropoutMask", make_dropout_mask);
}

}  // namespace onnxtrain::cuda
