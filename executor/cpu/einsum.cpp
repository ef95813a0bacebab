// Einsum on the CPU (rule: gradients/rules/einsum.cpp; CUDA twin: executor/cuda/einsum.cu). The node's checks,
// output shape and index plan are ops::prepare_einsum (executor/ops/einsum_plan.h), which the CUDA twin calls too;
// this file is the loop that applies the plan. One plain loop, not a tuned path.
#include <algorithm>
#include <memory>
#include <vector>

#include "executor/cpu/kernel_util.h"
#include "executor/kernel.h"
#include "executor/ops/einsum_plan.h"

namespace onnxtrain {
namespace {

using cpu::dispatch;
using cpu::fail_dtype;

using ops::EinsumPlan;

template <class T> class EinsumKernel final : public Kernel {
 public:
  explicit EinsumKernel(EinsumPlan p) : p_(std::move(p)) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const size_t nt = in.size();
    std::vector<const T*> src(nt);
    for (size_t t = 0; t < nt; ++t) src[t] = in[t]->ptr<T>();
    T* y = out[0]->ptr<T>();
    const int64_t no = numel_of(p_.out_dims), ns = numel_of(p_.sum_dims);
    std::vector<int64_t> oi(p_.out_dims.size(), 0), si(p_.sum_dims.size(), 0);
    std::vector<int64_t> base(nt, 0), off(nt, 0);
    for (int64_t o = 0; o < no; ++o) {
      T acc = T(0);
      off = base;
      std::fill(si.begin(), si.end(), 0);
      for (int64_t s = 0; s < ns; ++s) {
        T prod = T(1);
        for (size_t t = 0; t < nt; ++t) prod *= src[t][off[t]];
        acc += prod;
        advance(si, p_.sum_dims, p_.sum_strides, off);
      }
      y[o] = acc;
      advance(oi, p_.out_dims, p_.out_strides, base);
    }
  }

 private:
  // Odometer step of idx over dims, moving every operand's offset by its strides.
  static void advance(std::vector<int64_t>& idx, const std::vector<int64_t>& dims,
                      const std::vector<std::vector<int64_t>>& strides, std::vector<int64_t>& off) {
    for (size_t q = idx.size(); q-- > 0;) {
      for (size_t t = 0; t < off.size(); ++t) off[t] += strides[t][q];
      if (++idx[q] < dims[q]) return;
      for (size_t t = 0; t < off.size(); ++t) off[t] -= strides[t][q] * dims[q];
      idx[q] = 0;
    }
  }
  EinsumPlan p_;
};

std::unique_ptr<Kernel> make_einsum(PrepareContext& ctx) {
  EinsumPlan p = ops::prepare_einsum(ctx);
  std::unique_ptr<Kernel> k;
  dispatch<float, double, int32_t, int64_t>(ctx.inputs[0].dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    k = std::make_unique<EinsumKernel<T>>(std::move(p));
  });
  if (!k) fail_dtype(ctx);
  return k;
}

}  // namespace

void register_cpu_einsum(KernelRegistry& r) {
  const std::vector<DType> num = {DType::Float32, DType::Float64, DType::Int32, DType::Int64};
  cpu::add(r, "Einsum", 12, num, make_einsum);
}

}  // namespace onnxtrain
