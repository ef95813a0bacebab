// CPU kernels of the spatial op family (see register_cpu_spatial in executor/kernel.h):
//   GridSample (16, 20) and the fused onnxtrain.GridSampleGrad(dY, X, grid) -> (dX, dGrid);
//   MaxUnpool (9, 11); Col2Im (18); MaxRoiPool (1) and the fused onnxtrain.MaxRoiPoolGrad(dY, X, rois) -> dX.
// GridSample follows the ONNX reference (onnx/reference/ops/op_grid_sample.py) to the letter: the unnormalised
// coordinate is padded (border: clamped, reflection: reflected) when it leaves [x_min, x_max], and every tap
// index is padded again (zeros: outside taps read 0). Its gradient differentiates exactly that function: a
// clamped coordinate has slope 0, a reflected one +-1. Both fused gradients have standard-ONNX bodies that
// recompute what these kernels do (gradients/fused_spatial.cpp); tests/gradients/test_fused_both_ways.cpp
// holds the two to the same numbers.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <memory>

#include "executor/cpu/kernel_util.h"
#include "executor/kernel.h"
#include "executor/ops/conv_geometry.h"
#include "executor/ops/resize_taps.h"
#include "graph/error.h"

namespace onnxtrain {

namespace {

using cpu::required_input;
using cpu::set_output;

// ---------------------------------------------------------------- GridSample

enum class Interp { Linear, Nearest, Cubic };
enum class Padding { Zeros, Border, Reflection };

constexpr int kMaxGridDims = 3;
constexpr double kCubicA = -0.75;  // GridSample's bicubic kernel (the ONNX reference and PyTorch use -0.75)

struct GridGeo {
  int64_t N = 0, C = 0, r = 0;           // batch, channels, spatial rank
  std::array<int64_t, kMaxGridDims> in{}, in_stride{};  // input spatial dims (outermost first)
  int64_t in_size = 1, out_size = 1;
  Interp mode = Interp::Linear;
  Padding padding = Padding::Zeros;
  bool align = false;
};

// The reference's reflection into [lo, hi]; `slope` receives d(result)/dx.
double reflect(double x, double lo, double hi, double& slope) {
  const double range = hi - lo;
  slope = 1;
  if (range <= 0) {
    slope = 0;
    return lo;
  }
  // n whole ranges are folded away (its parity picks the side), r remains; in doubles, so a far grid value
  // cannot overflow an integer.
  if (x < lo) {
    const double dx = lo - x, n = std::floor(dx / range), r = dx - n * range;
    const bool even = std::fmod(n, 2.0) == 0;
    slope = even ? -1 : 1;
    return even ? lo + r : hi - r;
  }
  if (x > hi) {
    const double dx = x - hi, n = std::floor(dx / range), r = dx - n * range;
    const bool even = std::fmod(n, 2.0) == 0;
    slope = even ? -1 : 1;
    return even ? hi - r : lo + r;
  }
  return x;
}

// Up to four taps along one axis: index (-1 = reads zero), weight and d(weight)/d(normalised grid value).
struct AxisTap {
  int n = 0;
  std::array<int64_t, 4> idx{};
  std::array<double, 4> w{}, dw{};
};

// The tap index after padding (the reference's _pixel_at_array).
int64_t pad_index(const GridGeo& g, int64_t i, int64_t len, double lo, double hi) {
  if (i >= 0 && i < len) return i;
  switch (g.padding) {
    case Padding::Zeros: return -1;
    case Padding::Border: return std::clamp<int64_t>(i, 0, len - 1);
    case Padding::Reflection: {
      double unused;
      return std::clamp<int64_t>(static_cast<int64_t>(reflect(static_cast<double>(i), lo, hi, unused)), 0, len - 1);
    }
  }
  return -1;
}

AxisTap axis_taps(const GridGeo& g, double v, int64_t len) {
  const double lo = g.align ? 0.0 : -0.5, hi = g.align ? static_cast<double>(len - 1) : static_cast<double>(len) - 0.5;
  double x = g.align ? (v + 1) / 2 * static_cast<double>(len - 1) : ((v + 1) * static_cast<double>(len) - 1) / 2;
  double slope = g.align ? static_cast<double>(len - 1) / 2 : static_cast<double>(len) / 2;
  if (g.mode == Interp::Nearest) {
    x = std::nearbyint(x);  // round half to even, as numpy's rint in the reference (and PyTorch)
    slope = 0;
  }
  if (x < lo || x > hi) {
    if (g.padding == Padding::Border) {
      x = std::clamp(x, 0.0, static_cast<double>(len - 1));
      slope = 0;
    } else if (g.padding == Padding::Reflection) {
      double s;
      x = reflect(x, lo, hi, s);
      slope *= s;
    }
  }
  AxisTap t;
  // A non-finite grid value, or one so far out (zeros padding) that every tap misses X, reads zeros; this also
  // keeps the integer conversions below defined.
  if (!std::isfinite(x) || x < lo - 4 || x > hi + 4) {
    t.n = 1;
    t.idx[0] = -1;
    return t;
  }
  if (g.mode == Interp::Nearest) {
    t.n = 1;
    t.idx[0] = pad_index(g, static_cast<int64_t>(x), len, lo, hi);
    t.w[0] = 1;
    return t;
  }
  const double x0 = std::floor(x), f = x - x0;
  const auto i0 = static_cast<int64_t>(x0);
  if (g.mode == Interp::Linear) {
    t.n = 2;
    t.idx = {pad_index(g, i0, len, lo, hi), pad_index(g, i0 + 1, len, lo, hi)};
    t.w = {1 - f, f};
    t.dw = {-slope, slope};
    return t;
  }
  t.n = 4;
  for (int k = 0; k < 4; ++k) {
    const double d = f + 1 - k;  // signed distance from tap i0 - 1 + k
    t.idx[k] = pad_index(g, i0 - 1 + k, len, lo, hi);
    t.w[k] = ops::cubic_kernel(kCubicA, d);
    t.dw[k] = ops::cubic_kernel_slope(kCubicA, d) * slope;
  }
  return t;
}

// Visits every combination of the per-axis taps that reads inside X: f(flat index, axis taps' positions).
template <class F> void for_each_tap(const GridGeo& g, const std::array<AxisTap, kMaxGridDims>& t, F&& f) {
  std::array<int, kMaxGridDims> k{};
  while (true) {
    int64_t at = 0;
    bool inside = true;
    for (int64_t d = 0; d < g.r; ++d) {
      const int64_t i = t[d].idx[k[d]];
      inside = inside && i >= 0;
      at += i * g.in_stride[d];
    }
    if (inside) f(at, k);
    int64_t d = g.r - 1;
    while (d >= 0 && ++k[d] == t[d].n) k[d--] = 0;
    if (d < 0) return;
  }
}

// Spatial axis d (outermost first) reads grid component r - 1 - d (the grid lists x, i.e. the innermost, first).
std::array<AxisTap, kMaxGridDims> point_taps(const GridGeo& g, const auto* gp) {
  std::array<AxisTap, kMaxGridDims> t;
  for (int64_t d = 0; d < g.r; ++d) t[d] = axis_taps(g, static_cast<double>(gp[g.r - 1 - d]), g.in[d]);
  return t;
}

GridGeo grid_geometry(PrepareContext& ctx, size_t xi) {
  const KernelInput& x = required_input(ctx, xi, "X");
  const KernelInput& grid = required_input(ctx, xi + 1, "grid");
  GridGeo g;
  const size_t rank = x.shape.size();
  const size_t max_rank = ctx.opset >= 20 || ctx.node.domain == "onnxtrain" ? 5 : 4;
  if (rank < 3 || rank > max_rank)
    ctx.fail("X " + shape_string(x.shape) + " must have rank " + (max_rank == 4 ? "4" : "3 to 5") +
             (max_rank == 4 ? " before opset 20" : ""));
  g.N = x.shape[0];
  g.C = x.shape[1];
  g.r = static_cast<int64_t>(rank) - 2;
  if (grid.dtype != x.dtype) ctx.fail("grid is " + dtype_name(grid.dtype) + ", X is " + dtype_name(x.dtype));
  if (grid.shape.size() != rank || grid.shape[0] != g.N || grid.shape.back() != g.r)
    ctx.fail("grid " + shape_string(grid.shape) + " must be [N, out..., " + std::to_string(g.r) + "] for X " +
             shape_string(x.shape));
  for (int64_t d = g.r - 1; d >= 0; --d) {
    g.in[d] = x.shape[d + 2];
    if (g.in[d] <= 0) ctx.fail("X " + shape_string(x.shape) + " has an empty spatial dim");
    g.in_stride[d] = g.in_size;
    g.in_size *= g.in[d];
  }
  for (int64_t d = 0; d < g.r; ++d) g.out_size *= grid.shape[d + 1];
  const std::string mode = ctx.node.attr_string("mode", ctx.opset >= 20 ? "linear" : "bilinear");
  if (mode == "bilinear" || mode == "linear") g.mode = Interp::Linear;
  else if (mode == "nearest") g.mode = Interp::Nearest;
  else if (mode == "bicubic" || mode == "cubic") g.mode = Interp::Cubic;
  else ctx.fail("mode must be linear (bilinear), nearest or cubic (bicubic), got '" + mode + "'");
  const std::string pad = ctx.node.attr_string("padding_mode", "zeros");
  if (pad == "zeros") g.padding = Padding::Zeros;
  else if (pad == "border") g.padding = Padding::Border;
  else if (pad == "reflection") g.padding = Padding::Reflection;
  else ctx.fail("padding_mode must be zeros, border or reflection, got '" + pad + "'");
  const int64_t align = ctx.node.attr_int("align_corners", 0);
  if (align != 0 && align != 1) ctx.fail("align_corners must be 0 or 1");
  g.align = align == 1;
  // GridSampleGrad also carries the mode and padding as ints, for its function body (gradients/rules/spatial.cpp
  // writes them): they must say what the strings say.
  if (ctx.node.domain == "onnxtrain") {
    const int64_t interp = g.mode == Interp::Linear ? 0 : g.mode == Interp::Nearest ? 1 : 2;
    if (ctx.node.has_attr("interpolation") && ctx.node.attr_int("interpolation", -1) != interp)
      ctx.fail("attribute 'interpolation' " + std::to_string(ctx.node.attr_int("interpolation", -1)) +
               " disagrees with mode '" + mode + "' (0 linear, 1 nearest, 2 cubic)");
    const int64_t padding = static_cast<int64_t>(g.padding);
    if (ctx.node.has_attr("padding") && ctx.node.attr_int("padding", -1) != padding)
      ctx.fail("attribute 'padding' " + std::to_string(ctx.node.attr_int("padding", -1)) +
               " disagrees with padding_mode '" + pad + "' (0 zeros, 1 border, 2 reflection)");
  }
  return g;
}

std::vector<int64_t> grid_out_shape(const GridGeo& g, const std::vector<int64_t>& grid_shape) {
  std::vector<int64_t> s{g.N, g.C};
  s.insert(s.end(), grid_shape.begin() + 1, grid_shape.end() - 1);
  return s;
}

template <class T> class GridSampleKernel final : public Kernel {
 public:
  explicit GridSampleKernel(GridGeo g) : g_(g) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const GridGeo g = g_;
    const T* x = in[0]->ptr<T>();
    const T* grid = in[1]->ptr<T>();
    T* y = out[0]->ptr<T>();
    const int64_t points = g.N * g.out_size;
    cpu::parallel_for(points, points * g.C > 4096, [&](int64_t p) {
      const int64_t n = p / g.out_size, o = p % g.out_size;
      const auto t = point_taps(g, grid + p * g.r);
      for (int64_t c = 0; c < g.C; ++c) {
        const T* xp = x + (n * g.C + c) * g.in_size;
        double acc = 0;
        for_each_tap(g, t, [&](int64_t at, const std::array<int, kMaxGridDims>& k) {
          double w = 1;
          for (int64_t d = 0; d < g.r; ++d) w *= t[d].w[k[d]];
          acc += w * static_cast<double>(xp[at]);
        });
        y[(n * g.C + c) * g.out_size + o] = static_cast<T>(acc);
      }
    });
  }

