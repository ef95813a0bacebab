// Binary, ternary and variadic elementwise ops with ONNX multidirectional broadcasting on the CPU.
// The broadcast pattern is planned in the factory; run() only walks it. Fast paths: all operands the
// output's shape (one flat loop), and innermost runs that are contiguous or a repeated scalar (covers
// scalar and bias-row broadcasting); anything else walks strides. The maths is in executor/functors.h.
#include <cstring>
#include <memory>
#include <type_traits>

#include "executor/broadcast.h"
#include "executor/cpu/kernel_util.h"
#include "executor/functor_attrs.h"
#include "executor/kernel.h"
#include "executor/ops/elementwise.h"

namespace onnxtrain {
namespace {

using cpu::add;
using cpu::dispatch;
using cpu::fail_dtype;
using cpu::kCheapGrain;
using cpu::kCostlyGrain;

template <class Op, class TA, class TB, class TO>
void binary_apply(const BroadcastPlan& p, const TA* a, const TB* b, TO* o, const Op& op, int64_t grain) {
  if (p.all_contiguous()) {
    if (p.numel == 1) {
      o[0] = op(a[0], b[0]);
      return;
    }
    parallel_chunks(p.numel, grain, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) o[i] = op(a[i], b[i]);
    });
    return;
  }
  const int64_t sa = p.inner_stride(0), sb = p.inner_stride(1);
  for_each_broadcast_row<2>(p, grain, [&](int64_t oo, const std::array<int64_t, 2>& off, int64_t n) {
    TO* out = o + oo;
    const TA* x = a + off[0];
    const TB* y = b + off[1];
    if (sa == 1 && sb == 1) {
      for (int64_t k = 0; k < n; ++k) out[k] = op(x[k], y[k]);
    } else if (sa == 1 && sb == 0) {
      const TB v = *y;
      for (int64_t k = 0; k < n; ++k) out[k] = op(x[k], v);
    } else if (sa == 0 && sb == 1) {
      const TA v = *x;
      for (int64_t k = 0; k < n; ++k) out[k] = op(v, y[k]);
    } else {
      for (int64_t k = 0; k < n; ++k) out[k] = op(x[k * sa], y[k * sb]);
    }
  });
}

template <class Op, class TA, class TB, class TO>
class BinaryKernel final : public Kernel {
 public:
  BinaryKernel(BroadcastPlan p, Op op, int64_t grain) : plan_(std::move(p)), op_(op), grain_(grain) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    binary_apply(plan_, in[0]->ptr<TA>(), in[1]->ptr<TB>(), out[0]->ptr<TO>(), op_, grain_);
  }

 private:
  BroadcastPlan plan_;
  Op op_;
  int64_t grain_;
};

template <class T> class WhereKernel final : public Kernel {
 public:
  explicit WhereKernel(BroadcastPlan p) : plan_(std::move(p)) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const bool* c = in[0]->ptr<bool>();
    const T* x = in[1]->ptr<T>();
    const T* y = in[2]->ptr<T>();
    T* o = out[0]->ptr<T>();
    const WhereOp op;
    if (plan_.all_contiguous()) {
      parallel_chunks(plan_.numel, kCheapGrain, [&](int64_t s, int64_t e) {
        for (int64_t i = s; i < e; ++i) o[i] = op(c[i], x[i], y[i]);
      });
      return;
    }
    const int64_t sc = plan_.inner_stride(0), sx = plan_.inner_stride(1), sy = plan_.inner_stride(2);
    for_each_broadcast_row<3>(plan_, kCheapGrain, [&](int64_t oo, const std::array<int64_t, 3>& off, int64_t n) {
      T* out = o + oo;
      const bool* cc = c + off[0];
      const T* xx = x + off[1];
      const T* yy = y + off[2];
      for (int64_t k = 0; k < n; ++k) out[k] = op(cc[k * sc], xx[k * sx], yy[k * sy]);
    });
  }

 private:
  BroadcastPlan plan_;
};

