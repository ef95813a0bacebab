// Conv, ConvTranspose and the fused ConvGrad on CUDA (pooling: pool.cu; the window helpers both use: window.cuh).
// The geometry is the CPU's (executor/ops/conv_geometry.h, parsed once at plan time). Conv and ConvGrad with
// symmetric pads go through cuDNN; everything else runs direct kernels: one thread per output element gathers
// its whole sum, so there are no atomics and the result does not depend on scheduling; ties and NaNs in
// MaxPool follow the CPU (first maximum in tap order, a NaN wins), and AveragePool's divisors are the CPU's
// own, computed on the host and uploaded once (cuDNN's pooling takes symmetric pads only and counts ceil_mode
// windows differently). Not run on a GPU here (none on this machine): it compiles for sm_80/sm_90.
#include <array>
#include <cmath>
#include <memory>
#include <utility>
#include <vector>

#include "executor/ops/conv.h"
#include "executor/ops/conv_geometry.h"
#include "executor/cuda/common.h"
#include "executor/cuda/device_util.cuh"
#include "executor/cuda/window.cuh"

namespace onnxtrain::cuda {
namespace {

// y[n, m, o] = b[m] + sum over c in m's group and taps j of x[n, c, o*s - pb + j*d] * w[m, c', j].
template <class T> __global__ void conv_kernel(DGeo g, const T* x, const T* w, const T* b, T* y) {
  const int64_t osz = g.osz(), isz = g.isz(), ksz = g.ksz(), Cg = g.C / g.G, Mg = g.M / g.G;
  for (int64_t e = global_index(); e < g.N * g.M * osz; e += grid_stride()) {
    const int64_t p = e / osz, n = p / g.M, m = p % g.M, grp = m / Mg;
    int64_t o[3];
    split3(e % osz, g.out, o);
    T acc = b ? b[m] : T(0);
    for (int64_t c = 0; c < Cg; ++c) {
      const T* xp = x + (n * g.C + grp * Cg + c) * isz;
      const T* wp = w + (m * Cg + c) * ksz;
      for_each_tap(g, o, [&](int64_t i, int64_t j) { acc += xp[i] * wp[j]; });
    }
    y[e] = acc;
  }
}

// The transposed convolution, gathered: y[n, m, q] = b[m] + sum over c in m's group and taps j with
// q = i*s - pb + j*d of x[n, c, i] * w[c, m', j]. Here `in` is x's spatial dims and `out` y's.
template <class T> __global__ void conv_transpose_kernel(DGeo g, const T* x, const T* w, const T* b, T* y) {
  const int64_t osz = g.osz(), isz = g.isz(), ksz = g.ksz(), Cg = g.C / g.G, Mg = g.M / g.G;
  // tap_source reads `in` as the positions written and `out` as those read: swap for the gather.
  DGeo r = g;
  for (int a = 0; a < 3; ++a) {
    r.in[a] = g.out[a];
    r.out[a] = g.in[a];
  }
  for (int64_t e = global_index(); e < g.N * g.M * osz; e += grid_stride()) {
    const int64_t p = e / osz, n = p / g.M, m = p % g.M, grp = m / Mg, mg = m % Mg;
    int64_t q[3];
    split3(e % osz, g.out, q);
    T acc = b ? b[m] : T(0);
    for (int64_t c = 0; c < Cg; ++c) {
      const int64_t ci = grp * Cg + c;
      const T* xp = x + (n * g.C + ci) * isz;
      const T* wp = w + (ci * Mg + mg) * ksz;
      for_each_reader(r, q, [&](int64_t i, const int64_t (&)[3], int64_t j) { acc += xp[i] * wp[j]; });
    }
    y[e] = acc;
  }
}

// dw[m, c', j] = sum over n and outputs o of dy[n, m, o] * x[n, c, o*s - pb + j*d].
template <class T> __global__ void conv_weight_grad_kernel(DGeo g, const T* dy, const T* x, T* dw) {
  const int64_t osz = g.osz(), isz = g.isz(), ksz = g.ksz(), Cg = g.C / g.G, Mg = g.M / g.G;
  for (int64_t e = global_index(); e < g.M * Cg * ksz; e += grid_stride()) {
    const int64_t row = e / ksz, m = row / Cg, c = (m / Mg) * Cg + row % Cg;
    int64_t j[3];
    split3(e % ksz, g.k, j);
    T acc = 0;
    for (int64_t n = 0; n < g.N; ++n) {
      const T* dyp = dy + (n * g.M + m) * osz;
      const T* xp = x + (n * g.C + c) * isz;
      for (int64_t o0 = 0; o0 < g.out[0]; ++o0) {
        const int64_t i0 = tap(g, 0, o0, j[0]);
        if (i0 < 0) continue;
        for (int64_t o1 = 0; o1 < g.out[1]; ++o1) {
          const int64_t i1 = tap(g, 1, o1, j[1]);
          if (i1 < 0) continue;
          for (int64_t o2 = 0; o2 < g.out[2]; ++o2) {
            const int64_t i2 = tap(g, 2, o2, j[2]);
            if (i2 >= 0) acc += dyp[(o0 * g.out[1] + o1) * g.out[2] + o2] * xp[(i0 * g.in[1] + i1) * g.in[2] + i2];
          }
        }
      }
    }
    dw[e] = acc;
  }
}

template <class T> __global__ void conv_bias_grad_kernel(DGeo g, const T* dy, T* db) {
  const int64_t osz = g.osz();
  for (int64_t m = global_index(); m < g.M; m += grid_stride()) {
    T acc = 0;
    for (int64_t n = 0; n < g.N; ++n)
      for (int64_t o = 0; o < osz; ++o) acc += dy[(n * g.M + m) * osz + o];
    db[m] = acc;
  }
}

// ---- cuDNN for Conv and ConvGrad ---------------------------------------------------------------------------
// cuDNN's convolution takes one pad per spatial dim, so only symmetric pads go through it (most CNNs); other
// geometries keep the direct kernels. FMA math (no TF32) keeps float32 comparable with the CPU. Algorithms are
// picked by cuDNN's heuristics on the first run (a handle needs the device), workspaces come from workspace().
// This uses cuDNN's legacy convolution API (deprecated in cuDNN 9, still shipped).

template <class D, cudnnStatus_t (*Destroy)(D)> struct CudnnDesc {
  D d = nullptr;
  CudnnDesc() = default;
  CudnnDesc(const CudnnDesc&) = delete;
  CudnnDesc& operator=(const CudnnDesc&) = delete;
  ~CudnnDesc() {
    if (d) Destroy(d);
  }
};

struct CudnnConv {
  CudnnDesc<cudnnTensorDescriptor_t, cudnnDestroyTensorDescriptor> x, y, b;
  CudnnDesc<cudnnFilterDescriptor_t, cudnnDestroyFilterDescriptor> w;
  CudnnDesc<cudnnConvolutionDescriptor_t, cudnnDestroyConvolutionDescriptor> conv;
  bool chosen = false;
  cudnnConvolutionFwdAlgo_t fwd{};
  cudnnConvolutionBwdDataAlgo_t bwd_data{};
  cudnnConvolutionBwdFilterAlgo_t bwd_filter{};
  size_t fwd_ws = 0, data_ws = 0, filter_ws = 0;

