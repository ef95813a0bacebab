// Dropout and onnxtrain.DropoutMask on the CPU (rule: gradients/rules/dropout.cpp; CUDA twins:
// executor/cuda/dropout.cu). Small loops; neither is hot enough to deserve a tuned path.
#include <algorithm>
#include <cstring>
#include <optional>
#include <random>

#include "executor/cpu/kernel_util.h"
#include "executor/kernel.h"
#include "executor/ops/dropout.h"
#include "graph/error.h"

namespace onnxtrain {
namespace {

using cpu::dispatch;
using cpu::fail_dtype;

// ---------------------------------------------------------------------------------------------------------
// Dropout. Inference (no training_mode, or false): y = x and an all-true mask. Training: the mask keeps an
// element when a uniform draw in [0, 1) is >= ratio, and kept elements are scaled by 1 / (1 - ratio).
// The draws are numpy's legacy `np.random.seed(seed); np.random.uniform(0, 1, shape)` (MT19937 and the
// 53-bit double from two 32-bit words), so a given seed reproduces the ONNX reference exactly. With a seed
// every run uses the same mask (so a step can be recomputed); without one the generator runs on.

template <class T> class DropoutKernel final : public Kernel {
 public:
  DropoutKernel(std::string where, std::optional<uint32_t> seed, bool has_ratio, bool has_mode, double fixed_ratio)
      : where_(std::move(where)), seed_(seed), has_ratio_(has_ratio), has_mode_(has_mode), fixed_ratio_(fixed_ratio) {
    if (!seed_) gen_.seed(std::random_device{}());
  }
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const T* x = in[0]->ptr<T>();
    T* y = out[0]->ptr<T>();
    bool* mask = out.size() > 1 && out[1] ? out[1]->ptr<bool>() : nullptr;
    const int64_t n = in[0]->numel();
    bool training = false;
    if (has_mode_ && in.size() > 2 && in[2]) training = *in[2]->ptr<bool>();
    double ratio = fixed_ratio_;
    if (has_ratio_ && in.size() > 1 && in[1]) {
      const Tensor& r = *in[1];
      if (r.numel() != 1) fail(where_, "ratio must be a scalar, got " + r.describe());
      if (r.dtype == DType::Float32) ratio = *r.ptr<float>();
      else if (r.dtype == DType::Float64) ratio = *r.ptr<double>();
      else fail(where_, "ratio must be float32 or float64, got " + dtype_name(r.dtype));
    }
    if (!training || ratio == 0.0) {
      if (y != x) std::memcpy(y, x, static_cast<size_t>(n) * sizeof(T));
      if (mask) std::fill(mask, mask + n, true);
      return;
    }
    if (!(ratio >= 0.0 && ratio < 1.0)) fail(where_, "ratio must be in [0, 1) in training mode, got " + std::to_string(ratio));
    if (seed_) gen_.seed(*seed_);
    const T scale = static_cast<T>(1.0 / (1.0 - ratio));
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t a = static_cast<uint32_t>(gen_()) >> 5, b = static_cast<uint32_t>(gen_()) >> 6;
      const double u = (a * 67108864.0 + b) / 9007199254740992.0;
      const bool keep = u >= ratio;
      y[i] = keep ? x[i] * scale : T(0);
      if (mask) mask[i] = keep;
    }
  }

 private:
  std::string where_;
  std::optional<uint32_t> seed_;
  bool has_ratio_, has_mode_;
  double fixed_ratio_;
  std::mt19937 gen_;
};

std::unique_ptr<Kernel> make_dropout(PrepareContext& ctx) {
  const ops::DropoutAttrs a = ops::prepare_dropout(ctx);
  const KernelInput& x = ctx.inputs[0];
  std::unique_ptr<Kernel> k;
  dispatch<float, double>(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    k = std::make_unique<DropoutKernel<T>>(ctx.node.describe(), a.seed, a.has_ratio, a.has_mode, a.fixed_ratio);
  });
  if (!k) fail_dtype(ctx);
  return k;
}

// ---------------------------------------------------------------------------------------------------------
// onnxtrain.DropoutMask(x, counter) -> mask: bool, x's shape; attributes ratio (float) and seed (int). The
// training graph's LoRA dropout (training/adapters.h add_lora_dropout) draws its masks here. A counter-based
// stream, so a mask is a function of (seed, counter, element) alone: the session advances the int64 scalar
// counter once per training step and checkpoints it, which makes a resumed run draw the masks a straight one
// draws. With splitmix64 (Steele et al., as java.util.SplittableRandom):
//   run = splitmix64(splitmix64(seed) ^ counter),  u_i = (splitmix64(run + i) >> 11) * 2^-53,  keep_i = u_i >= ratio

uint64_t splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

class DropoutMaskKernel final : public Kernel {
 public:
  DropoutMaskKernel(uint64_t key, double ratio) : key_(key), ratio_(ratio) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const uint64_t run = splitmix64(key_ ^ static_cast<uint64_t>(*in[1]->ptr<int64_t>()));
    bool* mask = out[0]->ptr<bool>();
    const int64_t n = out[0]->numel();
    for (int64_t i = 0; i < n; ++i)
      mask[i] = static_cast<double>(splitmix64(run + static_cast<uint64_t>(i)) >> 11) * 0x1.0p-53 >= ratio_;
  }

 private:
  uint64_t key_;
  double ratio_;
};

std::unique_ptr<Kernel> make_dropout_mask(PrepareContext& ctx) {
  const ops::DropoutMaskAttrs a = ops::prepare_dropout_mask(ctx);
  return std::make_unique<DropoutMaskKernel>(splitmix64(a.seed), a.ratio);
}

}  // namespace

void register_cpu_dropout(KernelRegistry& r) {
  cpu::add(r, "Dropout", 7, {DType::Float32, DType::Float64}, make_dropout);
  cpu::add(r, "onnxtrain", "DropoutMask", 1, {DType::Float32, DType::Float64}, make_dropout_mask);
}

}  // namespace onnxtrain