 private:
  GridGeo g_;
};

// onnxtrain.GridSampleGrad(dY, X, grid) -> (dX, dGrid) with GridSample's attributes: dX adds each dY at the
// taps it was interpolated from, dGrid is the weights' slope against X's values (zero for nearest).
template <class T> class GridSampleGradKernel final : public Kernel {
 public:
  GridSampleGradKernel(GridGeo g, bool want_dx, bool want_dgrid) : g_(g), want_dx_(want_dx), want_dgrid_(want_dgrid) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const GridGeo g = g_;
    const T* dy = in[0]->ptr<T>();
    const T* x = in[1]->ptr<T>();
    const T* grid = in[2]->ptr<T>();
    T* dx = want_dx_ ? out[0]->ptr<T>() : nullptr;
    T* dgrid = want_dgrid_ ? out[1]->ptr<T>() : nullptr;
    // One batch entry per task: its dX planes are written by it alone.
    cpu::parallel_for(g.N, g.N * g.out_size * g.C > 4096, [&](int64_t n) {
      if (dx) std::fill(dx + n * g.C * g.in_size, dx + (n + 1) * g.C * g.in_size, T(0));
      for (int64_t o = 0; o < g.out_size; ++o) {
        const int64_t p = n * g.out_size + o;
        const auto t = point_taps(g, grid + p * g.r);
        std::array<double, kMaxGridDims> dg{};
        for (int64_t c = 0; c < g.C; ++c) {
          const int64_t plane = (n * g.C + c) * g.in_size;
          const double gy = static_cast<double>(dy[(n * g.C + c) * g.out_size + o]);
          for_each_tap(g, t, [&](int64_t at, const std::array<int, kMaxGridDims>& k) {
            double w = 1;
            for (int64_t d = 0; d < g.r; ++d) w *= t[d].w[k[d]];
            if (dx) dx[plane + at] += static_cast<T>(gy * w);
            if (dgrid && g.mode != Interp::Nearest) {
              const double v = gy * static_cast<double>(x[plane + at]);
              for (int64_t d = 0; d < g.r; ++d) {
                double wd = t[d].dw[k[d]];
                for (int64_t e = 0; e < g.r; ++e)
                  if (e != d) wd *= t[e].w[k[e]];
                dg[d] += v * wd;
              }
            }
          });
        }
        if (dgrid)
          for (int64_t d = 0; d < g.r; ++d) dgrid[p * g.r + (g.r - 1 - d)] = static_cast<T>(dg[d]);
      }
    });
  }

