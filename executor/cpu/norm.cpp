// LayerNormalization, InstanceNormalization, GroupNormalization and BatchNormalization on the CPU.
// All four normalise contiguous runs ("rows") of the input: LayerNormalization rows are everything from
// `axis` on; InstanceNormalization rows are one (n, c) plane; GroupNormalization rows are one (n, group)
// block of C/G planes. Rows are independent, so those three run one row per task (OpenMP over rows).
// BatchNormalization reduces over (N, spatial) per channel, which is N strided planes per channel: the
// statistics run one channel per task and the affine pass one (n, c) plane per task.
// Statistics are accumulated in double and the variance is taken about the mean (two passes), which is
// what the ONNX reference computes and avoids the cancellation of E[x^2] - E[x]^2.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "executor/cpu/kernel_util.h"
#include "executor/kernel.h"
#include "executor/ops/norm.h"
#include "graph/error.h"

namespace onnxtrain {
namespace {

constexpr int64_t kParallelWork = 1 << 14;  // elements below which threads cost more than they save

int64_t prod(const std::vector<int64_t>& s, size_t from, size_t to) {
  int64_t p = 1;
  for (size_t i = from; i < to; ++i) p *= s[i];
  return p;
}

// Mean and population variance of `runs` runs of `len` contiguous values, `stride` apart: one run for a
// LayerNormalization/InstanceNormalization/GroupNormalization row, a channel's N planes for BatchNormalization.
struct Moments {
  double mean = 0, var = 0;
  double inv_std(double eps) const { return 1.0 / std::sqrt(var + eps); }
};
template <class T> Moments moments(const T* x, int64_t runs, int64_t len, int64_t stride) {
  const double count = static_cast<double>(runs * len);
  if (count == 0) return {};
  double s = 0;
  for (int64_t i = 0; i < runs; ++i)
    for (int64_t j = 0; j < len; ++j) s += x[i * stride + j];
  Moments m;
  m.mean = s / count;
  double v = 0;
  for (int64_t i = 0; i < runs; ++i)
    for (int64_t j = 0; j < len; ++j) {
      const double d = x[i * stride + j] - m.mean;
      v += d * d;
    }
  m.var = v / count;
  return m;
}

template <class F> std::unique_ptr<Kernel> float_kernel(PrepareContext& ctx, DType t, F&& make) {
  if (t == DType::Float32) return make(cpu::Tag<float>{});
  if (t == DType::Float64) return make(cpu::Tag<double>{});
  cpu::fail_dtype(ctx);
}

// ---- LayerNormalization ------------------------------------------------------------------------------------

// For each element j of a normalised row, the index into scale (or bias) broadcast to the row's shape;
// empty when the tensor already has the row's shape (the common case, indexed directly). The op layer has
// checked that s broadcasts (ops::prepare_layer_norm).
std::vector<int64_t> broadcast_index(const std::vector<int64_t>& row_shape, const std::vector<int64_t>& s) {
  if (s == row_shape) return {};
  const size_t off = row_shape.size() - s.size();
  const int64_t n = prod(row_shape, 0, row_shape.size());
  std::vector<int64_t> idx(n);
  const std::vector<int64_t> ss = cpu::contiguous_strides(s);
  for (int64_t j = 0; j < n; ++j) {
    int64_t rem = j, k = 0;
    for (size_t d = row_shape.size(); d-- > 0;) {
      const int64_t c = rem % row_shape[d];
      rem /= row_shape[d];
      if (d >= off && s[d - off] != 1) k += c * ss[d - off];
    }
    idx[j] = k;
  }
  return idx;
}

// T: X's type; U: the statistics outputs' type (stash_type).
template <class T, class U> class LayerNormKernel final : public Kernel {
 public:
  LayerNormKernel(int64_t rows, int64_t len, double eps, std::vector<int64_t> si, std::vector<int64_t> bi)
      : rows_(rows), len_(len), eps_(eps), si_(std::move(si)), bi_(std::move(bi)) {}

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const T* x = in[0]->ptr<T>();
    const T* s = in[1]->ptr<T>();
    const T* b = in.size() > 2 && in[2] ? in[2]->ptr<T>() : nullptr;
    T* y = out[0]->ptr<T>();
    U* mean_out = out.size() > 1 && out[1] ? out[1]->ptr<U>() : nullptr;
    U* inv_out = out.size() > 2 && out[2] ? out[2]->ptr<U>() : nullptr;
    const int64_t n = len_;
    const int64_t* si = si_.empty() ? nullptr : si_.data();
    const int64_t* bi = bi_.empty() ? nullptr : bi_.data();
    cpu::parallel_for(rows_, rows_ * n > kParallelWork, [&](int64_t r) {
      const T* xr = x + r * n;
      T* yr = y + r * n;
      const Moments mo = moments(xr, 1, n, n);
      const double m = mo.mean, is = mo.inv_std(eps_);
      const T tm = static_cast<T>(m), ti = static_cast<T>(is);
      if (mean_out) mean_out[r] = static_cast<U>(m);
      if (inv_out) inv_out[r] = static_cast<U>(is);
      if (!si && !bi) {
        if (b)
          for (int64_t j = 0; j < n; ++j) yr[j] = (xr[j] - tm) * ti * s[j] + b[j];
        else
          for (int64_t j = 0; j < n; ++j) yr[j] = (xr[j] - tm) * ti * s[j];
      } else {
        for (int64_t j = 0; j < n; ++j) {
          T v = (xr[j] - tm) * ti * s[si ? si[j] : j];
          if (b) v += b[bi ? bi[j] : j];
          yr[j] = v;
        }
      }
    });
  }

