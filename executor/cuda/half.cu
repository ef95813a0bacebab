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

// Called by unary.cu's Cast after the CPU factory validated the node (and rejected the unsupported half pairs):
// null when neither side is a half type.
std::unique_ptr<Kernel> make_half_cast(DType from, DType to) { return half_cast_kernel<HalfCastKernel>(from, to); }

}  // namespace onnxtrain::cuda
