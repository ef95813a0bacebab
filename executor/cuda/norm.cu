// BatchNormalization, InstanceNormalization, LayerNormalization, GroupNormalization and the fused
// onnxtrain.LayerNormalizationGrad / BatchNormalizationGrad on CUDA.
//
// Every op here normalises "groups" of elements: a LayerNormalization/InstanceNormalization/GroupNormalization
// row, or a BatchNormalization channel (N planes, C planes apart). One thread block handles one group: it
// reduces the group's sums in double (as the CPU kernels do), then writes the group's outputs with the same
// per-element expressions, in the same element type, as executor/cpu/norm.cpp. BatchNormalization does not go
// through cuDNN: cuDNN's training pass updates the running variance with the unbiased (n - 1) batch variance,
// where ONNX (and the CPU kernel) use the population variance.
#include <memory>

#include "executor/cuda/common.h"
#include "executor/ops/norm.h"
#include "executor/cuda/device_util.cuh"

namespace onnxtrain::cuda {
namespace {

// Group g is `runs` runs of `len` contiguous elements, `stride` apart, starting at g * step.
struct Group {
  int64_t runs, len, stride, step;
  __device__ int64_t count() const { return runs * len; }
  __device__ int64_t at(int64_t g, int64_t e) const { return g * step + (e / len) * stride + e % len; }
};

// Sums each of v[0..K) over the block; every thread gets the totals. All threads of the block must call it.
template <int K> __device__ void block_sum(double (&v)[K]) {
  __shared__ double part[K][32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = (blockDim.x + 31) / 32;
  for (int k = 0; k < K; ++k)
    for (int o = 16; o > 0; o >>= 1) v[k] += __shfl_down_sync(0xffffffffu, v[k], o);
  if (lane == 0)
    for (int k = 0; k < K; ++k) part[k][warp] = v[k];
  __syncthreads();
  if (warp == 0) {
    for (int k = 0; k < K; ++k) {
      v[k] = lane < warps ? part[k][lane] : 0.0;
      for (int o = 16; o > 0; o >>= 1) v[k] += __shfl_down_sync(0xffffffffu, v[k], o);
    }
    if (lane == 0)
      for (int k = 0; k < K; ++k) part[k][0] = v[k];
  }
  __syncthreads();
  for (int k = 0; k < K; ++k) v[k] = part[k][0];
  __syncthreads();  // part is reused by the next call
}

// Mean and population variance of group g (the variance about the mean, in a second pass, as on the CPU).
template <class T> __device__ void moments(const T* x, const Group& G, int64_t g, double& mean, double& var) {
  const int64_t n = G.count();
  double s[1] = {0.0};
  for (int64_t e = threadIdx.x; e < n; e += blockDim.x) s[0] += x[G.at(g, e)];
  block_sum(s);
  mean = n ? s[0] / static_cast<double>(n) : 0.0;
  double q[1] = {0.0};
  for (int64_t e = threadIdx.x; e < n; e += blockDim.x) {
    const double d = x[G.at(g, e)] - mean;
    q[0] += d * d;
  }
  block_sum(q);
  var = n ? q[0] / static_cast<double>(n) : 0.0;
}

unsigned grid_for(int64_t groups) { return static_cast<unsigned>(groups < 1 ? 1 : (groups > (1 << 20) ? 1 << 20 : groups)); }

using Inputs = std::span<const Tensor* const>;
using Outputs = std::span<Tensor* const>;

// A kernel that launches one block per group (grid_for(groups) blocks): `launch(grid, in, out)` enqueues the
// work on the stream, the plan-time parameters being its captures. With no groups there is nothing to do.
template <class Launch> class GroupLaunchKernel final : public Kernel {
 public:
  GroupLaunchKernel(int64_t groups, const char* what, Launch launch)
      : groups_(groups), what_(what), launch_(std::move(launch)) {}
  void run(Inputs in, Outputs out) override {
    if (groups_ == 0) return;
    launch_(grid_for(groups_), in, out);
    check_launch(what_);
  }

 private:
  int64_t groups_;
  const char* what_;
  Launch launch_;
};

template <class Launch> std::unique_ptr<Kernel> group_kernel(int64_t groups, const char* what, Launch launch) {
  return std::make_unique<GroupLaunchKernel<Launch>>(groups, what, std::move(launch));
}

// ---- forward ------------------------------------------------------------------------------------------------

// Scale and bias offsets within a row: direct (the row's shape) or broadcast to it.
struct RowParams {
  bool direct;
  Strides<2> sb;
  __device__ void offsets(int64_t j, int64_t (&off)[2]) const {
    if (direct) {
      off[0] = off[1] = j;
    } else {
      sb.offsets(j, off);
    }
  }
};

template <class T, class U>
__global__ void layer_norm_kernel(Group G, int64_t rows, double eps, RowParams p, const T* x, const T* s, const T* b,
                                  T* y, U* mean_out, U* inv_out) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    double m, v;
    moments(x, G, r, m, v);
    const double is = 1.0 / sqrt(v + eps);
    if (threadIdx.x == 0) {
      if (mean_out) mean_out[r] = static_cast<U>(m);
      if (inv_out) inv_out[r] = static_cast<U>(is);
    }
    const T tm = static_cast<T>(m), ti = static_cast<T>(is);
    for (int64_t j = threadIdx.x; j < G.len; j += blockDim.x) {
      int64_t off[2];
      p.offsets(j, off);
      const int64_t i = r * G.len + j;
      T val = (x[i] - tm) * ti * s[off[0]];
      if (b) val += b[off[1]];
      y[i] = val;
    }
  }
}

template <class T, class U> std::unique_ptr<Kernel> layer_norm(int64_t rows, int64_t len, double eps, RowParams p) {
  return group_kernel(rows, "LayerNormalization kernel", [=](unsigned grid, Inputs in, Outputs out) {
    const T* b = in.size() > 2 && in[2] ? in[2]->ptr<T>() : nullptr;
    U* mean_out = out.size() > 1 && out[1] ? out[1]->ptr<U>() : nullptr;
    U* inv_out = out.size() > 2 && out[2] ? out[2]->ptr<U>() : nullptr;
    layer_norm_kernel<T, U><<<grid, kBlock, 0, stream()>>>(Group{1, len, len, len}, rows, eps, p, in[0]->ptr<T>(),
                                                           in[1]->ptr<T>(), b, out[0]->ptr<T>(), mean_out, inv_out);
  });
}

std::unique_ptr<Kernel> make_layer_norm(PrepareContext& ctx) {
  const ops::LayerNormAttrs a = ops::prepare_layer_norm(ctx);
  const std::vector<int64_t>& row = a.row_shape;
  const int64_t rows = a.rows, len = a.len;
  const bool has_b = a.has_bias;
  const std::vector<int64_t>& ss = ctx.inputs[1].shape;
  const std::vector<int64_t>& bs = has_b ? ctx.inputs[2].shape : ss;
  RowParams p{ss == row && bs == row, {}};
  if (!p.direct) p.sb = strides_of<2>(plan_broadcast(std::vector<std::vector<int64_t>>{ss, bs}, row));
  const double eps = a.eps;
  const bool double_stats = a.stash == DType::Float64;
  std::unique_ptr<Kernel> k;
  dispatch<float, double>(ctx.inputs[0].dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    k = double_stats ? layer_norm<T, double>(rows, len, eps, p) : layer_norm<T, float>(rows, len, eps, p);
  });
  if (!k) ops::fail_dtype(ctx);
  return k;
}