 private:
  int64_t rows_, len_;
  double eps_;
  std::vector<int64_t> si_, bi_;
};

std::unique_ptr<Kernel> make_layer_norm(PrepareContext& ctx) {
  const ops::LayerNormAttrs a = ops::prepare_layer_norm(ctx);
  std::vector<int64_t> si = broadcast_index(a.row_shape, ctx.inputs[1].shape);
  std::vector<int64_t> bi = a.has_bias ? broadcast_index(a.row_shape, ctx.inputs[2].shape) : std::vector<int64_t>{};
  return float_kernel(ctx, ctx.inputs[0].dtype, [&](auto tag) -> std::unique_ptr<Kernel> {
    using T = typename decltype(tag)::type;
    if (a.stash == DType::Float32) return std::make_unique<LayerNormKernel<T, float>>(a.rows, a.len, a.eps, si, bi);
    return std::make_unique<LayerNormKernel<T, double>>(a.rows, a.len, a.eps, si, bi);
  });
}

// ---- InstanceNormalization and GroupNormalization -----------------------------------------------------------
// Rows of `len` elements; the affine parameters change every `plane` elements, and row r's first element
// uses parameter (r * len / plane) % channels.

template <class T> class RowNormKernel final : public Kernel {
 public:
  RowNormKernel(int64_t rows, int64_t len, int64_t plane, int64_t channels, double eps)
      : rows_(rows), len_(len), plane_(plane), channels_(channels), eps_(eps) {}

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const T* x = in[0]->ptr<T>();
    const T* s = in[1]->ptr<T>();
    const T* b = in[2]->ptr<T>();
    T* y = out[0]->ptr<T>();
    const int64_t n = len_, plane = plane_, per_row = plane ? len_ / plane : 0;
    cpu::parallel_for(rows_, rows_ * n > kParallelWork, [&](int64_t r) {
      const T* xr = x + r * n;
      T* yr = y + r * n;
      const Moments mo = moments(xr, 1, n, n);
      const double m = mo.mean, is = mo.inv_std(eps_);
      for (int64_t p = 0; p < per_row; ++p) {
        const int64_t c = (r * per_row + p) % channels_;
        // y = x * a + k with a = scale * inv_std, k = bias - mean * a: one multiply-add per element.
        const T a = static_cast<T>(s[c] * is);
        const T k = static_cast<T>(b[c] - m * s[c] * is);
        const T* xp = xr + p * plane;
        T* yp = yr + p * plane;
        for (int64_t j = 0; j < plane; ++j) yp[j] = xp[j] * a + k;
      }
    });
  }

 private:
  int64_t rows_, len_, plane_, channels_;
  double eps_;
};

std::unique_ptr<Kernel> make_instance_norm(PrepareContext& ctx) {
  const ops::RowNormGeometry g = ops::prepare_instance_norm(ctx);
  return float_kernel(ctx, ctx.inputs[0].dtype, [&](auto tag) -> std::unique_ptr<Kernel> {
    return std::make_unique<RowNormKernel<typename decltype(tag)::type>>(g.rows, g.len, g.plane, g.channels, g.eps);
  });
}

