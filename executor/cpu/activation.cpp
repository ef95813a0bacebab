// Activation kernels on the CPU (rules: gradients/rules/activation.cpp; CUDA: executor/cuda/activation.cu): flat
// loops over the shared functors in executor/functors.h (so the CUDA twins reuse the maths the node tests check
// here), plus PRelu (its slope broadcasts onto the input), Hardmax (a one-hot of the first maximum along an axis)
// and Gelu's fused gradients GeluGrad and GeluTanhGrad.
// GCC 12 warns falsely inside its AVX-512 intrinsics when Eigen vectorises the GELU gradients.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <algorithm>
#include <memory>
#include <string>

#include "executor/broadcast.h"
#include "executor/cpu/eigen_map.h"
#include "executor/cpu/kernel_util.h"
#include "executor/functor_attrs.h"
#include "executor/kernel.h"
#include "executor/ops/activation.h"
#include "executor/ops/unary.h"

namespace onnxtrain {
namespace {

using cpu::add;
using cpu::dispatch;
using cpu::fail_dtype;
using cpu::kCheapGrain;
using cpu::kCostlyGrain;

template <class Op, class T> class MapKernel final : public Kernel {
 public:
  MapKernel(Op op, int64_t grain) : op_(op), grain_(grain) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const T* x = in[0]->ptr<T>();
    T* y = out[0]->ptr<T>();
    parallel_chunks(out[0]->numel(), grain_, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) y[i] = op_(x[i]);
    });
  }

 private:
  Op op_;
  int64_t grain_;
};

// The factories below check the node and build the functor through the op layer (executor/ops/activation.h)
// first; these only pick the kernel.
template <class Op> std::unique_ptr<Kernel> float_map(PrepareContext& ctx, Op op, int64_t grain) {
  const DType t = ctx.inputs[0].dtype;
  std::unique_ptr<Kernel> k;
  dispatch<float, double>(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    k = std::make_unique<MapKernel<Op, T>>(op, grain);
  });
  if (!k) fail_dtype(ctx);
  return k;
}

// Vectorised through Eigen (executor/cpu/eigen_map.h); the functor of the same name is the tests' reference.
template <class Op> std::unique_ptr<Kernel> eigen_map(PrepareContext& ctx) {
  const DType t = ctx.inputs[0].dtype;
  if (t == DType::Float32) return std::make_unique<cpu::EigenMapKernel<Op, float>>(kCostlyGrain);
  if (t == DType::Float64) return std::make_unique<cpu::EigenMapKernel<Op, double>>(kCostlyGrain);
  fail_dtype(ctx);
}

// An op without attributes.
template <class Op> KernelFactory plain(int64_t grain) {
  return [grain](PrepareContext& ctx) { return float_map(ctx, ops::prepare_activation_op<Op>(ctx), grain); };
}

std::unique_ptr<Kernel> make_selu(PrepareContext& ctx) {
  return float_map(ctx, ops::prepare_selu(ctx), kCostlyGrain);
}

std::unique_ptr<Kernel> make_celu(PrepareContext& ctx) {
  return float_map(ctx, ops::prepare_celu(ctx), kCostlyGrain);
}

std::unique_ptr<Kernel> make_gelu(PrepareContext& ctx) {
  if (ops::prepare_gelu(ctx).tanh) return eigen_map<cpu::EigenGeluTanh>(ctx);
  return eigen_map<cpu::EigenGelu>(ctx);
}

std::unique_ptr<Kernel> make_hard_sigmoid(PrepareContext& ctx) {
  return float_map(ctx, ops::prepare_hard_sigmoid(ctx), kCheapGrain);
}

std::unique_ptr<Kernel> make_thresholded_relu(PrepareContext& ctx) {
  return float_map(ctx, ops::prepare_thresholded_relu(ctx), kCheapGrain);
}

// ---- Shrink: y = x - bias above lambd, x + bias below -lambd, 0 between ---------------------------------------

struct ShrinkOp {
  float lambd, bias;
  template <class T> T operator()(T x) const {
    const T l = static_cast<T>(lambd), b = static_cast<T>(bias);
    return x < -l ? x + b : (x > l ? x - b : T(0));
  }
};

std::unique_ptr<Kernel> make_shrink(PrepareContext& ctx) {
  // ONNX also allows integer inputs; only float32/float64 are registered (the dtypes training uses).
  const ShrinkOp op{ctx.node.attr_float("lambd", 0.5f), ctx.node.attr_float("bias", 0.0f)};
  ops::prepare_activation(ctx);
  return float_map(ctx, op, kCheapGrain);
}

// ---- PRelu: y = x < 0 ? slope * x : x, slope broadcast (unidirectionally, opset 7+) onto x --------------------

