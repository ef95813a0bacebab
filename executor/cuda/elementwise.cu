// Binary, ternary and variadic elementwise ops with broadcasting on CUDA: the checks and output shapes are
// executor/ops/elementwise.h, the maths is executor/functors.h, the broadcast pattern is the CPU's BroadcastPlan,
// and this file only launches (the two-input launch template, shared with PRelu in activation.cu, is
// map_kernels.cuh).
#include <memory>
#include <type_traits>

#include "executor/cuda/common.h"
#include "executor/cuda/device_util.cuh"
#include "executor/cuda/map_kernels.cuh"
#include "executor/functor_attrs.h"
#include "executor/ops/elementwise.h"

namespace onnxtrain::cuda {
namespace {

template <class T>
__global__ void where_kernel(Strides<3> s, bool flat, int64_t n, const bool* c, const T* x, const T* y, T* o) {
  const WhereOp op;
  for (int64_t i = global_index(); i < n; i += grid_stride()) {
    if (flat) {
      o[i] = op(c[i], x[i], y[i]);
    } else {
      int64_t off[3];
      s.offsets(i, off);
      o[i] = op(c[off[0]], x[off[1]], y[off[2]]);
    }
  }
}

template <class T> __global__ void scale_kernel(int64_t n, T* o, T scale) {
  const MulOp op;
  for (int64_t i = global_index(); i < n; i += grid_stride()) o[i] = op(o[i], scale);
}

template <class Op, bool BoolOut, class... Ts> KernelFactory same_type_binary(Op (*make_op)(const Node&) = nullptr) {
  return [make_op](PrepareContext& ctx) -> std::unique_ptr<Kernel> {
    ops::prepare_binary(ctx, BoolOut);
    const Op op = make_op ? make_op(ctx.node) : Op{};
    std::unique_ptr<Kernel> k;
    dispatch<Ts...>(ctx.inputs[0].dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      using TO = std::conditional_t<BoolOut, bool, T>;
      k = std::make_unique<BinaryKernel<Op, T, T, TO>>(plan_for(ctx), op);
    });
    if (!k) ops::fail_dtype(ctx);
    return k;
  };
}

std::unique_ptr<Kernel> make_pow(PrepareContext& ctx) {
  ops::prepare_pow(ctx);  // also the base and exponent dtypes
  std::unique_ptr<Kernel> k;
  dispatch<float, double, int64_t, int32_t>(ctx.inputs[0].dtype, [&](auto xt) {
    using TX = typename decltype(xt)::type;
    dispatch<float, double, int64_t, int32_t>(ctx.inputs[1].dtype, [&](auto yt) {
      using TY = typename decltype(yt)::type;
      k = std::make_unique<BinaryKernel<PowOp, TX, TY, TX>>(plan_for(ctx), PowOp{});
    });
  });
  if (!k) ops::fail_dtype(ctx);
  return k;
}

template <class T> class WhereKernel final : public Kernel {
 public:
  explicit WhereKernel(BroadcastPlan p) : plan_(std::move(p)) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    if (plan_.numel == 0) return;
    where_kernel<<<blocks_for(plan_.numel), kBlock, 0, stream()>>>(strides_of<3>(plan_), plan_.all_contiguous(),
                                                                     plan_.numel, in[0]->ptr<bool>(), in[1]->ptr<T>(),
                                                                     in[2]->ptr<T>(), out[0]->ptr<T>());
    check_launch("Where kernel");
  }

 private:
  BroadcastPlan plan_;
};

std::unique_ptr<Kernel> make_where(PrepareContext& ctx) {
  ops::prepare_where(ctx);
  std::unique_ptr<Kernel> k;
  dispatch<float, double, int64_t, int32_t, bool, uint8_t, int8_t>(ctx.inputs[1].dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    k = std::make_unique<WhereKernel<T>>(plan_for(ctx));
  });
  if (!k) ops::fail_dtype(ctx, 1);
  return k;
}

