// Softmax, LogSoftmax and their fused gradients (onnxtrain.SoftmaxGrad, LogSoftmaxGrad) on CUDA through cuDNN.
// The CPU's layout (executor/ops/softmax_layout.h: `len` elements `inner` apart, for outer * inner lanes) is
// exactly cuDNN's CHANNEL mode on an NCHW tensor (N = outer, C = len, H = inner, W = 1). cuDNN's backward
// pass computes the same formulas as the fused ops: dX = Y * (dY - sum(dY * Y)) for ACCURATE and
// dX = dY - exp(Y) * sum(dY) for LOG, with Y the forward output.
#include <limits>
#include <memory>
#include <type_traits>

#include "executor/ops/softmax_layout.h"
#include "executor/cuda/common.h"

namespace onnxtrain::cuda {
namespace {

// An NCHW descriptor of the layout, created at plan time and reused by every run.
class Descriptor {
 public:
  Descriptor(const PrepareContext& ctx, const ops::SoftmaxLayout& l, cudnnDataType_t t) {
    constexpr int64_t kMax = std::numeric_limits<int>::max();
    if (l.outer > kMax || l.len > kMax || l.inner > kMax || l.outer * l.len * l.inner > kMax)
      ctx.fail("cuDNN softmax takes tensors of fewer than 2^31 elements; got outer " + std::to_string(l.outer) + ", axis " +
               std::to_string(l.len) + ", inner " + std::to_string(l.inner));
    check(cudnnCreateTensorDescriptor(&d_), "cudnnCreateTensorDescriptor");
    check(cudnnSetTensor4dDescriptor(d_, CUDNN_TENSOR_NCHW, t, static_cast<int>(l.outer), static_cast<int>(l.len),
                                     static_cast<int>(l.inner), 1),
          "cudnnSetTensor4dDescriptor (softmax)");
  }
  ~Descriptor() { cudnnDestroyTensorDescriptor(d_); }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  cudnnTensorDescriptor_t get() const { return d_; }

 private:
  cudnnTensorDescriptor_t d_ = nullptr;
};

template <class T> constexpr cudnnDataType_t cudnn_type() {
  return std::is_same_v<T, float> ? CUDNN_DATA_FLOAT : CUDNN_DATA_DOUBLE;
}

// Forward (inputs X) or backward (inputs dY, Y) of Softmax (ACCURATE) or LogSoftmax (LOG).
template <class T, bool Backward> class SoftmaxKernel final : public Kernel {
 public:
  SoftmaxKernel(const PrepareContext& ctx, const ops::SoftmaxLayout& l, cudnnSoftmaxAlgorithm_t algo)
      : desc_(ctx, l, cudnn_type<T>()), algo_(algo), empty_(l.outer * l.len * l.inner == 0) {}

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    if (empty_) return;
    const T one = 1, zero = 0;
    const cudnnTensorDescriptor_t d = desc_.get();
    if constexpr (Backward)
      check(cudnnSoftmaxBackward(cudnn(), algo_, CUDNN_SOFTMAX_MODE_CHANNEL, &one, d, in[1]->data, d, in[0]->data,
                                 &zero, d, out[0]->data),
            "cudnnSoftmaxBackward");
    else
      check(cudnnSoftmaxForward(cudnn(), algo_, CUDNN_SOFTMAX_MODE_CHANNEL, &one, d, in[0]->data, &zero, d,
                                out[0]->data),
            "cudnnSoftmaxForward");
  }

 private:
  Descriptor desc_;
  cudnnSoftmaxAlgorithm_t algo_;
  bool empty_;
};

template <bool Log, bool Backward> std::unique_ptr<Kernel> make(PrepareContext& ctx) {
  const ops::SoftmaxLayout l = ops::prepare_softmax(ctx, Backward);
  const cudnnSoftmaxAlgorithm_t algo = Log ? CUDNN_SOFTMAX_LOG : CUDNN_SOFTMAX_ACCURATE;
  std::unique_ptr<Kernel> k;
  dispatch<float, double>(ctx.inputs[0].dtype, [&](auto tag) {
    k = std::make_unique<SoftmaxKernel<typename decltype(tag)::type, Backward>>(ctx, l, algo);
  });
  if (!k) ops::fail_dtype(ctx);
  return k;
}

}  // namespace

void register_cuda_softmax(KernelRegistry& r) {
  twin(r, "Softmax", make<false, false>);
  twin(r, "LogSoftmax", make<true, false>);
  twin(r, "onnxtrain", "SoftmaxGrad", make<false, true>);
  twin(r, "onnxtrain", "LogSoftmaxGrad", make<true, true>);
}

}  // namespace onnxtrain::cuda