std::unique_ptr<Kernel> make_group_norm(PrepareContext& ctx) {
  const ops::RowNormGeometry g = ops::prepare_group_norm(ctx);
  return float_kernel(ctx, ctx.inputs[0].dtype, [&](auto tag) -> std::unique_ptr<Kernel> {
    return std::make_unique<RowNormKernel<typename decltype(tag)::type>>(g.rows, g.len, g.plane, g.channels, g.eps);
  });
}

// ---- BatchNormalization -----------------------------------------------------------------------------------

template <class T> class BatchNormKernel final : public Kernel {
 public:
  BatchNormKernel(int64_t n, int64_t c, int64_t plane, double eps, double momentum, bool training)
      : n_(n), c_(c), plane_(plane), eps_(eps), momentum_(momentum), training_(training), a_(c), k_(c) {}

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const T* x = in[0]->ptr<T>();
    const T* s = in[1]->ptr<T>();
    const T* b = in[2]->ptr<T>();
    const T* mean = in[3]->ptr<T>();
    const T* var = in[4]->ptr<T>();
    T* y = out[0]->ptr<T>();
    T* run_mean = training_ && out.size() > 1 && out[1] ? out[1]->ptr<T>() : nullptr;
    T* run_var = training_ && out.size() > 2 && out[2] ? out[2]->ptr<T>() : nullptr;
    const int64_t n = n_, c = c_, plane = plane_;
    cpu::parallel_for(c, n * c * plane > kParallelWork, [&](int64_t ch) {
      double m = mean[ch], v = var[ch];
      if (training_) {
        const Moments bm = moments(x + ch * plane, n, plane, c * plane);  // population variance, as ONNX's
        if (run_mean) run_mean[ch] = static_cast<T>(m * momentum_ + bm.mean * (1 - momentum_));
        if (run_var) run_var[ch] = static_cast<T>(v * momentum_ + bm.var * (1 - momentum_));
        m = bm.mean;
        v = bm.var;
      }
      const double a = s[ch] / std::sqrt(v + eps_);
      a_[ch] = static_cast<T>(a);
      k_[ch] = static_cast<T>(b[ch] - m * a);
    });
    const int64_t planes = n * c;
    cpu::parallel_for(planes, planes * plane > kParallelWork, [&](int64_t r) {
      const int64_t ch = r % c;
      const T a = a_[ch], k = k_[ch];
      const T* xp = x + r * plane;
      T* yp = y + r * plane;
      for (int64_t j = 0; j < plane; ++j) yp[j] = xp[j] * a + k;
    });
  }

 private:
  int64_t n_, c_, plane_;
  double eps_, momentum_;
  bool training_;
  std::vector<T> a_, k_;  // per-channel y = x * a + k, scratch reused across runs
};

std::unique_ptr<Kernel> make_batch_norm(PrepareContext& ctx) {
  const ops::BatchNormAttrs a = ops::prepare_batch_norm(ctx);
  return float_kernel(ctx, ctx.inputs[0].dtype, [&](auto tag) -> std::unique_ptr<Kernel> {
    return std::make_unique<BatchNormKernel<typename decltype(tag)::type>>(a.n, a.c, a.plane, a.eps, a.momentum,
                                                                            a.training);
  });
}

// ---- onnxtrain.BatchNormalizationGrad ----------------------------------------------------------------------
// (dY, X, Scale) -> (dX, dScale, dBias), attribute epsilon: the gradient of training-mode BatchNormalization
// through its Y. The batch statistics are recomputed from X (opset 14+ BatchNormalization does not output
// them). Per channel, over its N planes (M elements), with xc = x - mean and rstd = (var + eps)^-1/2:
//   dBias = sum dY,  dScale = rstd * sum(dY * xc),
//   dX = scale * rstd * (dY - dBias / M - xc * rstd * dScale / M).
// One task per channel: two read passes (sums of x and dY; then of xc^2 and dY * xc) and the write pass,
// with the channel's data still in cache. Nothing is allocated per run.

