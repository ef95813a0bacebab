// MatMul and Gemm on float16/bfloat16 tensors (mixed precision, docs/gpu.md). The CPU has no half-precision
// GEMM we can use portably, so this emulates one: the operands are widened to float32 (exactly), the float32
// kernel registered in matmul.cpp computes with float32 accumulation, and the result is rounded to the half
// type once, which is what a tensor-core GEMM with a float32 accumulator (cuBLAS CUBLAS_COMPUTE_32F) gives.
// Reusing the float32 def's factory keeps shape checks, broadcasting and the GEMM paths in one place.
#include <memory>
#include <vector>

#include "executor/half.h"
#include "executor/kernel.h"
#include "graph/error.h"

namespace onnxtrain {
namespace {

template <class ToFloat, class FromFloat> class HalfViaFloatKernel final : public Kernel {
 public:
  HalfViaFloatKernel(std::unique_ptr<Kernel> inner, std::vector<std::vector<int64_t>> in_shapes,
                     std::vector<int64_t> out_shape)
      : inner_(std::move(inner)), in_shapes_(std::move(in_shapes)), out_shape_(std::move(out_shape)) {}

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    // Buffers are made on first use: a CUDA twin runs this factory only to validate, and never runs it.
    if (in32_.empty()) {
      for (const auto& s : in_shapes_) in32_.push_back(Tensor::empty(DType::Float32, s));
      out32_ = Tensor::empty(DType::Float32, out_shape_);
    }
    std::vector<const Tensor*> ins(in.size(), nullptr);
    const ToFloat widen;
    for (size_t i = 0; i < in.size() && i < in32_.size(); ++i) {
      if (!in[i]) continue;
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
  std::vector<std::vector<int64_t>> in_shapes_;
  std::vector<int64_t> out_shape_;
  std::vector<Tensor> in32_;
  Tensor out32_;
};

// The half-precision factory around `f32`, the float32 def's factory for the same op.
KernelFactory half_factory(KernelFactory f32) {
  return [f32](PrepareContext& ctx) -> std::unique_ptr<Kernel> {
    const DType half = ctx.inputs.at(0).dtype;
    std::vector<std::vector<int64_t>> shapes;
    for (KernelInput& in : ctx.inputs) {
      if (in.present() && in.dtype != half)
        ctx.fail("input is " + dtype_name(in.dtype) + " but A is " + dtype_name(half) + " (all inputs must match)");
      shapes.push_back(in.shape);
      if (in.present()) in = KernelInput{DType::Float32, in.shape, nullptr};
    }
    std::unique_ptr<Kernel> inner = f32(ctx);
    for (KernelInput& in : ctx.inputs)
      if (in.present()) in.dtype = half;
    ctx.outputs.at(0).dtype = half;
    const std::vector<int64_t>& out = ctx.outputs[0].shape;
    if (half == DType::Float16)
      return std::make_unique<HalfViaFloatKernel<HalfToFloat, FloatToHalf>>(std::move(inner), shapes, out);
    return std::make_unique<HalfViaFloatKernel<BFloat16ToFloat, FloatToBFloat16>>(std::move(inner), shapes, out);
  };
}

}  // namespace

void register_cpu_half_matmul(KernelRegistry& r) {
  for (const char* op : {"MatMul", "Gemm"}) {
    const KernelDef* f32 = r.find("", op, 13, Device::CPU, DType::Float32);
    if (!f32) throw Error(std::string("half-precision ") + op + " registered before its float32 kernel");
    KernelDef def = *f32;
    def.dtypes = {DType::Float16, DType::BFloat16};
    def.factory = half_factory(f32->factory);
    r.add(std::move(def));
  }
}

}  // namespace onnxtrain