// InstanceNormalization and GroupNormalization: rows of `len`; the affine parameter changes every `plane`
// elements, element i using parameter (i / plane) % channels.
template <class T>
__global__ void row_norm_kernel(Group G, int64_t rows, int64_t plane, int64_t channels, double eps, const T* x,
                                const T* s, const T* b, T* y) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    double m, v;
    moments(x, G, r, m, v);
    const double is = 1.0 / sqrt(v + eps);
    for (int64_t j = threadIdx.x; j < G.len; j += blockDim.x) {
      const int64_t i = r * G.len + j, c = (i / plane) % channels;
      const T a = static_cast<T>(s[c] * is), k = static_cast<T>(b[c] - m * s[c] * is);
      y[i] = x[i] * a + k;
    }
  }
}

std::unique_ptr<Kernel> row_norm(PrepareContext& ctx, const ops::RowNormGeometry& g) {
  const int64_t rows = g.rows, len = g.len, plane = g.plane, channels = g.channels;
  const double eps = g.eps;
  std::unique_ptr<Kernel> k;
  dispatch<float, double>(ctx.inputs[0].dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    // An empty row has nothing to normalise.
    k = group_kernel(len ? rows : 0, "Instance/GroupNormalization kernel", [=](unsigned grid, Inputs in, Outputs out) {
      row_norm_kernel<T><<<grid, kBlock, 0, stream()>>>(Group{1, len, len, len}, rows, plane, channels, eps,
                                                        in[0]->ptr<T>(), in[1]->ptr<T>(), in[2]->ptr<T>(),
                                                        out[0]->ptr<T>());
    });
  });
  if (!k) ops::fail_dtype(ctx);
  return k;
}