// Sum/Max/Min/Mean over any number of inputs: the first two combine into the output, later ones accumulate
// into it in place (each element is read before it is written, so that is safe). Mean scales at the end.
template <class Op, class T> class VariadicKernel final : public Kernel {
 public:
  VariadicKernel(std::vector<BroadcastPlan> plans, Op op, bool mean) : plans_(std::move(plans)), op_(op), mean_(mean) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    T* o = out[0]->ptr<T>();
    const int64_t n = out[0]->numel();
    if (in.size() == 1) {
      if (o != in[0]->ptr<T>() && n) std::memcpy(o, in[0]->ptr<T>(), n * sizeof(T));
    } else {
      binary_apply(plans_[0], in[0]->ptr<T>(), in[1]->ptr<T>(), o, op_, kCheapGrain);
      for (size_t k = 2; k < in.size(); ++k) binary_apply(plans_[k - 1], o, in[k]->ptr<T>(), o, op_, kCheapGrain);
    }
    if (mean_) {
      const T scale = T(1) / static_cast<T>(in.size());
      parallel_chunks(n, kCheapGrain, [&](int64_t s, int64_t e) {
        for (int64_t i = s; i < e; ++i) o[i] *= scale;
      });
    }
  }

 private:
  std::vector<BroadcastPlan> plans_;
  Op op_;
  bool mean_;
};

// ---- factories: the checks and output shapes are the op layer's (executor/ops/elementwise.h) -----------

template <class Op, bool BoolOut, class... Ts> KernelFactory same_type_binary(Op op, int64_t grain) {
  return [op, grain](PrepareContext& ctx) -> std::unique_ptr<Kernel> {
    const ops::InputShapes shapes = ops::prepare_binary(ctx, BoolOut);
    const DType t = ctx.inputs[0].dtype;
    BroadcastPlan plan = plan_broadcast(shapes, ctx.outputs[0].shape);
    std::unique_ptr<Kernel> k;
    dispatch<Ts...>(t, [&](auto tag) {
      using T = typename decltype(tag)::type;
      using TO = std::conditional_t<BoolOut, bool, T>;
      k = std::make_unique<BinaryKernel<Op, T, T, TO>>(std::move(plan), op, grain);
    });
    if (!k) fail_dtype(ctx, 0);
    return k;
  };
}

std::unique_ptr<Kernel> make_pow(PrepareContext& ctx) {
  const ops::InputShapes shapes = ops::prepare_pow(ctx);  // also the base and exponent dtypes
  const DType tx = ctx.inputs[0].dtype, ty = ctx.inputs[1].dtype;
  BroadcastPlan plan = plan_broadcast(shapes, ctx.outputs[0].shape);
  std::unique_ptr<Kernel> k;
  dispatch<float, double, int64_t, int32_t>(tx, [&](auto xt) {
    using TX = typename decltype(xt)::type;
    dispatch<float, double, int64_t, int32_t>(ty, [&](auto yt) {
      using TY = typename decltype(yt)::type;
      k = std::make_unique<BinaryKernel<PowOp, TX, TY, TX>>(std::move(plan), PowOp{}, kCostlyGrain);
    });
  });
  if (!k) fail_dtype(ctx, 1);
  return k;
}

std::unique_ptr<Kernel> make_mod(PrepareContext& ctx) {
  const ops::InputShapes shapes = ops::prepare_binary(ctx, false);
  const ModOp op = mod_op(ctx.node);
  const DType t = ctx.inputs[0].dtype;
  BroadcastPlan plan = plan_broadcast(shapes, ctx.outputs[0].shape);
  std::unique_ptr<Kernel> k;
  dispatch<float, double, int64_t, int32_t, int8_t, uint8_t>(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    k = std::make_unique<BinaryKernel<ModOp, T, T, T>>(std::move(plan), op, kCostlyGrain);
  });
  if (!k) fail_dtype(ctx, 0);
  return k;
}

std::unique_ptr<Kernel> make_where(PrepareContext& ctx) {
  const ops::InputShapes shapes = ops::prepare_where(ctx);
  const DType t = ctx.inputs[1].dtype;
  BroadcastPlan plan = plan_broadcast(shapes, ctx.outputs[0].shape);
  std::unique_ptr<Kernel> k;
  dispatch<float, double, int64_t, int32_t, bool, uint8_t, int8_t>(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    k = std::make_unique<WhereKernel<T>>(std::move(plan));
  });
  if (!k) fail_dtype(ctx, 1);
  return k;
}