 private:
  GridGeo g_;
  bool want_dx_, want_dgrid_;
};

std::unique_ptr<Kernel> make_grid_sample(PrepareContext& ctx) {
  const GridGeo g = grid_geometry(ctx, 0);
  const DType t = ctx.inputs[0].dtype;
  set_output(ctx, 0, t, grid_out_shape(g, ctx.inputs[1].shape));
  if (t == DType::Float32) return std::make_unique<GridSampleKernel<float>>(g);
  if (t == DType::Float64) return std::make_unique<GridSampleKernel<double>>(g);
  cpu::fail_dtype(ctx);
}

std::unique_ptr<Kernel> make_grid_sample_grad(PrepareContext& ctx) {
  const GridGeo g = grid_geometry(ctx, 1);
  const KernelInput& dy = required_input(ctx, 0, "dY");
  const DType t = ctx.inputs[1].dtype;
  const std::vector<int64_t> ys = grid_out_shape(g, ctx.inputs[2].shape);
  if (dy.dtype != t || dy.shape != ys)
    ctx.fail("dY is " + dtype_name(dy.dtype) + shape_string(dy.shape) + ", expected GridSample's output " +
             dtype_name(t) + shape_string(ys));
  if (ctx.outputs.size() != 2) ctx.fail("expected two outputs (dX, dGrid)");
  const auto want = ops::wanted_outputs(ctx);
  set_output(ctx, 0, t, ctx.inputs[1].shape);
  set_output(ctx, 1, t, ctx.inputs[2].shape);
  if (t == DType::Float32) return std::make_unique<GridSampleGradKernel<float>>(g, want[0], want[1]);
  if (t == DType::Float64) return std::make_unique<GridSampleGradKernel<double>>(g, want[0], want[1]);
  cpu::fail_dtype(ctx, 1);
}