std::unique_ptr<Kernel> make_instance_norm(PrepareContext& ctx) {
  return row_norm(ctx, ops::prepare_instance_norm(ctx));
}

std::unique_ptr<Kernel> make_group_norm(PrepareContext& ctx) {
  return row_norm(ctx, ops::prepare_group_norm(ctx));  // opset 18: one scale/bias per group; 21: per channel
}

// BatchNormalization: one block per channel. Training mode normalises with the batch statistics and writes
// the running statistics (momentum blends, population variance); inference mode reads mean and var.
template <class T>
__global__ void batch_norm_kernel(Group G, int64_t channels, double eps, double momentum, bool training, const T* x,
                                  const T* s, const T* b, const T* mean, const T* var, T* y, T* run_mean, T* run_var) {
  for (int64_t ch = blockIdx.x; ch < channels; ch += gridDim.x) {
    double m = mean[ch], v = var[ch];
    if (training) {
      double bm, bv;
      moments(x, G, ch, bm, bv);
      if (threadIdx.x == 0) {
        if (run_mean) run_mean[ch] = static_cast<T>(m * momentum + bm * (1 - momentum));
        if (run_var) run_var[ch] = static_cast<T>(v * momentum + bv * (1 - momentum));
      }
      m = bm;
      v = bv;
    }
    const double a = s[ch] / sqrt(v + eps);
    const T ta = static_cast<T>(a), tk = static_cast<T>(b[ch] - m * a);
    for (int64_t e = threadIdx.x; e < G.count(); e += blockDim.x) {
      const int64_t i = G.at(ch, e);
      y[i] = x[i] * ta + tk;
    }
  }
}

// Channel ch of an (N, C, spatial...) tensor: N planes of `spatial`, C * spatial apart.
Group channel_groups(const ops::BatchNormAttrs& a) { return Group{a.n, a.plane, a.c * a.plane, a.plane}; }

std::unique_ptr<Kernel> make_batch_norm(PrepareContext& ctx) {
  const ops::BatchNormAttrs a = ops::prepare_batch_norm(ctx);
  const bool training = a.training;
  const double eps = a.eps, momentum = a.momentum;
  std::unique_ptr<Kernel> k;
  const Group g = channel_groups(a);
  const int64_t c = a.c;
  dispatch<float, double>(ctx.inputs[0].dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    k = group_kernel(c, "BatchNormalization kernel", [=](unsigned grid, Inputs in, Outputs out) {
      T* run_mean = training && out.size() > 1 && out[1] ? out[1]->ptr<T>() : nullptr;
      T* run_var = training && out.size() > 2 && out[2] ? out[2]->ptr<T>() : nullptr;
      batch_norm_kernel<T><<<grid, kBlock, 0, stream()>>>(g, c, eps, momentum, training, in[0]->ptr<T>(),
                                                          in[1]->ptr<T>(), in[2]->ptr<T>(), in[3]->ptr<T>(),
                                                          in[4]->ptr<T>(), out[0]->ptr<T>(), run_mean, run_var);
    });
  });
  if (!k) ops::fail_dtype(ctx);
  return k;
}

