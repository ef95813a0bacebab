// Dropout and onnxtrain.DropoutMask on CUDA (CPU kernels: executor/cpu/dropout.cpp; rule:
// gradients/rules/dropout.cpp).
//
// Dropout draws from a counter-based stream of its own (a splitmix64 hash of seed, run and element), not the
// CPU's sequential MT19937 stream, so masks differ between the devices; see docs/gpu.md. DropoutMask (LoRA's
// adapter dropout) is counter-based on both devices, with the same formula: the same masks.
#include <algorithm>
#include <memory>
#include <random>

#include "executor/cuda/common.h"
#include "executor/ops/dropout.h"
#include "executor/cuda/device_util.cuh"
#include "graph/error.h"

namespace onnxtrain::cuda {
namespace {

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

std::unique_ptr<Kernel> make_dropout(PrepareContext& ctx) {
  // Before opset 12 the op layer accepts only is_test=1: no training mode input, so always the identity.
  const ops::DropoutAttrs a = ops::prepare_dropout(ctx);
  const bool has_ratio = a.has_ratio, has_mode = a.has_mode;
  if (has_ratio && ctx.inputs[1].dtype != DType::Float32 && ctx.inputs[1].dtype != DType::Float64)
    ctx.fail("ratio must be float32 or float64, got " + dtype_name(ctx.inputs[1].dtype));
  const bool seeded = a.seed.has_value();
  const uint64_t key = seeded ? splitmix64(static_cast<uint64_t>(*a.seed))
                              : (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  if (ctx.inputs[0].dtype == DType::Float64) return std::make_unique<DropoutKernel<double>>(has_ratio, has_mode, seeded, key);
  return std::make_unique<DropoutKernel<float>>(has_ratio, has_mode, seeded, key);
}

// ---- onnxtrain.DropoutMask (LoRA's adapter dropout) --------------------------------------------------------
// The CPU kernel's formula (executor/cpu/dropout.cpp), one thread per element, the counter read on the device: a
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

std::unique_ptr<Kernel> make_dropout_mask(PrepareContext& ctx) {
  const ops::DropoutMaskAttrs a = ops::prepare_dropout_mask(ctx);  // the counter, ratio and seed; the output
  return std::make_unique<DropoutMaskKernel>(splitmix64(a.seed), a.ratio);
}

}  // namespace

void register_cuda_dropout(KernelRegistry& r) {
  twin(r, "Dropout", make_dropout);
  twin(r, "onnxtrain", "DropoutMask", make_dropout_mask);
}

}  // namespace onnxtrain::cuda