// ---------------------------------------------------------------- MaxUnpool

// Y = zeros; Y[I[i]] = X[i], I indexing the flattened [N, C, inferred...] tensor with inferred the size that
// undoes the pooling ((in - 1) * stride - pads + kernel); an output_shape larger than that holds it in its
// leading corner (the ONNX reference's semantics, which its backend test checks).
template <class T> class MaxUnpoolKernel final : public Kernel {
 public:
  MaxUnpoolKernel(std::vector<int64_t> inferred, std::vector<int64_t> out, std::string node)
      : inferred_(std::move(inferred)), out_(std::move(out)), node_(std::move(node)) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const T* x = in[0]->ptr<T>();
    const int64_t* idx = in[1]->ptr<int64_t>();
    T* y = out[0]->ptr<T>();
    std::fill(y, y + out[0]->numel(), T(0));
    const int64_t total = in[0]->numel();
    int64_t limit = 1;
    for (int64_t v : inferred_) limit *= v;
    const std::vector<int64_t> ostr = cpu::contiguous_strides(out_);
    for (int64_t i = 0; i < total; ++i) {
      int64_t rem = idx[i];
      if (rem < 0 || rem >= limit)
        fail("node '" + node_ + "' (MaxUnpool)",
             "index " + std::to_string(rem) + " is outside the unpooled tensor " + shape_string(inferred_));
      int64_t at = 0;
      for (size_t d = inferred_.size(); d-- > 0;) {
        at += (rem % inferred_[d]) * ostr[d];
        rem /= inferred_[d];
      }
      y[at] = x[i];
    }
  }

 private:
  std::vector<int64_t> inferred_, out_;
  std::string node_;
};