template <class T> class BatchNormGradKernel final : public Kernel {
 public:
  BatchNormGradKernel(int64_t n, int64_t c, int64_t plane, double eps) : n_(n), c_(c), plane_(plane), eps_(eps) {}

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const T* dy = in[0]->ptr<T>();
    const T* x = in[1]->ptr<T>();
    const T* s = in[2]->ptr<T>();
    T* dx = out[0]->ptr<T>();
    T* dscale = out.size() > 1 && out[1] ? out[1]->ptr<T>() : nullptr;
    T* dbias = out.size() > 2 && out[2] ? out[2]->ptr<T>() : nullptr;
    const int64_t n = n_, c = c_, plane = plane_, stride = c * plane;
    const double count = static_cast<double>(n * plane);
    cpu::parallel_for(c, n * c * plane > kParallelWork, [&](int64_t ch) {
      const int64_t first = ch * plane;
      double sx = 0, sdy = 0;
      for (int64_t i = 0; i < n; ++i) {
        const T *xp = x + first + i * stride, *dp = dy + first + i * stride;
#pragma omp simd reduction(+ : sx, sdy)  // reassociated: the sums vectorise
        for (int64_t j = 0; j < plane; ++j) {
          sx += xp[j];
          sdy += dp[j];
        }
      }
      const double mean = count ? sx / count : 0.0;
      double sxx = 0, sdyx = 0;
      for (int64_t i = 0; i < n; ++i) {
        const T *xp = x + first + i * stride, *dp = dy + first + i * stride;
#pragma omp simd reduction(+ : sxx, sdyx)
        for (int64_t j = 0; j < plane; ++j) {
          const double d = xp[j] - mean;
          sxx += d * d;
          sdyx += dp[j] * d;
        }
      }
      const double rstd = 1.0 / std::sqrt((count ? sxx / count : 0.0) + eps_);
      if (dbias) dbias[ch] = static_cast<T>(sdy);
      if (dscale) dscale[ch] = static_cast<T>(sdyx * rstd);
      if (!count) return;
      // dX = a * (dY - mean(dY)) + b * xc, with b = -a * rstd^2 * mean(dY * xc).
      const double a = s[ch] * rstd;
      const T ta = static_cast<T>(a), tm = static_cast<T>(mean), tdm = static_cast<T>(sdy / count),
              tb = static_cast<T>(-a * rstd * rstd * sdyx / count);
      for (int64_t i = 0; i < n; ++i) {
        const T *xp = x + first + i * stride, *dp = dy + first + i * stride;
        T* dxp = dx + first + i * stride;
#pragma omp simd
        for (int64_t j = 0; j < plane; ++j) dxp[j] = ta * (dp[j] - tdm) + tb * (xp[j] - tm);
      }
    });
  }

 private:
  int64_t n_, c_, plane_;
  double eps_;
};

std::unique_ptr<Kernel> make_batch_norm_grad(PrepareContext& ctx) {
  const ops::BatchNormAttrs a = ops::prepare_batch_norm_grad(ctx);
  return float_kernel(ctx, ctx.inputs[0].dtype, [&](auto tag) -> std::unique_ptr<Kernel> {
    return std::make_unique<BatchNormGradKernel<typename decltype(tag)::type>>(a.n, a.c, a.plane, a.eps);
  });
}

// ---- onnxtrain.LayerNormalizationGrad ----------------------------------------------------------------------
// (dY, X, Scale, Mean, InvStdDev) -> (dX, dScale, dBias) over rows of X from `axis` on; Mean and InvStdDev
// have one value per row. Per row, with xhat = (x - mean) * inv and g = dY * scale:
//   dX = inv * (g - mean(g) - xhat * mean(g * xhat)),  dScale = sum_rows dY * xhat,  dBias = sum_rows dY.
// The row loop is parallel; dScale and dBias are column sums, accumulated per thread and combined after.

