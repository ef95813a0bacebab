// Softmax, LogSoftmax and their fused gradients (onnxtrain.SoftmaxGrad, onnxtrain.LogSoftmaxGrad) on the CPU.
// Every op normalises over `len` elements that sit `inner` apart, for each of `outer * inner` lanes:
//   opset 13+:  one axis, outer = prod(dims before), len = dims[axis], inner = prod(dims after);
//   opset 1-12: the input coerced to 2-D at axis, so len = prod(dims from axis on) and inner = 1.
// inner == 1 (the usual last-axis case) is the contiguous-rows fast path, parallel over rows. Otherwise a task
// is a block of up to kBlock neighbouring lanes, walked axis element by axis element so every access is a
// contiguous run of the block (no transpose, no strided gathers). Sums are accumulated in double: rows of
// thousands of float terms (vocabularies) otherwise lose digits. exp runs through Eigen's packet maths
// (executor/cpu/eigen_map.h): scalar expf was most of these kernels' time.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>

#include "executor/cpu/eigen_map.h"
#include "executor/cpu/kernel_util.h"
#include "executor/ops/softmax_layout.h"
#include "executor/kernel.h"
#include "graph/error.h"

namespace onnxtrain {
namespace {

constexpr int64_t kBlock = 64;             // lanes per task on the strided path
constexpr int64_t kParallelWork = 1 << 14;  // elements below which threads cost more than they save

using Layout = ops::SoftmaxLayout;

// Runs body(base, w) over every (outer index o, block of lanes [i0, i0 + w)), one task each, where base is the
// offset of the block's first element. With inner == 1 a block is one whole row.
template <class Body> void for_each_block(const Layout& l, Body&& body) {
  if (l.len == 0) return;
  const int64_t blocks = l.inner == 1 ? 1 : (l.inner + kBlock - 1) / kBlock;
  const int64_t tasks = l.outer * blocks;
  const bool parallel = tasks > 1 && l.outer * l.len * l.inner > kParallelWork;
  cpu::parallel_for(tasks, parallel, [&](int64_t t) {
    const int64_t o = t / blocks, b = t % blocks;
    const int64_t i0 = b * kBlock;
    body(o * l.len * l.inner + i0, std::min<int64_t>(kBlock, l.inner - i0));
  });
}

// ---- forward ---------------------------------------------------------------------------------------------

template <class T, bool Log> class SoftmaxKernel final : public Kernel {
 public:
  explicit SoftmaxKernel(Layout l) : l_(l) {}

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const T* x = in[0]->ptr<T>();
    T* y = out[0]->ptr<T>();
    const Layout l = l_;
    for_each_block(l, [&](int64_t base, int64_t w) {
      if (l.inner == 1)
        row(x + base, y + base, l.len);
      else
        block(x + base, y + base, l.len, l.inner, w);
    });
  }

 private:
  using A = cpu::EigenArray<T>;
  using CMap = Eigen::Map<const A>;
  using Map = Eigen::Map<A>;

  static void row(const T* x, T* y, int64_t n) {
    const CMap xs(x, n);
    Map ys(y, n);
    const T m = xs.maxCoeff();
    ys = (xs - m).exp();
    const double s = cpu::sum_as_double(y, n);
    if constexpr (Log) {
      // (x - m) - log(s), not x - (m + log(s)): m + log(s) rounds away log(s)'s digits when m is large.
      ys = (xs - m) - static_cast<T>(std::log(s));
    } else {
      ys *= static_cast<T>(1.0 / s);
    }
  }

  static void block(const T* x, T* y, int64_t n, int64_t stride, int64_t w) {
    T mb[kBlock];
    double s[kBlock];
    Map m(mb, w);
    m.setConstant(-std::numeric_limits<T>::infinity());
    std::fill(s, s + w, 0.0);
    for (int64_t j = 0; j < n; ++j) m = m.max(CMap(x + j * stride, w));
    for (int64_t j = 0; j < n; ++j) {
      Map yj(y + j * stride, w);
      yj = (CMap(x + j * stride, w) - m).exp();
      for (int64_t i = 0; i < w; ++i) s[i] += yj[i];
    }
    T fb[kBlock];
    Map f(fb, w);
    if constexpr (Log) {
      for (int64_t i = 0; i < w; ++i) fb[i] = static_cast<T>(std::log(s[i]));
      for (int64_t j = 0; j < n; ++j) Map(y + j * stride, w) = (CMap(x + j * stride, w) - m) - f;
    } else {
      for (int64_t i = 0; i < w; ++i) fb[i] = static_cast<T>(1.0 / s[i]);
      for (int64_t j = 0; j < n; ++j) Map(y + j * stride, w) *= f;
    }
  }