std::unique_ptr<Kernel> make_max_unpool(PrepareContext& ctx) {
  const KernelInput& x = required_input(ctx, 0, "X");
  const KernelInput& ind = required_input(ctx, 1, "I");
  if (x.shape.size() < 3) ctx.fail("X " + shape_string(x.shape) + " must have rank >= 3");
  if (ind.dtype != DType::Int64) ctx.fail("I must be int64, got " + dtype_name(ind.dtype));
  if (ind.shape != x.shape) ctx.fail("I " + shape_string(ind.shape) + " must have X's shape " + shape_string(x.shape));
  if (!ctx.node.has_attr("kernel_shape")) ctx.fail("attribute 'kernel_shape' is required");
  const size_t r = x.shape.size() - 2;
  const std::vector<int64_t> k = ctx.node.attr_ints("kernel_shape");
  const std::vector<int64_t> s = ops::spatial_attr(ctx, "strides", r, 1), pads = ops::spatial_attr(ctx, "pads", 2 * r, 0);
  if (k.size() != r) ctx.fail("kernel_shape has " + std::to_string(k.size()) + " entries for X " + shape_string(x.shape));
  std::vector<int64_t> inferred{x.shape[0], x.shape[1]};
  for (size_t i = 0; i < r; ++i) {
    inferred.push_back((x.shape[2 + i] - 1) * s[i] - pads[i] - pads[r + i] + k[i]);
    if (inferred.back() <= 0) ctx.fail("the unpooled size of spatial dim " + std::to_string(i) + " is not positive");
  }
  std::vector<int64_t> out = inferred;
  if (cpu::has_input(ctx, 2)) {
    out = cpu::ints_of(ctx, ctx.constant_input(2), "output_shape");
    if (out.size() != inferred.size()) ctx.fail("output_shape must have " + std::to_string(inferred.size()) + " entries");
    for (size_t i = 0; i < out.size(); ++i)
      if (out[i] < inferred[i])
        ctx.fail("output_shape " + shape_string(out) + " is smaller than the unpooled shape " + shape_string(inferred));
  }
  set_output(ctx, 0, x.dtype, out);
  if (x.dtype == DType::Float32) return std::make_unique<MaxUnpoolKernel<float>>(inferred, out, ctx.node.name);
  if (x.dtype == DType::Float64) return std::make_unique<MaxUnpoolKernel<double>>(inferred, out, ctx.node.name);
  cpu::fail_dtype(ctx);
}

