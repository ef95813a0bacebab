// MatMul, Gemm and ReduceSum on float16/bfloat16 tensors (mixed precision, docs/gpu.md). The CPU has no half-precision
// GEMM we can use portably, so this emulates one: the operands are widened to float32 (exactly), the float32
// kernel registered in matmul.cpp computes with float32 accumulation, and the result is rounded to the half
// type once, which is what a tensor-core GEMM with a float32 accumulator (cuBLAS CUBLAS_COMPUTE_32F) gives.
// Reusing the float32 def's factory keeps shape checks, broadcasting and the GEMM paths in one place.
#include <algorithm>
#include <memory>
#include <optional>
#include <vector>

#include "executor/half.h"
#include "executor/kernel.h"
#include "graph/error.h"

namespace onnxtrain {
namespace {

template <class ToFloat, class FromFloat> class HalfViaFloatKernel final : public Kernel {
 public:
  // in_shapes[i] is empty-optional for inputs passed through as they are (absent ones, ReduceSum's axes).
  HalfViaFloatKernel(std::unique_ptr<Kernel> inner, std::vector<std::optional<std::vector<int64_t>>> in_shapes,
                     std::vector<int64_t> out_shape)
      : inner_(std::move(inner)), in_shapes_(std::move(in_shapes)), out_shape_(std::move(out_shape)) {}

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    // Buffers are made on first use: a CUDA twin runs this factory only to validate, and never runs it.
    if (in32_.empty()) {
      for (const auto& s : in_shapes_) in32_.push_back(s ? Tensor::empty(DType::Float32, *s) : Tensor{});
      out32_ = Tensor::empty(DType::Float32, out_shape_);
    }
    std::vector<const Tensor*> ins(in.begin(), in.end());
    const ToFloat widen;
    for (size_t i = 0; i < in.size() && i < in32_.size(); ++i) {
      if (!in[i] || !in_shapes_[i]) continue;
      const uint16_t* x = in[i]->ptr<uint16_t>();
      float* w = in32_[i].ptr<float>();
      for (int64_t j = 0, n = in[i]->numel(); j < n; ++j) w[j] = widen(x[j]);
      ins[i] = &in32_[i];
    }
    Tensor* outs[] = {&out32_};
    inner_->run(ins, outs);
    const FromFloat round;
    const float* y32 = out32_.ptr<float>();
    uint16_t* y = out[0]->ptr<uint16_t>();
    for (int64_t j = 0, n = out[0]->numel(); j < n; ++j) y[j] = round(y32[j]);
  }

 private:
  std::unique_ptr<Kernel> inner_;
  std::vector<std::optional<std::vector<int64_t>>> in_shapes_;
  std::vector<int64_t> out_shape_;
  std::vector<Tensor> in32_;
  Tensor out32_;
};

// The half-precision factory around `f32`, the float32 def's factory for the same op. Inputs of input 0's half
// type are widened; other float inputs are an error; the rest (integer axes) pass through.
KernelFactory half_factory(KernelFactory f32) {
  return [f32](PrepareContext& ctx) -> std::unique_ptr<Kernel> {
    const DType half = ctx.inputs.at(0).dtype;
    std::vector<std::optional<std::vector<int64_t>>> shapes;
    for (size_t i = 0; i < ctx.inputs.size(); ++i) {
      KernelInput& in = ctx.inputs[i];
      if (in.dtype != half && is_floating(in.dtype))
        ctx.fail("input " + std::to_string(i) + " is " + dtype_name(in.dtype) + " but input 0 is " + dtype_name(half) +
                 " (they must match)");
      shapes.push_back(in.dtype == half ? std::optional(in.shape) : std::nullopt);
      if (in.dtype == half) in = KernelInput{DType::Float32, in.shape, nullptr};
    }
    std::unique_ptr<Kernel> inner = f32(ctx);
    for (size_t i = 0; i < ctx.inputs.size(); ++i)
      if (shapes[i]) ctx.inputs[i].dtype = half;
    ctx.outputs.at(0).dtype = half;
    const std::vector<int64_t>& out = ctx.outputs[0].shape;
    if (half == DType::Float16)
      return std::make_unique<HalfViaFloatKernel<HalfToFloat, FloatToHalf>>(std::move(inner), shapes, out);
    return std::make_unique<HalfViaFloatKernel<BFloat16ToFloat, FloatToBFloat16>>(std::move(inner), shapes, out);
  };
}

}  // namespace

void register_cpu_half_matmul(KernelRegistry& r) {
  // ReduceSum is here because the gradient of a half Gemm's broadcast bias sums the half output gradient.
  for (const char* op : {"MatMul", "Gemm", "ReduceSum"}) {
    std::vector<KernelDef> halves;
    for (const KernelDef& d : r.all())
      if (d.device == Device::CPU && d.domain.empty() && d.op_type == op &&
          std::find(d.dtypes.begin(), d.dtypes.end(), DType::Float32) != d.dtypes.end()) {
        KernelDef h = d;
        h.dtypes = {DType::Float16, DType::BFloat16};
        h.factory = half_factory(d.factory);
        halves.push_back(std::move(h));
      }
    if (halves.empty()) throw Error(std::string("half-precision ") + op + " registered before its float32 kernel");
    for (KernelDef& h : halves) r.add(std::move(h));
  }
}

}  // namespace onnxtrain
