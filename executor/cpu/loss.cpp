// The ONNX loss ops on the CPU: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (rules:
// gradients/rules/loss.cpp; CUDA twins: executor/cuda/loss.cu). Small loops, not a tuned path.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "executor/cpu/kernel_util.h"
#include "executor/functors.h"
#include "executor/ops/loss.h"
#include "executor/kernel.h"
#include "graph/error.h"

namespace onnxtrain {
namespace {

using cpu::dispatch;
using cpu::fail_dtype;

// ---------------------------------------------------------------------------------------------------------
// NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (which is the former on log_softmax over axis 1).
// Input [N, C, d...], target [N, d...]; element weight w = weight[t] (or 1), 0 where t == ignore_index;
// loss = -w * input[n, t, d...]; "mean" divides the sum by the sum of w, as the ONNX reference does.

template <class T, class I> class LossKernel final : public Kernel {
 public:
  LossKernel(std::string where, bool softmax, int64_t n, int64_t c, int64_t d, std::string reduction,
             std::optional<int64_t> ignore)
      : where_(std::move(where)), softmax_(softmax), n_(n), c_(c), d_(d), reduction_(std::move(reduction)),
        ignore_(ignore) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const T* x = in[0]->ptr<T>();
    const I* target = in[1]->ptr<I>();
    const T* weight = in.size() > 2 && in[2] ? in[2]->ptr<T>() : nullptr;
    const T* logp = x;
    if (softmax_) {
      T* lp = out.size() > 1 && out[1] ? out[1]->ptr<T>() : nullptr;
      if (!lp) {
        scratch_.resize(static_cast<size_t>(n_ * c_ * d_));
        lp = scratch_.data();
      }
      for (int64_t i = 0; i < n_; ++i)
        for (int64_t k = 0; k < d_; ++k) {
          const T* xs = x + i * c_ * d_ + k;
          T* ls = lp + i * c_ * d_ + k;
          T m = xs[0];
          for (int64_t j = 1; j < c_; ++j) m = std::max(m, xs[j * d_]);
          double s = 0;
          for (int64_t j = 0; j < c_; ++j) s += std::exp(static_cast<double>(xs[j * d_] - m));
          const T lse = static_cast<T>(std::log(s)) + m;
          for (int64_t j = 0; j < c_; ++j) ls[j * d_] = xs[j * d_] - lse;
        }
      logp = lp;
    }
    T* y = out[0]->ptr<T>();
    double total = 0, wsum = 0;
    for (int64_t i = 0; i < n_; ++i)
      for (int64_t k = 0; k < d_; ++k) {
        const int64_t t = static_cast<int64_t>(target[i * d_ + k]);
        if ((!ignore_ || t != *ignore_) && (t < 0 || t >= c_))
          fail(where_, "target " + std::to_string(t) + " is out of range for " + std::to_string(c_) + " classes");
        const NllTerm term = nll_term(t, c_, weight, logp + i * c_ * d_ + k, d_, ignore_.has_value(), ignore_.value_or(0));
        const double w = term.w, l = term.loss;
        if (reduction_ == "none") y[i * d_ + k] = static_cast<T>(l);
        total += l;
        wsum += w;
      }
    if (reduction_ == "sum") *y = static_cast<T>(total);
    if (reduction_ == "mean") *y = static_cast<T>(total / wsum);
  }

 private:
  std::string where_;
  bool softmax_;
  int64_t n_, c_, d_;
  std::string reduction_;
  std::optional<int64_t> ignore_;
  std::vector<T> scratch_;
};

std::unique_ptr<Kernel> make_loss(PrepareContext& ctx, bool softmax) {
  const ops::LossAttrs a = ops::prepare_loss(ctx, softmax);
  std::unique_ptr<Kernel> k;
  dispatch<float, double>(ctx.inputs[0].dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (a.wide_target)
      k = std::make_unique<LossKernel<T, int64_t>>(ctx.node.describe(), softmax, a.n, a.c, a.d, a.reduction, a.ignore);
    else
      k = std::make_unique<LossKernel<T, int32_t>>(ctx.node.describe(), softmax, a.n, a.c, a.d, a.reduction, a.ignore);
  });
  if (!k) fail_dtype(ctx);
  return k;
}

}  // namespace

void register_cpu_loss(KernelRegistry& r) {
  cpu::add(r, "NegativeLogLikelihoodLoss", 12, {DType::Float32, DType::Float64},
           [](PrepareContext& ctx) { return make_loss(ctx, false); });
  cpu::add(r, "SoftmaxCrossEntropyLoss", 12, {DType::Float32, DType::Float64},
           [](PrepareContext& ctx) { return make_loss(ctx, true); });
}

}  // namespace onnxtrain