template <class T> class LayerNormGradKernel final : public Kernel {
 public:
  LayerNormGradKernel(int64_t rows, int64_t len)
      : rows_(rows), len_(len), threads_(std::max(1, omp_get_max_threads())),
        partial_(static_cast<size_t>(threads_) * 2 * len) {}

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const T* dy = in[0]->ptr<T>();
    const T* x = in[1]->ptr<T>();
    const T* s = in[2]->ptr<T>();
    const T* mean = in[3]->ptr<T>();
    const T* inv = in[4]->ptr<T>();
    // Unnamed outputs (gradients nothing reads, rules::fused_grads) arrive null and are not computed.
    T* dx = out[0] ? out[0]->ptr<T>() : nullptr;
    T* dscale = out.size() > 1 && out[1] ? out[1]->ptr<T>() : nullptr;
    T* dbias = out.size() > 2 && out[2] ? out[2]->ptr<T>() : nullptr;
    const bool params = dscale || dbias;
    const int64_t n = len_, rows = rows_;
    if (params) std::fill(partial_.begin(), partial_.end(), 0.0);
    const bool parallel = rows > 1 && rows * n > kParallelWork;
    int used = 1;
#pragma omp parallel if (parallel) num_threads(threads_)  // partial_ has room for threads_ threads
    {
      const int t = omp_get_thread_num();
#pragma omp single
      used = omp_get_num_threads();
      double* ds = partial_.data() + static_cast<size_t>(t) * 2 * n;
      double* db = ds + n;
#pragma omp for schedule(static)
      for (int64_t r = 0; r < rows; ++r) {
        const T* dyr = dy + r * n;
        const T* xr = x + r * n;
        const double m = mean[r], is = inv[r];
        if (params) {
#pragma omp simd
          for (int64_t j = 0; j < n; ++j) {
            ds[j] += dyr[j] * ((xr[j] - m) * is);
            db[j] += dyr[j];
          }
        }
        if (!dx) continue;
        T* dxr = dx + r * n;
        double sg = 0, sgx = 0;
        // omp simd: lets the compiler reassociate the two row sums, so the loop vectorises (scalar double
        // loops left this kernel no faster than its inlined body).
#pragma omp simd reduction(+ : sg, sgx)
        for (int64_t j = 0; j < n; ++j) {
          const double xh = (xr[j] - m) * is;
          const double g = static_cast<double>(dyr[j]) * s[j];
          sg += g;
          sgx += g * xh;
        }
        const double a = sg / static_cast<double>(n), b = sgx / static_cast<double>(n);
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) {
          const double xh = (xr[j] - m) * is;
          dxr[j] = static_cast<T>(is * (static_cast<double>(dyr[j]) * s[j] - a - xh * b));
        }
      }
    }
    if (!params) return;
    for (int64_t j = 0; j < n; ++j) {
      double a = 0, b = 0;
      for (int t = 0; t < used; ++t) {
        a += partial_[static_cast<size_t>(t) * 2 * n + j];
        b += partial_[static_cast<size_t>(t) * 2 * n + n + j];
      }
      if (dscale) dscale[j] = static_cast<T>(a);
      if (dbias) dbias[j] = static_cast<T>(b);
    }
  }

 private:
  int64_t rows_, len_;
  int threads_;
  std::vector<double> partial_;  // per thread: dScale then dBias partial sums
};

std::unique_ptr<Kernel> make_layer_norm_grad(PrepareContext& ctx) {
  const ops::LayerNormGradGeometry g = ops::prepare_layer_norm_grad(ctx);
  return float_kernel(ctx, ctx.inputs[0].dtype, [&](auto tag) -> std::unique_ptr<Kernel> {
    return std::make_unique<LayerNormGradKernel<typename decltype(tag)::type>>(g.rows, g.len);
  });
}

// ---- LpNormalization ---------------------------------------------------------------------------------------
// y = x / ||x||_p along `axis` (p = 1 or 2), as the ONNX reference computes it: no epsilon, so an all-zero
// vector gives 0/0 = NaN there too. The input is viewed as [outer, len, inner]; one (outer, inner) vector
// per task.

template <class T> class LpNormKernel final : public Kernel {
 public:
  LpNormKernel(int64_t outer, int64_t len, int64_t inner, int64_t p) : outer_(outer), len_(len), inner_(inner), p_(p) {}

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const T* x = in[0]->ptr<T>();
    T* y = out[0]->ptr<T>();
    const int64_t len = len_, inner = inner_, vectors = outer_ * inner_;
    cpu::parallel_for(vectors, vectors * len > kParallelWork, [&](int64_t v) {
      const int64_t base = (v / inner) * len * inner + v % inner;
      double n = 0;
      for (int64_t j = 0; j < len; ++j) {
        const double e = x[base + j * inner];
        n += p_ == 1 ? std::abs(e) : e * e;
      }
      if (p_ == 2) n = std::sqrt(n);
      for (int64_t j = 0; j < len; ++j) y[base + j * inner] = static_cast<T>(x[base + j * inner] / n);
    });
  }

 private:
  int64_t outer_, len_, inner_, p_;
};

