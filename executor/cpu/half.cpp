// float32 <-> float16/bfloat16 casts on the CPU. Mixed precision (training/mixed_precision.h) emits them
// around the compute-heavy ops; the conversion maths is shared with the CUDA twins (executor/half.h).
#include "executor/cpu/half.h"

#include "executor/broadcast.h"
#include "executor/cpu/kernel_util.h"
#include "executor/half.h"

namespace onnxtrain::cpu {

namespace {

template <class Op, class TI, class TO> class HalfCastKernel final : public Kernel {
 public:
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const TI* x = static_cast<const TI*>(in[0]->data);
    TO* y = static_cast<TO*>(out[0]->data);
    parallel_chunks(out[0]->numel(), kCheapGrain, [&](int64_t s, int64_t e) {
      const Op op;
      for (int64_t i = s; i < e; ++i) y[i] = op(x[i]);
    });
  }
};

bool is_half(DType t) { return t == DType::Float16 || t == DType::BFloat16; }

}  // namespace

std::unique_ptr<Kernel> make_half_cast(PrepareContext& ctx, DType from, DType to) {
  if (!is_half(from) && !is_half(to)) return nullptr;
  if (from == to) return std::make_unique<CopyKernel>();
  if (auto k = half_cast_kernel<HalfCastKernel>(from, to)) return k;
  ctx.fail("casting " + dtype_name(from) + " to " + dtype_name(to) +
           " is not supported (float16 and bfloat16 cast only to and from float32)");
}

}  // namespace onnxtrain::cpu