  void choose() {
    if (chosen) return;
    int n = 0;
    cudnnConvolutionFwdAlgoPerf_t f;
    check(cudnnGetConvolutionForwardAlgorithm_v7(cudnn(), x.d, w.d, conv.d, y.d, 1, &n, &f), "conv forward algorithm");
    fwd = f.algo;
    check(cudnnGetConvolutionForwardWorkspaceSize(cudnn(), x.d, w.d, conv.d, y.d, fwd, &fwd_ws), "conv forward workspace");
    cudnnConvolutionBwdDataAlgoPerf_t bd;
    check(cudnnGetConvolutionBackwardDataAlgorithm_v7(cudnn(), w.d, y.d, conv.d, x.d, 1, &n, &bd), "conv dX algorithm");
    bwd_data = bd.algo;
    check(cudnnGetConvolutionBackwardDataWorkspaceSize(cudnn(), w.d, y.d, conv.d, x.d, bwd_data, &data_ws),
          "conv dX workspace");
    cudnnConvolutionBwdFilterAlgoPerf_t bf;
    check(cudnnGetConvolutionBackwardFilterAlgorithm_v7(cudnn(), x.d, y.d, conv.d, w.d, 1, &n, &bf), "conv dW algorithm");
    bwd_filter = bf.algo;
    check(cudnnGetConvolutionBackwardFilterWorkspaceSize(cudnn(), x.d, y.d, conv.d, w.d, bwd_filter, &filter_ws),
          "conv dW workspace");
    chosen = true;
  }
};

// Null when cuDNN cannot express the geometry (asymmetric pads) or a dim exceeds int.
std::unique_ptr<CudnnConv> make_cudnn_conv(const ops::Geo& g, DType t) {
  for (int i = 0; i < ops::kMaxSpatial; ++i)
    if (g.pb[i] != g.pe[i]) return nullptr;
  const int sp = g.rank == 3 ? 3 : 2, off = ops::kMaxSpatial - sp, nd = sp + 2;
  const int64_t lim = 1ll << 30;
  if (g.N > lim || g.C > lim || g.M > lim || g.N * g.C * g.in_size() > lim || g.N * g.M * g.out_size() > lim)
    return nullptr;
  int xd[5] = {int(g.N), int(g.C)}, yd[5] = {int(g.N), int(g.M)}, wd[5] = {int(g.M), int(g.C / g.G)},
      bd[5] = {1, int(g.M), 1, 1, 1}, pad[3], stride[3], dil[3];
  for (int i = 0; i < sp; ++i) {
    xd[2 + i] = int(g.in[off + i]);
    yd[2 + i] = int(g.out[off + i]);
    wd[2 + i] = int(g.k[off + i]);
    pad[i] = int(g.pb[off + i]);
    stride[i] = int(g.s[off + i]);
    dil[i] = int(g.d[off + i]);
  }
  auto packed = [nd](const int* dims, int* st) {
    st[nd - 1] = 1;
    for (int i = nd - 1; i-- > 0;) st[i] = st[i + 1] * dims[i + 1];
  };
  int xs[5], ys[5], bs[5];
  packed(xd, xs);
  packed(yd, ys);
  packed(bd, bs);
  const cudnnDataType_t dt = t == DType::Float64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
  auto c = std::make_unique<CudnnConv>();
  check(cudnnCreateTensorDescriptor(&c->x.d), "cudnnCreateTensorDescriptor");
  check(cudnnCreateTensorDescriptor(&c->y.d), "cudnnCreateTensorDescriptor");
  check(cudnnCreateTensorDescriptor(&c->b.d), "cudnnCreateTensorDescriptor");
  check(cudnnCreateFilterDescriptor(&c->w.d), "cudnnCreateFilterDescriptor");
  check(cudnnCreateConvolutionDescriptor(&c->conv.d), "cudnnCreateConvolutionDescriptor");
  check(cudnnSetTensorNdDescriptor(c->x.d, dt, nd, xd, xs), "conv X descriptor");
  check(cudnnSetTensorNdDescriptor(c->y.d, dt, nd, yd, ys), "conv Y descriptor");
  check(cudnnSetTensorNdDescriptor(c->b.d, dt, nd, bd, bs), "conv B descriptor");
  check(cudnnSetFilterNdDescriptor(c->w.d, dt, CUDNN_TENSOR_NCHW, nd, wd), "conv W descriptor");
  check(cudnnSetConvolutionNdDescriptor(c->conv.d, sp, pad, stride, dil, CUDNN_CROSS_CORRELATION, dt),
        "convolution descriptor");
  check(cudnnSetConvolutionGroupCount(c->conv.d, int(g.G)), "convolution group count");
  check(cudnnSetConvolutionMathType(c->conv.d, CUDNN_FMA_MATH), "convolution math type");
  return c;
}

// cuDNN's scaling factors: double for double data, float otherwise.
template <class T> struct Scale {
  T one = 1, zero = 0;
};

// ---- kernels ----------------------------------------------------------------------------------------------

template <class T> class ConvKernel final : public Kernel {
 public:
  ConvKernel(DGeo g, bool transpose, std::unique_ptr<CudnnConv> dnn = nullptr)
      : g_(g), transpose_(transpose), dnn_(std::move(dnn)) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const int64_t n = out[0]->numel();
    if (n == 0) return;
    const T* b = in.size() > 2 && in[2] ? in[2]->ptr<T>() : nullptr;
    if (dnn_) {
      CudnnConv& c = *dnn_;
      c.choose();
      const Scale<T> k;
      check(cudnnConvolutionForward(cudnn(), &k.one, c.x.d, in[0]->data, c.w.d, in[1]->data, c.conv.d, c.fwd,
                                    workspace(c.fwd_ws), c.fwd_ws, &k.zero, c.y.d, out[0]->data),
            "cudnnConvolutionForward");
      if (b) check(cudnnAddTensor(cudnn(), &k.one, c.b.d, b, &k.one, c.y.d, out[0]->data), "Conv bias (cudnnAddTensor)");
      return;
    }
    if (transpose_)
      conv_transpose_kernel<T><<<blocks_for(n), kBlock, 0, stream()>>>(g_, in[0]->ptr<T>(), in[1]->ptr<T>(), b,
                                                                        out[0]->ptr<T>());
    else
      conv_kernel<T><<<blocks_for(n), kBlock, 0, stream()>>>(g_, in[0]->ptr<T>(), in[1]->ptr<T>(), b, out[0]->ptr<T>());
    check_launch(transpose_ ? "ConvTranspose kernel" : "Conv kernel");
  }

