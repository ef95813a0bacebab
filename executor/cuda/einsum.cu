// Einsum on CUDA (CPU kernel: executor/cpu/einsum.cpp; rule: gradients/rules/einsum.cpp).
//
// Its factory takes the node's checks, output shape and index plan from ops::prepare_einsum
// (executor/ops/einsum_plan.h), as the CPU factory does, so the equation has one parser and the CPU factory is not
// run. One thread per output element over the summed indices, in the CPU's order.
#include <algorithm>
#include <memory>

#include "executor/cuda/common.h"
#include "executor/cuda/device_util.cuh"
#include "executor/ops/einsum_plan.h"
#include "graph/error.h"

namespace onnxtrain::cuda {
namespace {

// ---- Einsum ----------------------------------------------------------------------------------------------

constexpr int kMaxOperands = 6;
constexpr int kMaxIndices = 10;

template <class T> struct EinsumGeom {
  int nt, no, ns;
  int64_t nsum;
  int64_t out_dims[kMaxIndices], sum_dims[kMaxIndices];
  int64_t ost[kMaxOperands][kMaxIndices], sst[kMaxOperands][kMaxIndices];
  const T* src[kMaxOperands];
};

template <class T> __global__ void einsum_kernel(int64_t nout, EinsumGeom<T> g, T* y) {
  for (int64_t o = global_index(); o < nout; o += grid_stride()) {
    int64_t base[kMaxOperands] = {};
    for (int64_t r = o, q = g.no - 1; q >= 0; --q) {
      const int64_t c = r % g.out_dims[q];
      r /= g.out_dims[q];
      for (int t = 0; t < g.nt; ++t) base[t] += c * g.ost[t][q];
    }
    T acc = T(0);
    for (int64_t s = 0; s < g.nsum; ++s) {
      int64_t off[kMaxOperands];
      for (int t = 0; t < g.nt; ++t) off[t] = base[t];
      for (int64_t r = s, q = g.ns - 1; q >= 0; --q) {
        const int64_t c = r % g.sum_dims[q];
        r /= g.sum_dims[q];
        for (int t = 0; t < g.nt; ++t) off[t] += c * g.sst[t][q];
      }
      T prod = T(1);
      for (int t = 0; t < g.nt; ++t) prod *= g.src[t][off[t]];
      acc += prod;
    }
    y[o] = acc;
  }
}

template <class T> class EinsumKernel final : public Kernel {
 public:
  explicit EinsumKernel(EinsumGeom<T> g) : g_(g) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const int64_t nout = out[0]->numel();
    if (nout == 0) return;
    EinsumGeom<T> g = g_;
    for (int t = 0; t < g.nt; ++t) g.src[t] = in[static_cast<size_t>(t)]->ptr<T>();
    einsum_kernel<<<blocks_for(nout), kBlock, 0, stream()>>>(nout, g, out[0]->ptr<T>());
    check_launch("Einsum kernel");
  }

 private:
  EinsumGeom<T> g_;
};

// The CPU factory (the second argument) is not run: ops::prepare_einsum is the shared plan-time part.
std::unique_ptr<Kernel> make_einsum(PrepareContext& ctx) {
  const ops::EinsumPlan p = ops::prepare_einsum(ctx);
  const size_t nt = p.out_strides.size();
  if (nt > static_cast<size_t>(kMaxOperands) || p.out_dims.size() > static_cast<size_t>(kMaxIndices) ||
      p.sum_dims.size() > static_cast<size_t>(kMaxIndices))
    ctx.fail("the CUDA Einsum takes at most " + std::to_string(kMaxOperands) + " operands and " +
             std::to_string(kMaxIndices) + " output and summed indices each");
  std::unique_ptr<Kernel> k;
  dispatch<float, double, int32_t, int64_t>(ctx.inputs[0].dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    EinsumGeom<T> g{};
    g.nt = static_cast<int>(nt);
    g.no = static_cast<int>(p.out_dims.size());
    g.ns = static_cast<int>(p.sum_dims.size());
    g.nsum = 1;
    for (int q = 0; q < g.no; ++q) g.out_dims[q] = p.out_dims[q];
    for (int q = 0; q < g.ns; ++q) g.nsum *= g.sum_dims[q] = p.sum_dims[q];
    for (size_t t = 0; t < nt; ++t) {
      for (int q = 0; q < g.no; ++q) g.ost[t][q] = p.out_strides[t][q];
      for (int q = 0; q < g.ns; ++q) g.sst[t][q] = p.sum_strides[t][q];
    }
    k = std::make_unique<EinsumKernel<T>>(g);
  });
  if (!k) ops::fail_dtype(ctx);
  return k;
}

}  // namespace

void register_cuda_einsum(KernelRegistry& r) { twin(r, "Einsum", make_einsum); }

}  // namespace onnxtrain::cuda
