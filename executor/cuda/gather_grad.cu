// onnxtrain.GatherGrad and onnxtrain.SumToShape on CUDA (CPU kernels and semantics: executor/cpu/gather_grad.cpp).
//
// GatherGrad zeroes dX and adds every dY element into its row with atomicAdd (float and double, sm_60+). The
// order of the additions into a row that several indices hit is not fixed, so with repeated indices the
// result may differ from run to run in the last bits (the CPU kernel is deterministic). Out-of-range indices,
// which the CPU kernel reports, cannot throw from the device: they are skipped.
// SumToShape gives each output element one thread, which sums its broadcast copies in a fixed order:
// deterministic.
#include <memory>

#include "executor/cuda/common.h"
#include "executor/ops/gather_grad.h"
#include "executor/cuda/device_util.cuh"
#include "graph/error.h"

namespace onnxtrain::cuda {
namespace {

template <class T, class I>
__global__ void gather_grad_kernel(int64_t count, int64_t m, int64_t n, int64_t inner, const T* dy, const I* idx,
                                   T* dx) {
  for (int64_t i = global_index(); i < count; i += grid_stride()) {
    const int64_t o = i / (m * inner), rem = i % (m * inner), j = rem / inner, c = rem % inner;
    int64_t v = static_cast<int64_t>(idx[j]);
    if (v < 0) v += n;
    if (v < 0 || v >= n) continue;
    atomicAdd(dx + (o * n + v) * inner + c, dy[i]);
  }
}

template <class T, class I> class GatherGradKernel final : public Kernel {
 public:
  GatherGradKernel(int64_t n, int64_t inner) : n_(n), inner_(inner) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    if (out[0]->nbytes()) check(cudaMemsetAsync(out[0]->data, 0, out[0]->nbytes(), stream()), "GatherGrad zero fill");
    const int64_t count = in[0]->numel(), m = in[1]->numel();
    if (count == 0) return;
    gather_grad_kernel<<<blocks_for(count), kBlock, 0, stream()>>>(count, m, n_, inner_, in[0]->ptr<T>(),
                                                                    in[1]->ptr<I>(), out[0]->ptr<T>());
    check_launch("GatherGrad kernel");
  }

 private:
  int64_t n_, inner_;
};

std::unique_ptr<Kernel> make_gather_grad(PrepareContext& ctx) {
  const ops::GatherGradGeometry g = ops::prepare_gather_grad(ctx);  // dX's shape from the plan-time shape input
  const bool i32 = ctx.inputs[1].dtype == DType::Int32;
  std::unique_ptr<Kernel> k;
  dispatch<float, double>(ctx.inputs[0].dtype, [&](auto t) {
    using T = typename decltype(t)::type;
    if (i32) k = std::make_unique<GatherGradKernel<T, int32_t>>(g.n, g.inner);
    else k = std::make_unique<GatherGradKernel<T, int64_t>>(g.n, g.inner);
  });
  if (!k) ctx.fail("unsupported dtype " + dtype_name(ctx.inputs[0].dtype) + " on CUDA (float32, float64)");
  return k;
}

constexpr int kMaxRank = 16;

// dY's dims split into those dX keeps (in order: dX's contiguous layout) and those summed away.
struct SumLayout {
  int kept = 0, summed = 0;
  int64_t kept_dims[kMaxRank], kept_strides[kMaxRank];
  int64_t sum_dims[kMaxRank], sum_strides[kMaxRank];
};

template <class T>
__global__ void sum_to_shape_kernel(int64_t count, int64_t per_output, SumLayout l, const T* dy, T* dx) {
  for (int64_t i = global_index(); i < count; i += grid_stride()) {
    int64_t base = 0, rest = i;
    for (int d = l.kept - 1; d >= 0; --d) {
      base += (rest % l.kept_dims[d]) * l.kept_strides[d];
      rest /= l.kept_dims[d];
    }
    T acc = T(0);
    for (int64_t r = 0; r < per_output; ++r) {
      int64_t off = base, q = r;
      for (int d = l.summed - 1; d >= 0; --d) {
        off += (q % l.sum_dims[d]) * l.sum_strides[d];
        q /= l.sum_dims[d];
      }
      acc += dy[off];
    }
    dx[i] = acc;
  }
}

template <class T> class SumToShapeKernel final : public Kernel {
 public:
  SumToShapeKernel(SumLayout l, int64_t per_output) : l_(l), per_(per_output) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const int64_t count = out[0]->numel();
    if (count == 0) return;
    sum_to_shape_kernel<<<blocks_for(count), kBlock, 0, stream()>>>(count, per_, l_, in[0]->ptr<T>(), out[0]->ptr<T>());
    check_launch("SumToShape kernel");
  }

 private:
  SumLayout l_;
  int64_t per_;
};

std::unique_ptr<Kernel> make_sum_to_shape(PrepareContext& ctx) {
  ops::prepare_sum_to_shape(ctx);  // validates that the target broadcasts to dY
  const std::vector<int64_t>& dy = ctx.inputs[0].shape;
  const std::vector<int64_t>& target = ctx.outputs[0].shape;
  const size_t lead = dy.size() - target.size();
  SumLayout l;
  int64_t per_output = 1, stride = 1;
  std::vector<int64_t> strides(dy.size());
  for (size_t a = dy.size(); a-- > 0;) {
    strides[a] = stride;
    stride *= dy[a];
  }
  for (size_t a = 0; a < dy.size(); ++a) {
    const bool summed = a < lead || (target[a - lead] == 1 && dy[a] != 1);
    if (dy[a] == 1) continue;  // contributes nothing either way
    if (l.kept == kMaxRank || l.summed == kMaxRank)
      ctx.fail("more than " + std::to_string(kMaxRank) + " kept or summed dims are not supported on CUDA");
    if (summed) {
      l.sum_dims[l.summed] = dy[a];
      l.sum_strides[l.summed++] = strides[a];
      per_output *= dy[a];
    } else {
      l.kept_dims[l.kept] = dy[a];
      l.kept_strides[l.kept++] = strides[a];
    }
  }
  if (l.summed == 0) return std::make_unique<DeviceCopyKernel>();
  std::unique_ptr<Kernel> k;
  dispatch<float, double>(ctx.inputs[0].dtype, [&](auto t) {
    using T = typename decltype(t)::type;
    k = std::make_unique<SumToShapeKernel<T>>(l, per_output);
  });
  if (!k) ctx.fail("unsupported dtype " + dtype_name(ctx.inputs[0].dtype) + " on CUDA (float32, float64)");
  return k;
}

}  // namespace

void register_cuda_gather_grad(KernelRegistry& r) {
  twin(r, "onnxtrain", "GatherGrad", make_gather_grad);
  twin(r, "onnxtrain", "SumToShape", make_sum_to_shape);
}

}  // namespace onnxtrain::cuda
