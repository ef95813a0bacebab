// NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss on CUDA.
//
// Input [N, C, d...] is viewed as [N, C, D]. SoftmaxCrossEntropyLoss first writes log_softmax over C (one
// thread per (n, d) lane, max-shifted, the sum of exponentials in double as on the CPU) into its log_prob
// output or a plan-time scratch buffer. Each target element's weight and loss come from nll_term
// (executor/functors.h), which the CPU kernel calls too. reduction="none" writes them per element; "sum" and
// "mean" accumulate loss and weight in double in one block and divide on the device ("mean" divides by the
// summed weights, as the ONNX reference does). A target outside [0, C) that is not ignore_index is an error
// on the CPU; the device cannot raise one, so the loss becomes NaN there.
#include <memory>
#include <optional>

#include "executor/cuda/common.h"
#include "executor/ops/loss.h"
#include "executor/cuda/device_util.cuh"
#include "executor/functors.h"

namespace onnxtrain::cuda {
namespace {

struct LossGeom {
  int64_t n, c, d;
  bool has_ignore;
  int64_t ignore;
};

template <class T> __global__ void log_softmax_kernel(LossGeom g, const T* x, T* lp) {
  for (int64_t lane = global_index(); lane < g.n * g.d; lane += grid_stride()) {
    const int64_t off = (lane / g.d) * g.c * g.d + lane % g.d;
    const T* xs = x + off;
    T* ls = lp + off;
    T m = xs[0];
    for (int64_t j = 1; j < g.c; ++j) m = xs[j * g.d] > m ? xs[j * g.d] : m;
    double s = 0;
    for (int64_t j = 0; j < g.c; ++j) s += exp(static_cast<double>(xs[j * g.d] - m));
    const T lse = static_cast<T>(log(s)) + m;
    for (int64_t j = 0; j < g.c; ++j) ls[j * g.d] = xs[j * g.d] - lse;
  }
}

template <class T, class I> __device__ NllTerm term_at(const LossGeom& g, int64_t e, const T* logp, const I* target, const T* w) {
  const int64_t i = e / g.d, k = e % g.d;
  return nll_term(static_cast<int64_t>(target[e]), g.c, w, logp + i * g.c * g.d + k, g.d, g.has_ignore, g.ignore);
}

template <class T, class I> __global__ void loss_none_kernel(LossGeom g, const T* logp, const I* target, const T* w, T* y) {
  for (int64_t e = global_index(); e < g.n * g.d; e += grid_stride()) y[e] = static_cast<T>(term_at(g, e, logp, target, w).loss);
}

// One block: every thread sums a strided share in double, then a shared-memory tree.
template <class T, class I>
__global__ void loss_reduce_kernel(LossGeom g, const T* logp, const I* target, const T* w, T* y, bool mean) {
  __shared__ double tot[kBlock], wsum[kBlock];
  double a = 0, b = 0;
  for (int64_t e = threadIdx.x; e < g.n * g.d; e += blockDim.x) {
    const NllTerm t = term_at(g, e, logp, target, w);
    a += t.loss;
    b += t.w;
  }
  tot[threadIdx.x] = a;
  wsum[threadIdx.x] = b;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) {
      tot[threadIdx.x] += tot[threadIdx.x + s];
      wsum[threadIdx.x] += wsum[threadIdx.x + s];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) *y = static_cast<T>(mean ? tot[0] / wsum[0] : tot[0]);
}

template <class T, class I> class LossKernel final : public Kernel {
 public:
  LossKernel(LossGeom g, bool softmax, std::string reduction, Tensor scratch)
      : g_(g), softmax_(softmax), reduction_(std::move(reduction)), scratch_(std::move(scratch)) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const T* logp = in[0]->ptr<T>();
    const I* target = in[1]->ptr<I>();
    const T* w = in.size() > 2 && in[2] ? in[2]->ptr<T>() : nullptr;
    const int64_t lanes = g_.n * g_.d;
    if (softmax_) {
      T* lp = out.size() > 1 && out[1] ? out[1]->ptr<T>() : scratch_.ptr<T>();
      if (lanes > 0 && g_.c > 0) {
        log_softmax_kernel<<<blocks_for(lanes), kBlock, 0, stream()>>>(g_, logp, lp);
        check_launch("log_softmax kernel");
      }
      logp = lp;
    }
    T* y = out[0]->ptr<T>();
    if (reduction_ == "none") {
      if (lanes == 0) return;
      loss_none_kernel<<<blocks_for(lanes), kBlock, 0, stream()>>>(g_, logp, target, w, y);
    } else {
      loss_reduce_kernel<<<1, kBlock, 0, stream()>>>(g_, logp, target, w, y, reduction_ == "mean");
    }
    check_launch("loss kernel");
  }

 private:
  LossGeom g_;
  bool softmax_;
  std::string reduction_;
  Tensor scratch_;  // log_prob on the device when the node does not output it
};

KernelFactory loss(bool softmax) {
  return [softmax](PrepareContext& ctx) -> std::unique_ptr<Kernel> {
    const ops::LossAttrs a = ops::prepare_loss(ctx, softmax);
    const std::vector<int64_t>& shape = ctx.inputs[0].shape;
    const LossGeom g{a.n, a.c, a.d, a.ignore.has_value(), a.ignore.value_or(0)};
    const DType t = ctx.inputs[0].dtype;
    Tensor scratch;
    if (softmax && (ctx.outputs.size() < 2 || ctx.node.outputs[1].empty())) scratch = Tensor::empty(t, shape, Device::CUDA);
    const std::string& reduction = a.reduction;
    const bool wide = a.wide_target;
    std::unique_ptr<Kernel> k;
    dispatch<float, double>(t, [&](auto tag) {
      using T = typename decltype(tag)::type;
      if (wide) k = std::make_unique<LossKernel<T, int64_t>>(g, softmax, reduction, std::move(scratch));
      else k = std::make_unique<LossKernel<T, int32_t>>(g, softmax, reduction, std::move(scratch));
    });
    if (!k) ops::fail_dtype(ctx);
    return k;
  };
}

}  // namespace

void register_cuda_loss(KernelRegistry& r) {
  twin(r, "NegativeLogLikelihoodLoss", loss(false));
  twin(r, "SoftmaxCrossEntropyLoss", loss(true));
}

}  // namespace onnxtrain::cuda
