// Fused backward kernels of the "onnxtrain" domain. Each maps (dY, Y) to dX from the forward op's output (the
// GELU ones from its input X), in one pass instead of the 3-15 elementwise nodes of their ONNX function bodies;
// the Relu/Sigmoid/Tanh maths is shared with a future CUDA backend through executor/functors.h.
// GCC 12 warns falsely inside its AVX-512 intrinsics when Eigen vectorises (as in unary.cpp).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <Eigen/Core>
#include <unsupported/Eigen/SpecialFunctions>
#include <cmath>
#include <memory>
#include <numbers>

#include "executor/broadcast.h"
#include "executor/cpu/kernel_util.h"
#include "executor/functors.h"
#include "executor/kernel.h"

namespace onnxtrain {
namespace {

using cpu::kCheapGrain;

// GELU's derivative from its input x, for GeluGrad (exact, erf) and GeluTanhGrad (tanh approximation):
//   erf:  Phi(x) + x phi(x)
//   tanh: (1 + t)/2 + x/2 (1 - t^2) k (1 + 3c x^2),  t = tanh(k (x + c x^3)), k = sqrt(2/pi), c = 0.044715
// As Eigen array expressions: one vectorised pass (GCC does not vectorise std::erf/exp/tanh, so a scalar loop
// loses to the function body's chain of vectorised kernels).
struct GeluGradOp {
  template <class A, class T = typename A::Scalar> static auto eval(const A& dy, const A& x) {
    const T rsqrt2 = T(std::numbers::sqrt2 / 2), rsqrt2pi = T(1 / std::sqrt(2 * std::numbers::pi));
    return dy * (T(0.5) * (T(1) + (x * rsqrt2).erf()) + x * ((T(-0.5) * x.square()).exp() * rsqrt2pi));
  }
};
struct GeluTanhGradOp {
  template <class A, class T = typename A::Scalar> static auto eval(const A& dy, const A& x) {
    const T k = T(std::sqrt(2 / std::numbers::pi)), c = T(0.044715);
    const auto t = (k * (x + c * x.square() * x)).tanh();
    return dy * (T(0.5) * (T(1) + t) + T(0.5) * k * x * (T(1) - t.square()) * (T(1) + T(3) * c * x.square()));
  }
};

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