// ---------------------------------------------------------------- Col2Im

// Y[n, c, image] = sum of input[n, c * K + k, l] over the blocks l and block offsets k that land there (K =
// prod(block_shape)); the block grid is the convolution geometry of image_shape by block_shape.
template <class T> class Col2ImKernel final : public Kernel {
 public:
  explicit Col2ImKernel(ops::Geo g) : g_(g) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const ops::Geo g = g_;
    const T* col = in[0]->ptr<T>();
    T* y = out[0]->ptr<T>();
    const int64_t K = g.k_size(), L = g.out_size(), isz = g.in_size();
    cpu::parallel_for(g.N * g.C, g.N * g.C * K * L > 4096, [&](int64_t p) {
      T* yp = y + p * isz;
      std::fill(yp, yp + isz, T(0));
      const T* cp = col + p * K * L;
      for (int64_t k = 0; k < K; ++k) {
        const int64_t k0 = k / (g.k[1] * g.k[2]), k1 = k / g.k[2] % g.k[1], k2 = k % g.k[2];
        for (int64_t l = 0; l < L; ++l) {
          const int64_t o0 = l / (g.out[1] * g.out[2]), o1 = l / g.out[2] % g.out[1], o2 = l % g.out[2];
          const int64_t i0 = o0 * g.s[0] - g.pb[0] + k0 * g.d[0], i1 = o1 * g.s[1] - g.pb[1] + k1 * g.d[1],
                        i2 = o2 * g.s[2] - g.pb[2] + k2 * g.d[2];
          if (i0 < 0 || i0 >= g.in[0] || i1 < 0 || i1 >= g.in[1] || i2 < 0 || i2 >= g.in[2]) continue;
          yp[(i0 * g.in[1] + i1) * g.in[2] + i2] += cp[k * L + l];
        }
      }
    });
  }

 private:
  ops::Geo g_;
};

std::unique_ptr<Kernel> make_col2im(PrepareContext& ctx) {
  const KernelInput& x = required_input(ctx, 0, "input");
  if (x.shape.size() != 3) ctx.fail("input " + shape_string(x.shape) + " must be [N, C * prod(block_shape), L]");
  const std::vector<int64_t> image = cpu::ints_of(ctx, ctx.constant_input(1), "image_shape");
  const std::vector<int64_t> block = cpu::ints_of(ctx, ctx.constant_input(2), "block_shape");
  if (image.size() != block.size() || image.empty() || image.size() > static_cast<size_t>(ops::kMaxSpatial))
    ctx.fail("image_shape and block_shape must have the same length, 1 to 3, got " + shape_string(image) + " and " +
             shape_string(block));
  int64_t K = 1;
  for (int64_t b : block) {
    if (b <= 0) ctx.fail("block_shape " + shape_string(block) + " must be positive");
    K *= b;
  }
  if (x.shape[1] % K != 0)
    ctx.fail("input's dim 1 (" + std::to_string(x.shape[1]) + ") is not a multiple of prod(block_shape) = " +
             std::to_string(K));
  std::vector<int64_t> xs{x.shape[0], x.shape[1] / K};
  xs.insert(xs.end(), image.begin(), image.end());
  ops::Geo g;
  g.N = xs[0];
  g.C = g.M = xs[1];
  ops::window_geometry(ctx, xs, block, false, g);
  if (g.out_size() != x.shape[2])
    ctx.fail("input has " + std::to_string(x.shape[2]) + " blocks (dim 2), the geometry gives " +
             std::to_string(g.out_size()));
  set_output(ctx, 0, x.dtype, xs);
  if (x.dtype == DType::Float32) return std::make_unique<Col2ImKernel<float>>(g);
  if (x.dtype == DType::Float64) return std::make_unique<Col2ImKernel<double>>(g);
  cpu::fail_dtype(ctx);
}