std::unique_ptr<Kernel> make_lp_norm(PrepareContext& ctx) {
  const KernelInput& x = cpu::required_input(ctx, 0, "input");
  const auto rank = static_cast<int64_t>(x.shape.size());
  if (rank == 0) ctx.fail("input must have rank >= 1, got a scalar");
  const int64_t axis = cpu::normalize_axis(ctx, ctx.node.attr_int("axis", -1), rank);
  const int64_t p = ctx.node.attr_int("p", 2);
  if (p != 1 && p != 2) ctx.fail("attribute 'p' must be 1 or 2, got " + std::to_string(p));
  cpu::set_output(ctx, 0, x.dtype, x.shape);
  const int64_t outer = prod(x.shape, 0, axis), len = x.shape[axis], inner = prod(x.shape, axis + 1, rank);
  return float_kernel(ctx, x.dtype, [&](auto tag) -> std::unique_ptr<Kernel> {
    return std::make_unique<LpNormKernel<typename decltype(tag)::type>>(outer, len, inner, p);
  });
}

// ---- MeanVarianceNormalization -----------------------------------------------------------------------------
// y = (x - E[x]) / (sqrt(E[(x - E[x])^2]) + 1e-9) over `axes` (default [0, 2, 3]): the schema's function body
// takes sqrt(E[x^2] - E[x]^2) and adds 1e-9 to the standard deviation; the variance is taken about the mean
// here (the same value without the cancellation). Each element belongs to the group of its non-reduced
// coordinates; group ids are computed once at plan time.

template <class T> class MvnKernel final : public Kernel {
 public:
  MvnKernel(std::vector<int64_t> group, int64_t groups) : group_(std::move(group)), sum_(groups), sq_(groups), cnt_(groups) {}

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const T* x = in[0]->ptr<T>();
    T* y = out[0]->ptr<T>();
    const auto n = static_cast<int64_t>(group_.size());
    std::fill(sum_.begin(), sum_.end(), 0.0);
    std::fill(sq_.begin(), sq_.end(), 0.0);
    std::fill(cnt_.begin(), cnt_.end(), 0.0);
    for (int64_t i = 0; i < n; ++i) {
      sum_[group_[i]] += x[i];
      cnt_[group_[i]] += 1;
    }
    for (size_t g = 0; g < sum_.size(); ++g) sum_[g] /= cnt_[g];  // the mean
    for (int64_t i = 0; i < n; ++i) {
      const double d = x[i] - sum_[group_[i]];
      sq_[group_[i]] += d * d;
    }
    for (size_t g = 0; g < sq_.size(); ++g) sq_[g] = std::sqrt(sq_[g] / cnt_[g]) + 1e-9;  // the divisor
    for (int64_t i = 0; i < n; ++i) y[i] = static_cast<T>((x[i] - sum_[group_[i]]) / sq_[group_[i]]);
  }

 private:
  std::vector<int64_t> group_;
  std::vector<double> sum_, sq_, cnt_;
};

std::unique_ptr<Kernel> make_mvn(PrepareContext& ctx) {
  const KernelInput& x = cpu::required_input(ctx, 0, "X");
  const auto rank = static_cast<int64_t>(x.shape.size());
  std::vector<int64_t> axes = ctx.node.has_attr("axes") ? ctx.node.attr_ints("axes") : std::vector<int64_t>{0, 2, 3};
  std::vector<bool> reduced(rank, false);
  for (int64_t a : axes) {
    const int64_t n = cpu::normalize_axis(ctx, a, rank, "axes");
    if (reduced[n]) ctx.fail("axis " + std::to_string(a) + " appears twice in 'axes'");
    reduced[n] = true;
  }
  cpu::set_output(ctx, 0, x.dtype, x.shape);
  // Group id = the flat index over the kept dims.
  const int64_t total = prod(x.shape, 0, rank);
  std::vector<int64_t> group(total);
  int64_t groups = 1;
  for (int64_t d = 0; d < rank; ++d)
    if (!reduced[d]) groups *= x.shape[d];
  for (int64_t i = 0; i < total; ++i) {
    int64_t rem = i, g = 0, scale = 1;
    for (int64_t d = rank; d-- > 0;) {
      const int64_t c = rem % x.shape[d];
      rem /= x.shape[d];
      if (!reduced[d]) {
        g += c * scale;
        scale *= x.shape[d];
      }
    }
    group[i] = g;
  }
  return float_kernel(ctx, x.dtype, [&](auto tag) -> std::unique_ptr<Kernel> {
    return std::make_unique<MvnKernel<typename decltype(tag)::type>>(std::move(group), groups);
  });
}

