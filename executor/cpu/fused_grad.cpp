// Fused backward kernels of the "onnxtrain" domain. Each maps (dY, Y) to dX from the forward op's output, in
// one pass instead of the 2-3 elementwise nodes of their ONNX function bodies; the maths is shared with a
// future CUDA backend through executor/functors.h.
#include <memory>

#include "executor/broadcast.h"
#include "executor/functors.h"
#include "executor/kernel.h"

namespace onnxtrain {
namespace {

constexpr int64_t kGrain = 1 << 15;

template <class Op, class T> class GradKernel final : public Kernel {
 public:
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const T* dy = in[0]->ptr<T>();
    const T* y = in[1]->ptr<T>();
    T* dx = out[0]->ptr<T>();
    const Op op;
    parallel_chunks(out[0]->numel(), kGrain, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) dx[i] = op(dy[i], y[i]);
    });
  }
};

template <class Op> std::unique_ptr<Kernel> make_grad(PrepareContext& ctx) {
  if (ctx.inputs.size() != 2 || !ctx.inputs[0].present() || !ctx.inputs[1].present())
    ctx.fail("expected 2 inputs (dY, Y), got " + std::to_string(ctx.inputs.size()));
  if (ctx.outputs.size() != 1) ctx.fail("expected 1 output (dX), got " + std::to_string(ctx.outputs.size()));
  const KernelInput& dy = ctx.inputs[0];
  const KernelInput& y = ctx.inputs[1];
  if (dy.dtype != y.dtype)
    ctx.fail("dY and Y must have the same dtype, got " + dtype_name(dy.dtype) + " and " + dtype_name(y.dtype));
  if (dy.shape != y.shape)
    ctx.fail("dY and Y must have the same shape, got " + shape_string(dy.shape) + " and " + shape_string(y.shape));
  ctx.outputs[0].dtype = dy.dtype;
  ctx.outputs[0].shape = dy.shape;
  if (dy.dtype == DType::Float32) return std::make_unique<GradKernel<Op, float>>();
  if (dy.dtype == DType::Float64) return std::make_unique<GradKernel<Op, double>>();
  ctx.fail("unsupported dtype " + dtype_name(dy.dtype) + " (float32, float64)");
}

void add(KernelRegistry& r, const std::string& op, KernelFactory f) {
  KernelDef d;
  d.domain = "onnxtrain";
  d.op_type = op;
  d.since_version = 1;
  d.dtypes = {DType::Float32, DType::Float64};
  d.factory = std::move(f);
  r.add(std::move(d));
}

}  // namespace

void register_cpu_fused_grad(KernelRegistry& r) {
  add(r, "ReluGrad", make_grad<ReluGradOp>);
  add(r, "SigmoidGrad", make_grad<SigmoidGradOp>);
  add(r, "TanhGrad", make_grad<TanhGradOp>);
}

}  // namespace onnxtrain