// ---------------------------------------------------------------- MaxRoiPool

// The bins of one region, as Caffe's ROIPooling (the ONNX definition's origin) computes them: the region's
// corners are rounded after scaling, and bin (ph, pw) covers rows [floor(ph * bin_h), ceil((ph + 1) * bin_h))
// from its start, clipped to the image. An empty bin outputs 0.
struct RoiBins {
  int64_t batch = 0;
  std::vector<int64_t> h0, h1, w0, w1;  // per pooled row / column
};

template <class T>
RoiBins roi_bins(const T* roi, int64_t N, int64_t H, int64_t W, int64_t ph, int64_t pw, double scale,
                 const std::string& node) {
  RoiBins b;
  b.batch = static_cast<int64_t>(roi[0]);
  if (b.batch < 0 || b.batch >= N)
    fail("node '" + node + "' (MaxRoiPool)", "roi batch index " + std::to_string(b.batch) + " is outside [0, " +
                                                  std::to_string(N) + ")");
  const auto rnd = [&](T v) { return static_cast<int64_t>(std::round(static_cast<double>(v) * scale)); };
  const int64_t x1 = rnd(roi[1]), y1 = rnd(roi[2]), x2 = rnd(roi[3]), y2 = rnd(roi[4]);
  const double bh = static_cast<double>(std::max<int64_t>(y2 - y1 + 1, 1)) / static_cast<double>(ph);
  const double bw = static_cast<double>(std::max<int64_t>(x2 - x1 + 1, 1)) / static_cast<double>(pw);
  for (int64_t i = 0; i < ph; ++i) {
    b.h0.push_back(std::clamp<int64_t>(static_cast<int64_t>(std::floor(static_cast<double>(i) * bh)) + y1, 0, H));
    b.h1.push_back(std::clamp<int64_t>(static_cast<int64_t>(std::ceil(static_cast<double>(i + 1) * bh)) + y1, 0, H));
  }
  for (int64_t j = 0; j < pw; ++j) {
    b.w0.push_back(std::clamp<int64_t>(static_cast<int64_t>(std::floor(static_cast<double>(j) * bw)) + x1, 0, W));
    b.w1.push_back(std::clamp<int64_t>(static_cast<int64_t>(std::ceil(static_cast<double>(j + 1) * bw)) + x1, 0, W));
  }
  return b;
}

// Forward (Grad = false): Y = each bin's maximum. Grad: onnxtrain.MaxRoiPoolGrad(dY, X, rois) -> dX adds each
// dY at its bin's first maximum.
template <class T, bool Grad> class MaxRoiPoolKernel final : public Kernel {
 public:
  MaxRoiPoolKernel(int64_t ph, int64_t pw, double scale, std::string node)
      : ph_(ph), pw_(pw), scale_(scale), node_(std::move(node)) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const Tensor& xt = *in[Grad ? 1 : 0];
    const T* x = xt.ptr<T>();
    const T* rois = in[Grad ? 2 : 1]->ptr<T>();
    const T* dy = Grad ? in[0]->ptr<T>() : nullptr;
    T* o = out[0]->ptr<T>();
    const int64_t N = xt.shape[0], C = xt.shape[1], H = xt.shape[2], W = xt.shape[3];
    const int64_t R = in[Grad ? 2 : 1]->shape[0];
    if constexpr (Grad) std::fill(o, o + out[0]->numel(), T(0));
    for (int64_t r = 0; r < R; ++r) {
      const RoiBins b = roi_bins(rois + r * 5, N, H, W, ph_, pw_, scale_, node_);
      for (int64_t c = 0; c < C; ++c) {
        const int64_t plane = (b.batch * C + c) * H * W;
        for (int64_t i = 0; i < ph_; ++i)
          for (int64_t j = 0; j < pw_; ++j) {
            T best = -std::numeric_limits<T>::infinity();
            int64_t arg = -1;
            for (int64_t h = b.h0[i]; h < b.h1[i]; ++h)
              for (int64_t w = b.w0[j]; w < b.w1[j]; ++w)
                if (arg < 0 || x[plane + h * W + w] > best) {
                  best = x[plane + h * W + w];
                  arg = h * W + w;
                }
            const int64_t yi = ((r * C + c) * ph_ + i) * pw_ + j;
            if constexpr (Grad) {
              if (arg >= 0) o[plane + arg] += dy[yi];
            } else {
              o[yi] = arg >= 0 ? best : T(0);
            }
          }
      }
    }
  }

 private:
  int64_t ph_, pw_;
  double scale_;
  std::string node_;
};