 private:
  DGeo g_;
  bool transpose_;
  std::unique_ptr<CudnnConv> dnn_;
};

template <class T> class ConvGradKernel final : public Kernel {
 public:
  ConvGradKernel(DGeo g, std::array<bool, 3> want, std::unique_ptr<CudnnConv> dnn)
      : g_(g), want_(want), dnn_(std::move(dnn)) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const T* dy = in[0]->ptr<T>();
    if (dnn_) {
      CudnnConv& c = *dnn_;
      c.choose();
      const Scale<T> k;
      if (want_[0] && out[0]->numel())
        check(cudnnConvolutionBackwardData(cudnn(), &k.one, c.w.d, in[2]->data, c.y.d, dy, c.conv.d, c.bwd_data,
                                           workspace(c.data_ws), c.data_ws, &k.zero, c.x.d, out[0]->data),
              "cudnnConvolutionBackwardData");
      if (want_[1] && out[1]->numel())
        check(cudnnConvolutionBackwardFilter(cudnn(), &k.one, c.x.d, in[1]->data, c.y.d, dy, c.conv.d, c.bwd_filter,
                                             workspace(c.filter_ws), c.filter_ws, &k.zero, c.w.d, out[1]->data),
              "cudnnConvolutionBackwardFilter");
      if (want_[2] && out[2]->numel())
        check(cudnnConvolutionBackwardBias(cudnn(), &k.one, c.y.d, dy, &k.zero, c.b.d, out[2]->data),
              "cudnnConvolutionBackwardBias");
      return;
    }
    if (want_[0] && out[0]->numel()) {
      conv_transpose_kernel<T><<<blocks_for(out[0]->numel()), kBlock, 0, stream()>>>(transposed(g_), dy,
                                                                                      in[2]->ptr<T>(), nullptr,
                                                                                      out[0]->ptr<T>());
      check_launch("ConvGrad dX kernel");
    }
    if (want_[1] && out[1]->numel()) {
      conv_weight_grad_kernel<T><<<blocks_for(out[1]->numel()), kBlock, 0, stream()>>>(g_, dy, in[1]->ptr<T>(),
                                                                                        out[1]->ptr<T>());
      check_launch("ConvGrad dW kernel");
    }
    if (want_[2] && out[2]->numel()) {
      conv_bias_grad_kernel<T><<<blocks_for(g_.M), kBlock, 0, stream()>>>(g_, dy, out[2]->ptr<T>());
      check_launch("ConvGrad dB kernel");
    }
  }

