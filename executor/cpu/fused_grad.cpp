// Fused backward kernels of the "onnxtrain" domain. Each maps (dY, Y) to dX from the forward op's output (the
// GELU ones from its input X), in one pass instead of the 3-15 elementwise nodes of their ONNX function bodies;
// the Relu/Sigmoid/Tanh maths is shared with a future CUDA backend through executor/functors.h.
// GCC 12 warns falsely inside its AVX-512 intrinsics when Eigen vectorises (as in unary.cpp).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <cmath>
#include <memory>
#include <numbers>

#include "executor/broadcast.h"
#include "executor/cpu/eigen_map.h"
#include "executor/cpu/kernel_util.h"
#include "executor/functors.h"
#include "executor/kernel.h"

namespace onnxtrain {
namespace {

using cpu::kCheapGrain;

// GELU's derivative from its input x, for GeluGrad (exact, erf) and GeluTanhGrad (tanh approximation): the
// formulas of executor/functors.h as Eigen array expressions, one vectorised pass (GCC does not vectorise
// std::erf/exp/tanh, so a scalar loop loses to the function body's chain of vectorised kernels).
using GeluGradOp = cpu::EigenFormula<GeluErfGradFn>;
using GeluTanhGradOp = cpu::EigenFormula<GeluTanhGradFn>;

template <class Op, class T> class EigenGradKernel final : public Kernel {
 public:
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const T* dy = in[0]->ptr<T>();
    const T* x = in[1]->ptr<T>();
    T* dx = out[0]->ptr<T>();
    parallel_chunks(out[0]->numel(), cpu::kCostlyGrain, [&](int64_t s, int64_t e) {
      using A = Eigen::Array<T, Eigen::Dynamic, 1>;
      Eigen::Map<const A> dys(dy + s, e - s), xs(x + s, e - s);
      Eigen::Map<A>(dx + s, e - s) = Op::eval(dys, xs);
    });
  }
};


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

template <class Op, template <class, class> class K = GradKernel> std::unique_ptr<Kernel> make_grad(PrepareContext& ctx) {
  cpu::expect_grad_inputs(ctx);
  const KernelInput& dy = ctx.inputs[0];
  cpu::set_output(ctx, 0, dy.dtype, dy.shape);
  if (dy.dtype == DType::Float32) return std::make_unique<K<Op, float>>();
  if (dy.dtype == DType::Float64) return std::make_unique<K<Op, double>>();
  ctx.fail("unsupported dtype " + dtype_name(dy.dtype) + " (float32, float64)");
}

}  // namespace

void register_cpu_fused_grad(KernelRegistry& r) {
  const std::vector<DType> flt = {DType::Float32, DType::Float64};
  cpu::add(r, "onnxtrain", "ReluGrad", 1, flt, make_grad<ReluGradOp>);
  cpu::add(r, "onnxtrain", "SigmoidGrad", 1, flt, make_grad<SigmoidGradOp>);
  cpu::add(r, "onnxtrain", "TanhGrad", 1, flt, make_grad<TanhGradOp>);
  cpu::add(r, "onnxtrain", "GeluGrad", 1, flt, make_grad<GeluGradOp, EigenGradKernel>);
  cpu::add(r, "onnxtrain", "GeluTanhGrad", 1, flt, make_grad<GeluTanhGradOp, EigenGradKernel>);
}

}  // namespace onnxtrain