// ---- LRN ---------------------------------------------------------------------------------------------------
// y = x / (bias + alpha / size * S)^beta, S[n, c, ...] = sum of x^2 over channels
// [c - floor((size - 1) / 2), c + ceil((size - 1) / 2)] clipped to [0, C). Input [N, C, D1, ...].

template <class T> class LrnKernel final : public Kernel {
 public:
  LrnKernel(int64_t n, int64_t c, int64_t plane, int64_t size, double alpha, double beta, double bias)
      : n_(n), c_(c), plane_(plane), size_(size), alpha_(alpha), beta_(beta), bias_(bias) {}

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const T* x = in[0]->ptr<T>();
    T* y = out[0]->ptr<T>();
    const int64_t c1 = (size_ - 1) / 2, c2 = size_ / 2;  // floor and ceil of (size - 1) / 2
    const int64_t planes = n_ * c_;
    cpu::parallel_for(planes, planes * plane_ > kParallelWork, [&](int64_t r) {
      const int64_t b = r / c_, ch = r % c_;
      const int64_t lo = std::max<int64_t>(0, ch - c1), hi = std::min(c_ - 1, ch + c2);
      for (int64_t j = 0; j < plane_; ++j) {
        double s = 0;
        for (int64_t k = lo; k <= hi; ++k) {
          const double v = x[(b * c_ + k) * plane_ + j];
          s += v * v;
        }
        const int64_t i = r * plane_ + j;
        y[i] = static_cast<T>(x[i] / std::pow(bias_ + alpha_ / static_cast<double>(size_) * s, beta_));
      }
    });
  }

 private:
  int64_t n_, c_, plane_, size_;
  double alpha_, beta_, bias_;
};

std::unique_ptr<Kernel> make_lrn(PrepareContext& ctx) {
  const KernelInput& x = cpu::required_input(ctx, 0, "X");
  if (x.shape.size() < 3) ctx.fail("input X must have rank >= 3 (N, C, D1, ...), got " + shape_string(x.shape));
  if (!ctx.node.has_attr("size")) ctx.fail("attribute 'size' is required");
  const int64_t size = ctx.node.attr_int("size", 1);
  if (size <= 0) ctx.fail("attribute 'size' must be positive, got " + std::to_string(size));
  cpu::set_output(ctx, 0, x.dtype, x.shape);
  const double alpha = ctx.node.attr_float("alpha", 1e-4f), beta = ctx.node.attr_float("beta", 0.75f),
               bias = ctx.node.attr_float("bias", 1.0f);
  const int64_t plane = prod(x.shape, 2, x.shape.size());
  return float_kernel(ctx, x.dtype, [&](auto tag) -> std::unique_ptr<Kernel> {
    return std::make_unique<LrnKernel<typename decltype(tag)::type>>(x.shape[0], x.shape[1], plane, size, alpha, beta,
                                                                      bias);
  });
}

}  // namespace

void register_cpu_norm(KernelRegistry& r) {
  const std::vector<DType> flt = {DType::Float32, DType::Float64};
  cpu::add(r, "LayerNormalization", 17, flt, make_layer_norm);
  cpu::add(r, "InstanceNormalization", 6, flt, make_instance_norm);
  cpu::add(r, "GroupNormalization", 18, flt, make_group_norm);
  cpu::add(r, "BatchNormalization", 9, flt, make_batch_norm);
  cpu::add(r, "LpNormalization", 1, flt, make_lp_norm);
  cpu::add(r, "MeanVarianceNormalization", 9, flt, make_mvn);
  cpu::add(r, "LRN", 1, flt, make_lrn);
  cpu::add(r, "onnxtrain", "LayerNormalizationGrad", 1, flt, make_layer_norm_grad);
  cpu::add(r, "onnxtrain", "BatchNormalizationGrad", 1, flt, make_batch_norm_grad);
}

}  // namespace onnxtrain