// Sum/Max/Min/Mean: as on the CPU, the first two inputs combine into the output and later ones accumulate
// into it in place; Mean scales at the end.
template <class Op, class T> class VariadicKernel final : public Kernel {
 public:
  VariadicKernel(std::vector<BroadcastPlan> plans, bool mean) : plans_(std::move(plans)), mean_(mean) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    T* o = out[0]->ptr<T>();
    const int64_t n = out[0]->numel();
    if (in.size() == 1) {
      if (o != in[0]->ptr<T>() && n)
        check(cudaMemcpyAsync(o, in[0]->ptr<T>(), n * sizeof(T), cudaMemcpyDeviceToDevice, stream()), "variadic copy");
    } else {
      launch_binary(plans_[0], in[0]->ptr<T>(), in[1]->ptr<T>(), o, Op{});
      for (size_t k = 2; k < in.size(); ++k) launch_binary(plans_[k - 1], o, in[k]->ptr<T>(), o, Op{});
    }
    if (mean_ && n) {
      scale_kernel<<<blocks_for(n), kBlock, 0, stream()>>>(n, o, T(1) / static_cast<T>(in.size()));
      check_launch("Mean scale kernel");
    }
  }

 private:
  std::vector<BroadcastPlan> plans_;
  bool mean_;
};

template <class Op, class... Ts> KernelFactory variadic(bool mean) {
  return [mean](PrepareContext& ctx) -> std::unique_ptr<Kernel> {
    ops::prepare_variadic(ctx);
    const std::vector<int64_t>& out = ctx.outputs[0].shape;
    std::vector<BroadcastPlan> plans;
    if (ctx.inputs.size() >= 2) {
      plans.push_back(plan_broadcast(std::vector<std::vector<int64_t>>{ctx.inputs[0].shape, ctx.inputs[1].shape}, out));
      for (size_t i = 2; i < ctx.inputs.size(); ++i)
        plans.push_back(plan_broadcast(std::vector<std::vector<int64_t>>{out, ctx.inputs[i].shape}, out));
    }
    std::unique_ptr<Kernel> k;
    dispatch<Ts...>(ctx.inputs[0].dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      k = std::make_unique<VariadicKernel<Op, T>>(std::move(plans), mean);
    });
    if (!k) ops::fail_dtype(ctx);
    return k;
  };
}

}  // namespace

void register_cuda_elementwise(KernelRegistry& r) {
  twin(r, "Add", same_type_binary<AddOp, false, float, double, int64_t, int32_t>());
  twin(r, "Sub", same_type_binary<SubOp, false, float, double, int64_t, int32_t>());
  twin(r, "Mul", same_type_binary<MulOp, false, float, double, int64_t, int32_t>());
  twin(r, "Div", same_type_binary<DivOp, false, float, double, int64_t, int32_t>());
  twin(r, "Pow", make_pow);
  twin(r, "Mod", same_type_binary<ModOp, false, float, double, int64_t, int32_t, int8_t, uint8_t>(mod_op));
  twin(r, "Equal", same_type_binary<EqualOp, true, float, double, int64_t, int32_t, bool>());
  twin(r, "Less", same_type_binary<LessOp, true, float, double, int64_t, int32_t>());
  twin(r, "Greater", same_type_binary<GreaterOp, true, float, double, int64_t, int32_t>());
  twin(r, "LessOrEqual", same_type_binary<LessOrEqualOp, true, float, double, int64_t, int32_t>());
  twin(r, "GreaterOrEqual", same_type_binary<GreaterOrEqualOp, true, float, double, int64_t, int32_t>());
  twin(r, "And", same_type_binary<AndOp, true, bool>());
  twin(r, "Or", same_type_binary<OrOp, true, bool>());
  twin(r, "Xor", same_type_binary<XorOp, true, bool>());
  twin(r, "Where", make_where);
  twin(r, "Sum", variadic<AddOp, float, double, int64_t, int32_t>(false));
  twin(r, "Mean", variadic<AddOp, float, double>(true));
  twin(r, "Max", variadic<MaxOp, float, double, int64_t, int32_t>(false));
  twin(r, "Min", variadic<MinOp, float, double, int64_t, int32_t>(false));
}

}  // namespace onnxtrain::cuda