// ---- fused gradients ----------------------------------------------------------------------------------------

// LayerNormalizationGrad: per row (one block), with xh = (x - mean) * inv and g = dY * scale,
// dX = inv * (g - mean(g) - xh * mean(g * xh)). dScale and dBias are column sums over the rows, one thread
// per column.
template <class T>
__global__ void layer_norm_grad_kernel(int64_t rows, int64_t n, const T* dy, const T* x, const T* s, const T* mean,
                                       const T* inv, T* dx) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const double m = mean[r], is = inv[r];
    double acc[2] = {0.0, 0.0};
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const int64_t i = r * n + j;
      const double xh = (x[i] - m) * is, g = static_cast<double>(dy[i]) * s[j];
      acc[0] += g;
      acc[1] += g * xh;
    }
    block_sum(acc);
    const double a = acc[0] / static_cast<double>(n), b = acc[1] / static_cast<double>(n);
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const int64_t i = r * n + j;
      const double xh = (x[i] - m) * is;
      dx[i] = static_cast<T>(is * (static_cast<double>(dy[i]) * s[j] - a - xh * b));
    }
  }
}

template <class T>
__global__ void layer_norm_param_grad_kernel(int64_t rows, int64_t n, const T* dy, const T* x, const T* mean,
                                             const T* inv, T* dscale, T* dbias) {
  for (int64_t j = global_index(); j < n; j += grid_stride()) {
    double ds = 0, db = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = r * n + j;
      ds += dy[i] * ((x[i] - static_cast<double>(mean[r])) * inv[r]);
      db += dy[i];
    }
    if (dscale) dscale[j] = static_cast<T>(ds);
    if (dbias) dbias[j] = static_cast<T>(db);
  }
}

template <class T> class LayerNormGradKernel final : public Kernel {
 public:
  LayerNormGradKernel(int64_t rows, int64_t len) : rows_(rows), len_(len) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    if (len_ == 0) return;
    const T *dy = in[0]->ptr<T>(), *x = in[1]->ptr<T>(), *mean = in[3]->ptr<T>(), *inv = in[4]->ptr<T>();
    if (rows_ > 0 && out[0]) {  // dX is unnamed (null) when X needs no gradient (rules::fused_grads)
      layer_norm_grad_kernel<T><<<grid_for(rows_), kBlock, 0, stream()>>>(rows_, len_, dy, x, in[2]->ptr<T>(), mean,
                                                                         inv, out[0]->ptr<T>());
      check_launch("LayerNormalizationGrad kernel");
    }
    T* dscale = out.size() > 1 && out[1] ? out[1]->ptr<T>() : nullptr;
    T* dbias = out.size() > 2 && out[2] ? out[2]->ptr<T>() : nullptr;
    if (!dscale && !dbias) return;
    layer_norm_param_grad_kernel<T><<<blocks_for(len_), kBlock, 0, stream()>>>(rows_, len_, dy, x, mean, inv, dscale,
                                                                               dbias);
    check_launch("LayerNormalizationGrad scale/bias kernel");
  }

 private:
  int64_t rows_, len_;
};

std::unique_ptr<Kernel> make_layer_norm_grad(PrepareContext& ctx) {
  const ops::LayerNormGradGeometry geo = ops::prepare_layer_norm_grad(ctx);
  const int64_t rows = geo.rows, len = geo.len;
  std::unique_ptr<Kernel> k;
  dispatch<float, double>(ctx.inputs[0].dtype, [&](auto tag) {
    k = std::make_unique<LayerNormGradKernel<typename decltype(tag)::type>>(rows, len);
  });
  if (!k) ops::fail_dtype(ctx);
  return k;
}