 private:
  DGeo g_;
  std::array<bool, 3> want_;
  std::unique_ptr<CudnnConv> dnn_;
};
// ---- factories: validation, attributes and output shapes come from the op layer (executor/ops/conv.h) -----

std::unique_ptr<Kernel> make_conv(PrepareContext& ctx) {
  const ops::Geo g = ops::prepare_conv(ctx).g;
  const DType t = ctx.inputs[0].dtype;
  return by_dtype<ConvKernel>(t, device_geo(g), false, make_cudnn_conv(g, t));
}

std::unique_ptr<Kernel> make_conv_transpose(PrepareContext& ctx) {
  return by_dtype<ConvKernel>(ctx.inputs[0].dtype, device_geo(ops::prepare_conv_transpose(ctx).g), true);
}

std::unique_ptr<Kernel> make_conv_grad(PrepareContext& ctx) {
  const ops::ConvGradAttrs a = ops::prepare_conv_grad(ctx);
  const DType t = ctx.inputs[1].dtype;
  return by_dtype<ConvGradKernel>(t, device_geo(a.g), a.want, make_cudnn_conv(a.g, t));
}

}  // namespace

void register_cuda_conv(KernelRegistry& r) {
  twin(r, "Conv", make_conv);
  twin(r, "ConvTranspose", make_conv_transpose);
  twin(r, "onnxtrain", "ConvGrad", make_conv_grad);
}

}  // namespace onnxtrain::cuda