template <class T> class PReluKernel final : public Kernel {
 public:
  explicit PReluKernel(BroadcastPlan p) : plan_(std::move(p)) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const T* x = in[0]->ptr<T>();
    const T* s = in[1]->ptr<T>();
    T* y = out[0]->ptr<T>();
    const PReluOp op;
    const int64_t ss = plan_.inner_stride(1);
    for_each_broadcast_row<2>(plan_, kCheapGrain, [&](int64_t o, const std::array<int64_t, 2>& off, int64_t n) {
      // x is the output's shape, so its runs are contiguous; the slope's are contiguous, repeated or strided.
      const T* xr = x + off[0];
      const T* sr = s + off[1];
      T* yr = y + o;
      if (ss == 0) {
        const T v = *sr;
        for (int64_t k = 0; k < n; ++k) yr[k] = op(xr[k], v);
      } else {
        for (int64_t k = 0; k < n; ++k) yr[k] = op(xr[k], sr[k * ss]);
      }
    });
  }

 private:
  BroadcastPlan plan_;
};

std::unique_ptr<Kernel> make_prelu(PrepareContext& ctx) {
  ops::prepare_prelu(ctx);
  const KernelInput& x = ctx.inputs[0];
  const std::vector<std::vector<int64_t>> shapes = {x.shape, ctx.inputs[1].shape};
  BroadcastPlan plan = plan_broadcast(shapes, x.shape);
  std::unique_ptr<Kernel> k;
  dispatch<float, double>(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    k = std::make_unique<PReluKernel<T>>(std::move(plan));
  });
  if (!k) fail_dtype(ctx);
  return k;
}

// ---- Hardmax: 1 at the first maximum of each lane along the axis, 0 elsewhere ------------------------------
// The lanes (which axis, how opsets before 13 coerce the input to 2-D) are ops::prepare_hardmax's.

template <class T> class HardmaxKernel final : public Kernel {
 public:
  HardmaxKernel(int64_t outer, int64_t len, int64_t inner) : outer_(outer), len_(len), inner_(inner) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const T* x = in[0]->ptr<T>();
    T* y = out[0]->ptr<T>();
    const int64_t len = len_, inner = inner_;
    std::fill(y, y + outer_ * len * inner, T(0));
    if (len == 0) return;
    parallel_chunks(outer_ * inner, kCheapGrain / std::max<int64_t>(len, 1) + 1, [&](int64_t s, int64_t e) {
      for (int64_t lane = s; lane < e; ++lane) {
        const int64_t base = (lane / inner) * len * inner + lane % inner;
        int64_t best = 0;
        for (int64_t j = 1; j < len; ++j)
          if (x[base + j * inner] > x[base + best * inner]) best = j;
        y[base + best * inner] = T(1);
      }
    });
  }

 private:
  int64_t outer_, len_, inner_;
};

std::unique_ptr<Kernel> make_hardmax(PrepareContext& ctx) {
  const ops::HardmaxLanes l = ops::prepare_hardmax(ctx);
  std::unique_ptr<Kernel> k;
  dispatch<float, double>(ctx.inputs[0].dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    k = std::make_unique<HardmaxKernel<T>>(l.outer, l.len, l.inner);
  });
  if (!k) fail_dtype(ctx);
  return k;
}

// ---- GeluGrad, GeluTanhGrad: (dY, X) -> dX ----------------------------------------------------------------
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

template <class Op> std::unique_ptr<Kernel> make_gelu_grad(PrepareContext& ctx) {
  ops::prepare_fused_grad(ctx);
  const KernelInput& dy = ctx.inputs[0];
  if (dy.dtype == DType::Float32) return std::make_unique<EigenGradKernel<Op, float>>();
  if (dy.dtype == DType::Float64) return std::make_unique<EigenGradKernel<Op, double>>();
  ctx.fail("unsupported dtype " + dtype_name(dy.dtype) + " (float32, float64)");
}

}  // namespace

void register_cpu_activation(KernelRegistry& r) {
  const std::vector<DType> flt = {DType::Float32, DType::Float64};
  // Opset 6 dropped the legacy consumed_inputs of Selu/HardSigmoid.
  add(r, "Selu", 6, flt, make_selu);
  add(r, "Celu", 12, flt, make_celu);
  add(r, "Gelu", 20, flt, make_gelu);
  add(r, "HardSigmoid", 6, flt, make_hard_sigmoid);
  add(r, "HardSwish", 14, flt, plain<HardSwishOp>(kCheapGrain));
  add(r, "Softsign", 1, flt, plain<SoftsignOp>(kCheapGrain));
  add(r, "Mish", 18, flt, plain<MishOp>(kCostlyGrain));
  add(r, "ThresholdedRelu", 10, flt, make_thresholded_relu);
  add(r, "PRelu", 7, flt, make_prelu);
  add(r, "Hardmax", 1, flt, make_hardmax);
  add(r, "Shrink", 9, flt, make_shrink);
  // Gelu's fused gradients (emitted by its rule, gradients/rules/activation.cpp), beside the forward kernel.
  add(r, "onnxtrain", "GeluGrad", 1, flt, make_gelu_grad<GeluGradOp>);
  add(r, "onnxtrain", "GeluTanhGrad", 1, flt, make_gelu_grad<GeluTanhGradOp>);
}

}  // namespace onnxtrain
