// Fused backward kernels of the "onnxtrain" domain. Each maps (dY, Y) to dX from the forward op's output, in
// one pass instead of the 2-3 elementwise nodes of their ONNX function bodies; the maths is shared with a
// future CUDA backend through executor/functors.h.
#include <memory>

#include "executor/broadcast.h"
#include "executor/cpu/kernel_util.h"
#include "executor/functors.h"
#include "executor/kernel.h"

namespace onnxtrain {
namespace {

using cpu::kCheapGrain;

template <class Op, class T> class GradKernel final : public Kernel {
 public:
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const T* dy = in[0]->ptr<T>();
    const T* y = in[1]->ptr<T>();
    T* dx = out[0]->ptr<T>();
    const Op op;
    parallel_chunks(out[0]->numel(), kCheapGrain, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) dx[i] = op(dy[i], y[i]);
    });
  }
};

template <class Op> std::unique_ptr<Kernel> make_grad(PrepareContext& ctx) {
  cpu::expect_grad_inputs(ctx);
  const KernelInput& dy = ctx.inputs[0];
  cpu::set_output(ctx, 0, dy.dtype, dy.shape);
  if (dy.dtype == DType::Float32) return std::make_unique<GradKernel<Op, float>>();
  if (dy.dtype == DType::Float64) return std::make_unique<GradKernel<Op, double>>();
  ctx.fail("unsupported dtype " + dtype_name(dy.dtype) + " (float32, float64)");
}

}  // namespace

void register_cpu_fused_grad(KernelRegistry& r) {
  const std::vector<DType> flt = {DType::Float32, DType::Float64};
  cpu::add(r, "onnxtrain", "ReluGrad", 1, flt, make_grad<ReluGradOp>);
  cpu::add(r, "onnxtrain", "SigmoidGrad", 1, flt, make_grad<SigmoidGradOp>);
  cpu::add(r, "onnxtrain", "TanhGrad", 1, flt, make_grad<TanhGradOp>);
}

}  // namespace onnxtrain