template <class Op, class... Ts> KernelFactory variadic(Op op, bool mean) {
  return [op, mean](PrepareContext& ctx) -> std::unique_ptr<Kernel> {
    const ops::InputShapes shapes = ops::prepare_variadic(ctx);
    const DType t = ctx.inputs[0].dtype;
    const std::vector<int64_t>& out = ctx.outputs[0].shape;
    std::vector<BroadcastPlan> plans;
    if (shapes.size() >= 2) {
      plans.push_back(plan_broadcast(std::vector<std::vector<int64_t>>{shapes[0], shapes[1]}, out));
      for (size_t i = 2; i < shapes.size(); ++i)
        plans.push_back(plan_broadcast(std::vector<std::vector<int64_t>>{out, shapes[i]}, out));
    }
    std::unique_ptr<Kernel> k;
    dispatch<Ts...>(t, [&](auto tag) {
      using T = typename decltype(tag)::type;
      k = std::make_unique<VariadicKernel<Op, T>>(std::move(plans), op, mean);
    });
    if (!k) fail_dtype(ctx, 0);
    return k;
  };
}

}  // namespace

void register_cpu_elementwise(KernelRegistry& r) {
  const std::vector<DType> num = {DType::Float32, DType::Float64, DType::Int64, DType::Int32};
  const std::vector<DType> flt = {DType::Float32, DType::Float64};
  // Opset 7 introduced multidirectional broadcasting; earlier versions used a `broadcast`/`axis` scheme.
  add(r, "Add", 7, num, same_type_binary<AddOp, false, float, double, int64_t, int32_t>(AddOp{}, kCheapGrain));
  add(r, "Sub", 7, num, same_type_binary<SubOp, false, float, double, int64_t, int32_t>(SubOp{}, kCheapGrain));
  add(r, "Mul", 7, num, same_type_binary<MulOp, false, float, double, int64_t, int32_t>(MulOp{}, kCheapGrain));
  add(r, "Div", 7, num, same_type_binary<DivOp, false, float, double, int64_t, int32_t>(DivOp{}, kCheapGrain));
  add(r, "Pow", 7, num, make_pow);
  add(r, "Mod", 10, {DType::Float32, DType::Float64, DType::Int64, DType::Int32, DType::Int8, DType::UInt8}, make_mod);

  add(r, "Equal", 7, {DType::Float32, DType::Float64, DType::Int64, DType::Int32, DType::Bool},
      same_type_binary<EqualOp, true, float, double, int64_t, int32_t, bool>(EqualOp{}, kCheapGrain));
  add(r, "Less", 7, num, same_type_binary<LessOp, true, float, double, int64_t, int32_t>(LessOp{}, kCheapGrain));
  add(r, "Greater", 7, num,
      same_type_binary<GreaterOp, true, float, double, int64_t, int32_t>(GreaterOp{}, kCheapGrain));
  add(r, "LessOrEqual", 12, num,
      same_type_binary<LessOrEqualOp, true, float, double, int64_t, int32_t>(LessOrEqualOp{}, kCheapGrain));
  add(r, "GreaterOrEqual", 12, num,
      same_type_binary<GreaterOrEqualOp, true, float, double, int64_t, int32_t>(GreaterOrEqualOp{}, kCheapGrain));

  add(r, "And", 7, {DType::Bool}, same_type_binary<AndOp, true, bool>(AndOp{}, kCheapGrain));
  add(r, "Or", 7, {DType::Bool}, same_type_binary<OrOp, true, bool>(OrOp{}, kCheapGrain));
  add(r, "Xor", 7, {DType::Bool}, same_type_binary<XorOp, true, bool>(XorOp{}, kCheapGrain));

  add(r, "Where", 9, {DType::Bool}, make_where);

  // Opset 8 gave the variadic ops multidirectional broadcasting.
  add(r, "Sum", 8, num, variadic<AddOp, float, double, int64_t, int32_t>(AddOp{}, false));
  add(r, "Mean", 8, flt, variadic<AddOp, float, double>(AddOp{}, true));
  add(r, "Max", 8, num, variadic<MaxOp, float, double, int64_t, int32_t>(MaxOp{}, false));
  add(r, "Min", 8, num, variadic<MinOp, float, double, int64_t, int32_t>(MinOp{}, false));
}

}  // namespace onnxtrain