// BatchNormalizationGrad: per channel (one block), the CPU kernel's sums and expressions
// (executor/cpu/norm.cpp): dBias = sum dY, dScale = rstd * sum(dY * xc),
// dX = scale * rstd * (dY - mean(dY)) - scale * rstd^3 * mean(dY * xc) * xc.
template <class T>
__global__ void batch_norm_grad_kernel(Group G, int64_t channels, double eps, const T* dy, const T* x, const T* s,
                                       T* dx, T* dscale, T* dbias) {
  const int64_t n = G.count();
  const double count = static_cast<double>(n);
  for (int64_t ch = blockIdx.x; ch < channels; ch += gridDim.x) {
    double s1[2] = {0.0, 0.0};
    for (int64_t e = threadIdx.x; e < n; e += blockDim.x) {
      const int64_t i = G.at(ch, e);
      s1[0] += x[i];
      s1[1] += dy[i];
    }
    block_sum(s1);
    const double mean = n ? s1[0] / count : 0.0, sdy = s1[1];
    double s2[2] = {0.0, 0.0};
    for (int64_t e = threadIdx.x; e < n; e += blockDim.x) {
      const int64_t i = G.at(ch, e);
      const double d = x[i] - mean;
      s2[0] += d * d;
      s2[1] += dy[i] * d;
    }
    block_sum(s2);
    const double rstd = 1.0 / sqrt((n ? s2[0] / count : 0.0) + eps), sdyx = s2[1];
    if (threadIdx.x == 0) {
      if (dbias) dbias[ch] = static_cast<T>(sdy);
      if (dscale) dscale[ch] = static_cast<T>(sdyx * rstd);
    }
    if (!n) continue;
    const double a = s[ch] * rstd;
    const T ta = static_cast<T>(a), tm = static_cast<T>(mean), tdm = static_cast<T>(sdy / count),
            tb = static_cast<T>(-a * rstd * rstd * sdyx / count);
    for (int64_t e = threadIdx.x; e < n; e += blockDim.x) {
      const int64_t i = G.at(ch, e);
      dx[i] = ta * (dy[i] - tdm) + tb * (x[i] - tm);
    }
  }
}

std::unique_ptr<Kernel> make_batch_norm_grad(PrepareContext& ctx) {
  const ops::BatchNormAttrs a = ops::prepare_batch_norm_grad(ctx);
  const double eps = a.eps;
  std::unique_ptr<Kernel> k;
  const Group g = channel_groups(a);
  const int64_t c = a.c;
  dispatch<float, double>(ctx.inputs[0].dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    k = group_kernel(c, "BatchNormalizationGrad kernel", [=](unsigned grid, Inputs in, Outputs out) {
      T* dscale = out.size() > 1 && out[1] ? out[1]->ptr<T>() : nullptr;
      T* dbias = out.size() > 2 && out[2] ? out[2]->ptr<T>() : nullptr;
      batch_norm_grad_kernel<T><<<grid, kBlock, 0, stream()>>>(g, c, eps, in[0]->ptr<T>(), in[1]->ptr<T>(),
                                                               in[2]->ptr<T>(), out[0]->ptr<T>(), dscale, dbias);
    });
  });
  if (!k) ops::fail_dtype(ctx);
  return k;
}

}  // namespace

void register_cuda_norm(KernelRegistry& r) {
  twin(r, "LayerNormalization", make_layer_norm);
  twin(r, "InstanceNormalization", make_instance_norm);
  twin(r, "GroupNormalization", make_group_norm);
  twin(r, "BatchNormalization", make_batch_norm);
  twin(r, "onnxtrain", "LayerNormalizationGrad", make_layer_norm_grad);
  twin(r, "onnxtrain", "BatchNormalizationGrad", make_batch_norm_grad);
}

}  // namespace onnxtrain::cuda
