#pragma once
// The elementwise launch templates the unary (unary.cu), activation (activation.cu) and elementwise
// (elementwise.cu) families share: a one-input map, the fused (dY, Y) -> dX gradients, and a two-input map with
// broadcasting. Each factory checks the node and sets its output through the op layer (executor/ops/unary.h,
// ops/activation.h, ops/elementwise.h), as the CPU factory does; the maths is executor/functors.h.
#include <memory>
#include <utility>
#include <vector>

#include "executor/broadcast.h"
#include "executor/cuda/common.h"
#include "executor/cuda/device_util.cuh"
#include "executor/ops/unary.h"

namespace onnxtrain::cuda {

// ---- one input: y = op(x) ----------------------------------------------------------------------------------

template <class Op, class TI, class TO> __global__ void unary_kernel(int64_t n, const TI* x, TO* y, Op op) {
  for (int64_t i = global_index(); i < n; i += grid_stride()) y[i] = op(x[i]);
}

template <class Op, class TI, class TO> class UnaryKernel final : public Kernel {
 public:
  explicit UnaryKernel(Op op) : op_(op) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const int64_t n = out[0]->numel();
    if (n == 0) return;
    unary_kernel<<<blocks_for(n), kBlock, 0, stream()>>>(n, in[0]->ptr<TI>(), out[0]->ptr<TO>(), op_);
    check_launch("unary elementwise kernel");
  }

 private:
  Op op_;
};

// The kernel of y = op(x) over the dtypes Ts, for a node the op layer has checked.
template <class Op, class... Ts> std::unique_ptr<Kernel> make_unary(const PrepareContext& ctx, const Op& op) {
  std::unique_ptr<Kernel> k;
  dispatch<Ts...>(ctx.inputs[0].dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    k = std::make_unique<UnaryKernel<Op, T, T>>(op);
  });
  if (!k) ops::fail_dtype(ctx);
  return k;
}

// `prepare` is the op layer's: it checks the node, sets its output and builds the functor (the unary and the
// activation families check their inputs differently, so each names its own).
template <class Op, class... Ts> KernelFactory unary(Op (*prepare)(PrepareContext&)) {
  return [prepare](PrepareContext& ctx) -> std::unique_ptr<Kernel> { return make_unary<Op, Ts...>(ctx, prepare(ctx)); };
}

template <class Op> KernelFactory floats(Op (*prepare)(PrepareContext&)) { return unary<Op, float, double>(prepare); }

// ---- fused gradients ------------------------------------------------------------------------------------

// Fused gradients: (dY, Y) -> dX (the GELU ones take X in Y's place), same shapes (ops::prepare_fused_grad).
template <class Op, class T> __global__ void grad_kernel(int64_t n, const T* dy, const T* y, T* dx) {
  const Op op;
  for (int64_t i = global_index(); i < n; i += grid_stride()) dx[i] = op(dy[i], y[i]);
}

template <class Op, class T> class GradKernel final : public Kernel {
 public:
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const int64_t n = out[0]->numel();
    if (n == 0) return;
    grad_kernel<Op, T><<<blocks_for(n), kBlock, 0, stream()>>>(n, in[0]->ptr<T>(), in[1]->ptr<T>(), out[0]->ptr<T>());
    check_launch("fused gradient kernel");
  }
};

template <class Op> std::unique_ptr<Kernel> make_grad(PrepareContext& ctx) {
  ops::prepare_fused_grad(ctx);
  if (ctx.inputs[0].dtype == DType::Float64) return std::make_unique<GradKernel<Op, double>>();
  return std::make_unique<GradKernel<Op, float>>();
}

// ---- two inputs with broadcasting: o = op(a, b) ------------------------------------------------------------

template <class Op, class TA, class TB, class TO>
__global__ void binary_kernel(Strides<2> s, bool flat, int64_t n, const TA* a, const TB* b, TO* o, Op op) {
  for (int64_t i = global_index(); i < n; i += grid_stride()) {
    if (flat) {
      o[i] = op(a[i], b[i]);
    } else {
      int64_t off[2];
      s.offsets(i, off);
      o[i] = op(a[off[0]], b[off[1]]);
    }
  }
}

template <class Op, class TA, class TB, class TO>
void launch_binary(const BroadcastPlan& p, const TA* a, const TB* b, TO* o, const Op& op) {
  if (p.numel == 0) return;
  binary_kernel<<<blocks_for(p.numel), kBlock, 0, stream()>>>(strides_of<2>(p), p.all_contiguous(), p.numel, a, b, o, op);
  check_launch("binary elementwise kernel");
}

template <class Op, class TA, class TB, class TO> class BinaryKernel final : public Kernel {
 public:
  BinaryKernel(BroadcastPlan p, Op op) : plan_(std::move(p)), op_(op) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    launch_binary(plan_, in[0]->ptr<TA>(), in[1]->ptr<TB>(), out[0]->ptr<TO>(), op_);
  }

 private:
  BroadcastPlan plan_;
  Op op_;
};

// The broadcast of every input onto output 0.
inline BroadcastPlan plan_for(const PrepareContext& ctx) {
  std::vector<std::vector<int64_t>> shapes;
  for (const KernelInput& in : ctx.inputs) shapes.push_back(in.shape);
  return plan_broadcast(shapes, ctx.outputs[0].shape);
}

}  // namespace onnxtrain::cuda