template <bool Grad> std::unique_ptr<Kernel> make_max_roi_pool(PrepareContext& ctx) {
  const size_t xi = Grad ? 1 : 0;
  const KernelInput& x = required_input(ctx, xi, "X");
  const KernelInput& rois = required_input(ctx, xi + 1, "rois");
  if (x.shape.size() != 4) ctx.fail("X " + shape_string(x.shape) + " must be [N, C, H, W]");
  if (rois.dtype != x.dtype) ctx.fail("rois is " + dtype_name(rois.dtype) + ", X is " + dtype_name(x.dtype));
  if (rois.shape.size() != 2 || rois.shape[1] != 5)
    ctx.fail("rois " + shape_string(rois.shape) + " must be [num_rois, 5] (batch_index, x1, y1, x2, y2)");
  if (!ctx.node.has_attr("pooled_shape")) ctx.fail("attribute 'pooled_shape' is required");
  const std::vector<int64_t> pooled = ctx.node.attr_ints("pooled_shape");
  if (pooled.size() != 2 || pooled[0] <= 0 || pooled[1] <= 0)
    ctx.fail("pooled_shape " + shape_string(pooled) + " must be two positive values");
  const double scale = ctx.node.attr_float("spatial_scale", 1.0f);
  const std::vector<int64_t> ys{rois.shape[0], x.shape[1], pooled[0], pooled[1]};
  if constexpr (Grad) {
    const KernelInput& dy = required_input(ctx, 0, "dY");
    if (dy.dtype != x.dtype || dy.shape != ys)
      ctx.fail("dY is " + dtype_name(dy.dtype) + shape_string(dy.shape) + ", expected MaxRoiPool's output " +
               dtype_name(x.dtype) + shape_string(ys));
    set_output(ctx, 0, x.dtype, x.shape);
  } else {
    set_output(ctx, 0, x.dtype, ys);
  }
  if (x.dtype == DType::Float32)
    return std::make_unique<MaxRoiPoolKernel<float, Grad>>(pooled[0], pooled[1], scale, ctx.node.name);
  if (x.dtype == DType::Float64)
    return std::make_unique<MaxRoiPoolKernel<double, Grad>>(pooled[0], pooled[1], scale, ctx.node.name);
  cpu::fail_dtype(ctx, xi);
}

}  // namespace

void register_cpu_spatial(KernelRegistry& r) {
  const std::vector<DType> flt = {DType::Float32, DType::Float64};
  cpu::add(r, "GridSample", 16, flt, make_grid_sample);
  cpu::add(r, "onnxtrain", "GridSampleGrad", 1, flt, make_grid_sample_grad);
  cpu::add(r, "MaxUnpool", 9, flt, make_max_unpool);
  cpu::add(r, "Col2Im", 18, flt, make_col2im);
  cpu::add(r, "MaxRoiPool", 1, flt, make_max_roi_pool<false>);
  cpu::add(r, "onnxtrain", "MaxRoiPoolGrad", 1, flt, make_max_roi_pool<true>);
}

}  // namespace onnxtrain