  Layout l_;
};

template <bool Log> std::unique_ptr<Kernel> make_softmax(PrepareContext& ctx) {
  const Layout l = ops::prepare_softmax(ctx, false);
  const KernelInput& x = ctx.inputs[0];
  if (x.dtype == DType::Float32) return std::make_unique<SoftmaxKernel<float, Log>>(l);
  if (x.dtype == DType::Float64) return std::make_unique<SoftmaxKernel<double, Log>>(l);
  ctx.fail("unsupported dtype " + dtype_name(x.dtype) + " (float32, float64)");
}

// ---- fused gradients -------------------------------------------------------------------------------------
// SoftmaxGrad:    dX = Y * (dY - sum(dY * Y))
// LogSoftmaxGrad: dX = dY - exp(Y) * sum(dY)

template <class T, bool Log> class SoftmaxGradKernel final : public Kernel {
 public:
  explicit SoftmaxGradKernel(Layout l) : l_(l) {}

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const T* dy = in[0]->ptr<T>();
    const T* y = in[1]->ptr<T>();
    T* dx = out[0]->ptr<T>();
    const Layout l = l_;
    for_each_block(l, [&](int64_t base, int64_t w) {
      if (l.inner == 1)
        row(dy + base, y + base, dx + base, l.len);
      else
        block(dy + base, y + base, dx + base, l.len, l.inner, w);
    });
  }

 private:
  using A = cpu::EigenArray<T>;
  using CMap = Eigen::Map<const A>;
  using Map = Eigen::Map<A>;

  static void row(const T* dy, const T* y, T* dx, int64_t n) {
    const CMap dys(dy, n), ys(y, n);
    if constexpr (Log)
      Map(dx, n) = dys - ys.exp() * static_cast<T>(cpu::sum_as_double(dy, n));
    else
      Map(dx, n) = ys * (dys - static_cast<T>(cpu::dot_as_double(dy, y, n)));
  }

  static void block(const T* dy, const T* y, T* dx, int64_t n, int64_t stride, int64_t w) {
    double s[kBlock];
    std::fill(s, s + w, 0.0);
    for (int64_t j = 0; j < n; ++j)
      for (int64_t i = 0; i < w; ++i) {
        const int64_t k = j * stride + i;
        if constexpr (Log)
          s[i] += dy[k];
        else
          s[i] += static_cast<double>(dy[k]) * y[k];
      }
    T tb[kBlock];
    for (int64_t i = 0; i < w; ++i) tb[i] = static_cast<T>(s[i]);
    const CMap ts(tb, w);
    for (int64_t j = 0; j < n; ++j) {
      const CMap dyj(dy + j * stride, w), yj(y + j * stride, w);
      if constexpr (Log)
        Map(dx + j * stride, w) = dyj - yj.exp() * ts;
      else
        Map(dx + j * stride, w) = yj * (dyj - ts);
    }
  }

  Layout l_;
};

template <bool Log> std::unique_ptr<Kernel> make_softmax_grad(PrepareContext& ctx) {
  const Layout l = ops::prepare_softmax(ctx, true);
  const KernelInput& dy = ctx.inputs[0];
  if (dy.dtype == DType::Float32) return std::make_unique<SoftmaxGradKernel<float, Log>>(l);
  if (dy.dtype == DType::Float64) return std::make_unique<SoftmaxGradKernel<double, Log>>(l);
  ctx.fail("unsupported dtype " + dtype_name(dy.dtype) + " (float32, float64)");
}

}  // namespace

void register_cpu_softmax(KernelRegistry& r) {
  // One factory per op: it reads the model's opset to pick the coerced-2-D (1-12) or single-axis (13+) form.
  const std::vector<DType> flt = {DType::Float32, DType::Float64};
  cpu::add(r, "Softmax", 1, flt, make_softmax<false>);
  cpu::add(r, "LogSoftmax", 1, flt, make_softmax<true>);
  cpu::add(r, "onnxtrain", "SoftmaxGrad", 1, flt, make_softmax_grad<false>);
  cpu::add(r, "onnxtrain", "LogSoftmaxGrad", 1, flt, make_softmax_grad<true>);
}

}  // namespace onnxtrain
