// float32 <-> float16/bfloat16 casts on CUDA: the twins of executor/cpu/half.cpp, rounding with the same
// functors (executor/half.h), so the CPU tests of those functors cover this file's maths.
#include <memory>

#include "executor/cuda/common.h"
#include "executor/cuda/device_util.cuh"
#include "executor/half.h"

namespace onnxtrain::cuda {

namespace {

template <class Op, class TI, class TO> __global__ void half_cast_kernel(int64_t n, const TI* x, TO* y) {
  const Op op;
  for (int64_t i = global_index(); i < n; i += grid_stride()) y[i] = op(x[i]);
}

template <class Op, class TI, class TO> class HalfCastKernel final : public Kernel {
 public:
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const int64_t n = out[0]->numel();
    if (n == 0) return;
    half_cast_kernel<Op, TI, TO><<<blocks_for(n), kBlock, 0, stream()>>>(n, static_cast<const TI*>(in[0]->data),
                                                                         static_cast<TO*>(out[0]->data));
    check_launch("half-precision Cast kernel");
  }
};

}  // namespace

// Called by unary.cu's Cast after the CPU factory validated the node: null when neither side is a half type.
std::unique_ptr<Kernel> make_half_cast(DType from, DType to) {
  const bool half_from = from == DType::Float16 || from == DType::BFloat16;
  const bool half_to = to == DType::Float16 || to == DType::BFloat16;
  if (!half_from && !half_to) return nullptr;
  if (from == DType::Float32 && to == DType::Float16) return std::make_unique<HalfCastKernel<FloatToHalf, float, uint16_t>>();
  if (from == DType::Float16 && to == DType::Float32) return std::make_unique<HalfCastKernel<HalfToFloat, uint16_t, float>>();
  if (from == DType::Float32 && to == DType::BFloat16)
    return std::make_unique<HalfCastKernel<FloatToBFloat16, float, uint16_t>>();
  if (from == DType::BFloat16 && to == DType::Float32)
    return std::make_unique<HalfCastKernel<BFloat16ToFloat, uint16_t, float>>();
  return nullptr;  // unreachable: the CPU factory rejected every other pair
}

}  // namespace onnxtrain::cuda
