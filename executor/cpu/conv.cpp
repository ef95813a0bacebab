// Conv, ConvTranspose and pooling on the CPU. Every op is canonicalised to three spatial dims (1-D and 2-D
// get leading dims of size 1 with kernel 1, stride 1, no padding), so one set of loops serves 1-D to 3-D.
// float32 Conv runs one oneDNN convolution primitive built at plan time on plain (ncdhw/oidhw) layouts; run()
// only swaps data handles. Everything else (float64, ConvTranspose, pooling, and float32 convolutions oneDNN
// refuses) is a direct loop, parallel over (image, channel) planes so no two threads write the same output.
#include <omp.h>

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <optional>

#include "executor/cpu/dnnl_context.h"
#include "executor/cpu/kernel_util.h"
#include "executor/kernel.h"
#include "graph/error.h"

namespace onnxtrain {
namespace {

using cpu::required_input;
using cpu::set_output;

constexpr int kMaxSpatial = 3;
using Dims3 = std::array<int64_t, kMaxSpatial>;

// One convolution or pooling window geometry, spatial dims right-aligned into three.
struct Geo {
  int64_t N = 0, C = 0, M = 0, G = 1;  // batch, input channels, output channels, groups
  size_t rank = 0;                     // number of real spatial dims
  Dims3 in{1, 1, 1}, out{1, 1, 1}, k{1, 1, 1}, s{1, 1, 1}, d{1, 1, 1}, pb{0, 0, 0}, pe{0, 0, 0};
  int64_t in_size() const { return in[0] * in[1] * in[2]; }
  int64_t out_size() const { return out[0] * out[1] * out[2]; }
  int64_t k_size() const { return k[0] * k[1] * k[2]; }
};

// Attribute list `name` with `n` entries (or `fallback` repeated when absent); fails naming the attribute.
std::vector<int64_t> spatial_attr(const PrepareContext& ctx, const std::string& name, size_t n, int64_t fallback) {
  std::vector<int64_t> v = ctx.node.attr_ints(name, std::vector<int64_t>(n, fallback));
  if (v.size() != n)
    ctx.fail("attribute '" + name + "' has " + std::to_string(v.size()) + " entries, expected " + std::to_string(n) +
             " (one per spatial dim)");
  return v;
}

// Reads kernel/stride/dilation/pads (and auto_pad) for a forward window op over `x_shape` and fills the
// output spatial dims. `ceil_mode` applies to pooling only.
void window_geometry(const PrepareContext& ctx, const std::vector<int64_t>& x_shape, const std::vector<int64_t>& kernel,
                     bool ceil_mode, Geo& g) {
  const size_t r = x_shape.size() - 2;
  if (r < 1 || r > kMaxSpatial)
    ctx.fail("input " + shape_string(x_shape) + " must have 1 to 3 spatial dims (rank 3 to 5)");
  g.rank = r;
  const std::vector<int64_t> strides = spatial_attr(ctx, "strides", r, 1);
  const std::vector<int64_t> dil = spatial_attr(ctx, "dilations", r, 1);
  std::vector<int64_t> pads = ctx.node.attr_ints("pads", std::vector<int64_t>(2 * r, 0));
  if (pads.size() != 2 * r)
    ctx.fail("attribute 'pads' has " + std::to_string(pads.size()) + " entries, expected " + std::to_string(2 * r));
  const std::string auto_pad = ctx.node.attr_string("auto_pad", "NOTSET");
  const size_t off = kMaxSpatial - r;
  for (size_t i = 0; i < r; ++i) {
    const int64_t in = x_shape[2 + i], k = kernel[i], s = strides[i], d = dil[i];
    if (k < 1 || s < 1 || d < 1)
      ctx.fail("kernel, strides and dilations must be >= 1, got " + std::to_string(k) + ", " + std::to_string(s) +
               ", " + std::to_string(d) + " for spatial dim " + std::to_string(i));
    const int64_t ext = (k - 1) * d + 1;
    int64_t pb = pads[i], pe = pads[i + r], out = 0;
    if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      out = (in + s - 1) / s;
      const int64_t total = std::max<int64_t>(0, (out - 1) * s + ext - in);
      const int64_t small = total / 2;
      pb = auto_pad == "SAME_UPPER" ? small : total - small;
      pe = total - pb;
    } else if (auto_pad == "VALID") {
      pb = pe = 0;
      out = in >= ext ? (in - ext) / s + 1 : 0;
    } else if (auto_pad == "NOTSET") {
      if (pb < 0 || pe < 0) ctx.fail("pads must be non-negative");
      const int64_t span = in + pb + pe - ext;
      if (span < 0) {
        out = 0;
      } else if (ceil_mode) {
        out = (span + s - 1) / s + 1;
        // The last window must start inside the input or its leading pad.
        if ((out - 1) * s >= in + pb) --out;
      } else {
        out = span / s + 1;
      }
    } else {
      ctx.fail("auto_pad '" + auto_pad + "' is not one of NOTSET, SAME_UPPER, SAME_LOWER, VALID");
    }
    if (out <= 0) ctx.fail("the window does not fit: input " + shape_string(x_shape) + " gives an empty output");
    g.in[off + i] = in;
    g.out[off + i] = out;
    g.k[off + i] = k;
    g.s[off + i] = s;
    g.d[off + i] = d;
    g.pb[off + i] = pb;
    g.pe[off + i] = pe;
  }
}

std::vector<int64_t> out_shape(const Geo& g, int64_t channels) {
  std::vector<int64_t> s{g.N, channels};
  for (size_t i = kMaxSpatial - g.rank; i < kMaxSpatial; ++i) s.push_back(g.out[i]);
  return s;
}

// ---- Conv ------------------------------------------------------------------------------------------------

// Direct convolution: y[n, m, o] = b[m] + sum_{c in m's group, j} x[n, c, o*s - pb + j*d] * w[m, c, j].
template <class T> void conv_direct(const Geo& g, const T* x, const T* w, const T* b, T* y) {
  const int64_t Cg = g.C / g.G, Mg = g.M / g.G, isz = g.in_size(), osz = g.out_size(), ksz = g.k_size();
  const int64_t planes = g.N * g.M;
#pragma omp parallel for schedule(static) if (planes * osz * Cg * ksz > (1 << 15))
  for (int64_t p = 0; p < planes; ++p) {
    const int64_t n = p / g.M, m = p % g.M, grp = m / Mg;
    T* yp = y + p * osz;
    const T bias = b ? b[m] : T(0);
    for (int64_t o0 = 0; o0 < g.out[0]; ++o0)
      for (int64_t o1 = 0; o1 < g.out[1]; ++o1)
        for (int64_t o2 = 0; o2 < g.out[2]; ++o2) {
          T acc = bias;
          for (int64_t c = 0; c < Cg; ++c) {
            const T* xp = x + (n * g.C + grp * Cg + c) * isz;
            const T* wp = w + (m * Cg + c) * ksz;
            for (int64_t j0 = 0; j0 < g.k[0]; ++j0) {
              const int64_t i0 = o0 * g.s[0] - g.pb[0] + j0 * g.d[0];
              if (i0 < 0 || i0 >= g.in[0]) continue;
              for (int64_t j1 = 0; j1 < g.k[1]; ++j1) {
                const int64_t i1 = o1 * g.s[1] - g.pb[1] + j1 * g.d[1];
                if (i1 < 0 || i1 >= g.in[1]) continue;
                const T* xr = xp + (i0 * g.in[1] + i1) * g.in[2];
                const T* wr = wp + (j0 * g.k[1] + j1) * g.k[2];
                for (int64_t j2 = 0; j2 < g.k[2]; ++j2) {
                  const int64_t i2 = o2 * g.s[2] - g.pb[2] + j2 * g.d[2];
                  if (i2 < 0 || i2 >= g.in[2]) continue;
                  acc += xr[i2] * wr[j2];
                }
              }
            }
          }
          yp[(o0 * g.out[1] + o1) * g.out[2] + o2] = acc;
        }
  }
}

using cpu::dnnl_engine;
using cpu::dnnl_stream;

struct DnnlConv {
  dnnl::primitive prim;
  dnnl::memory x, w, b, y;
  std::array<dnnl_exec_arg_t, 4> args;
  int nargs = 3;
};

// Unbound memories for each argument (run() sets the handles) and the argument array, built once.
DnnlConv bind_conv(dnnl::primitive prim, const dnnl::memory::desc& x_md, const dnnl::memory::desc& w_md,
                   const dnnl::memory::desc& b_md, const dnnl::memory::desc& y_md, bool has_bias) {
  DnnlConv c{std::move(prim), dnnl::memory(x_md, dnnl_engine(), DNNL_MEMORY_NONE),
             dnnl::memory(w_md, dnnl_engine(), DNNL_MEMORY_NONE), dnnl::memory(b_md, dnnl_engine(), DNNL_MEMORY_NONE),
             dnnl::memory(y_md, dnnl_engine(), DNNL_MEMORY_NONE), {}, 3};
  c.args[0] = {DNNL_ARG_SRC, c.x.get()};
  c.args[1] = {DNNL_ARG_WEIGHTS, c.w.get()};
  c.args[2] = {DNNL_ARG_DST, c.y.get()};
  if (has_bias) {
    c.args[3] = {DNNL_ARG_BIAS, c.b.get()};
    c.nargs = 4;
  }
  return c;
}

std::optional<DnnlConv> build_dnnl_conv(const Geo& g, bool has_bias) {
  using tag = dnnl::memory::format_tag;
  using dt = dnnl::memory::data_type;
  using dims = dnnl::memory::dims;
  const size_t off = kMaxSpatial - g.rank;
  dims xd{g.N, g.C}, yd{g.N, g.M}, wd, strides, dil, pl, pr;
  if (g.G > 1) wd = {g.G, g.M / g.G, g.C / g.G};
  else wd = {g.M, g.C};
  for (size_t i = off; i < kMaxSpatial; ++i) {
    xd.push_back(g.in[i]);
    yd.push_back(g.out[i]);
    wd.push_back(g.k[i]);
    strides.push_back(g.s[i]);
    dil.push_back(g.d[i] - 1);  // oneDNN counts the gaps between taps
    pl.push_back(g.pb[i]);
    pr.push_back(g.pe[i]);
  }
  static const tag act[] = {tag::ncw, tag::nchw, tag::ncdhw};
  static const tag wt[] = {tag::oiw, tag::oihw, tag::oidhw};
  static const tag gwt[] = {tag::goiw, tag::goihw, tag::goidhw};
  try {
    dnnl::memory::desc x_md(xd, dt::f32, act[g.rank - 1]), y_md(yd, dt::f32, act[g.rank - 1]);
    dnnl::memory::desc w_md(wd, dt::f32, g.G > 1 ? gwt[g.rank - 1] : wt[g.rank - 1]);
    dnnl::memory::desc b_md({g.M}, dt::f32, tag::x);
    auto desc = has_bias ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference,
                                                           dnnl::algorithm::convolution_direct, x_md, w_md, b_md, y_md,
                                                           strides, dil, pl, pr)
                         : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference,
                                                           dnnl::algorithm::convolution_direct, x_md, w_md, y_md,
                                                           strides, dil, pl, pr);
    return bind_conv(dnnl::primitive(dnnl::convolution_forward::primitive_desc(desc, dnnl_engine())), x_md, w_md, b_md,
                     y_md, has_bias);
  } catch (const dnnl::error&) {
    return std::nullopt;  // a geometry oneDNN refuses: the direct loop computes the same thing
  }
}

// ONNX ConvTranspose weights [C, M/group, k...] are oneDNN's deconvolution weights (OC, IC) stored in-channel
// first: the iohw / giohw tags. output_padding is a smaller right pad; oneDNN refuses a negative one, and then
// the direct loop runs.
std::optional<DnnlConv> build_dnnl_deconv(const Geo& g, const Dims3& right_pad, bool has_bias) {
  using tag = dnnl::memory::format_tag;
  using dt = dnnl::memory::data_type;
  using dims = dnnl::memory::dims;
  const size_t off = kMaxSpatial - g.rank;
  dims xd{g.N, g.C}, yd{g.N, g.M}, wd, strides, dil, pl, pr;
  if (g.G > 1) wd = {g.G, g.M / g.G, g.C / g.G};
  else wd = {g.M, g.C};
  for (size_t i = off; i < kMaxSpatial; ++i) {
    if (right_pad[i] < 0 || g.pb[i] < 0) return std::nullopt;
    xd.push_back(g.in[i]);
    yd.push_back(g.out[i]);
    wd.push_back(g.k[i]);
    strides.push_back(g.s[i]);
    dil.push_back(g.d[i] - 1);
    pl.push_back(g.pb[i]);
    pr.push_back(right_pad[i]);
  }
  static const tag act[] = {tag::ncw, tag::nchw, tag::ncdhw};
  // Strides rather than tags: oneDNN 2.6 has iohw and giohw but no 1-D iow.
  const int64_t ksz = g.k_size(), Mg = g.M / g.G, Cg = g.C / g.G;
  dims ws = g.G > 1 ? dims{Cg * Mg * ksz, ksz, Mg * ksz} : dims{ksz, Mg * ksz};
  {
    int64_t acc = 1;
    dims sp;
    for (size_t i = kMaxSpatial; i-- > off;) {
      sp.insert(sp.begin(), acc);
      acc *= g.k[i];
    }
    ws.insert(ws.end(), sp.begin(), sp.end());
  }
  try {
    dnnl::memory::desc x_md(xd, dt::f32, act[g.rank - 1]), y_md(yd, dt::f32, act[g.rank - 1]);
    dnnl::memory::desc w_md(wd, dt::f32, ws);
    dnnl::memory::desc b_md({g.M}, dt::f32, tag::x);
    auto desc = has_bias ? dnnl::deconvolution_forward::desc(dnnl::prop_kind::forward_inference,
                                                             dnnl::algorithm::deconvolution_direct, x_md, w_md, b_md,
                                                             y_md, strides, dil, pl, pr)
                         : dnnl::deconvolution_forward::desc(dnnl::prop_kind::forward_inference,
                                                             dnnl::algorithm::deconvolution_direct, x_md, w_md, y_md,
                                                             strides, dil, pl, pr);
    return bind_conv(dnnl::primitive(dnnl::deconvolution_forward::primitive_desc(desc, dnnl_engine())), x_md, w_md,
                     b_md, y_md, has_bias);
  } catch (const dnnl::error&) {
    return std::nullopt;
  }
}

// Executes a prebuilt primitive on the given buffers through the C API with the prebuilt argument array.
void run_dnnl(DnnlConv& d, const void* x, const void* w, const void* b, void* y, const Tensor& what) {
  d.x.set_data_handle(const_cast<void*>(x));
  d.w.set_data_handle(const_cast<void*>(w));
  if (b) d.b.set_data_handle(const_cast<void*>(b));
  d.y.set_data_handle(y);
  dnnl::stream& s = dnnl_stream();
  if (dnnl_primitive_execute(d.prim.get(), s.get(), d.nargs, d.args.data()) != dnnl_success)
    throw Error("oneDNN convolution failed for input " + what.describe());
  s.wait();
}

template <class T> class ConvKernel final : public Kernel {
 public:
  ConvKernel(Geo g, bool has_bias) : g_(g), has_bias_(has_bias) {
    if constexpr (std::is_same_v<T, float>) {
      if (g_.N > 0 && g_.C > 0 && g_.M > 0) dnnl_ = build_dnnl_conv(g_, has_bias);
    }
  }

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const T* x = in[0]->ptr<T>();
    const T* w = in[1]->ptr<T>();
    const T* b = has_bias_ ? in[2]->ptr<T>() : nullptr;
    T* y = out[0]->ptr<T>();
    if (dnnl_) return run_dnnl(*dnnl_, x, w, b, y, *in[0]);
    conv_direct(g_, x, w, b, y);
  }

 private:
  Geo g_;
  bool has_bias_;
  std::optional<DnnlConv> dnnl_;
};

// Kernel dims from the attribute, else from the weights' trailing dims (they must agree when both exist).
std::vector<int64_t> kernel_dims(const PrepareContext& ctx, const std::vector<int64_t>& w_shape) {
  std::vector<int64_t> from_w(w_shape.begin() + 2, w_shape.end());
  if (!ctx.node.has_attr("kernel_shape")) return from_w;
  std::vector<int64_t> k = ctx.node.attr_ints("kernel_shape");
  if (k != from_w)
    ctx.fail("kernel_shape " + shape_string(k) + " does not match the weights " + shape_string(w_shape));
  return k;
}

std::unique_ptr<Kernel> make_conv(PrepareContext& ctx) {
  const KernelInput& x = required_input(ctx, 0, "X");
  const KernelInput& w = required_input(ctx, 1, "W");
  if (w.dtype != x.dtype) ctx.fail("W is " + dtype_name(w.dtype) + " but X is " + dtype_name(x.dtype));
  if (x.shape.size() < 3 || w.shape.size() != x.shape.size())
    ctx.fail("X " + shape_string(x.shape) + " and W " + shape_string(w.shape) + " must have the same rank, 3 to 5");
  Geo g;
  g.N = x.shape[0];
  g.C = x.shape[1];
  g.M = w.shape[0];
  g.G = ctx.node.attr_int("group", 1);
  if (g.G < 1 || g.C % g.G || g.M % g.G || w.shape[1] * g.G != g.C)
    ctx.fail("group " + std::to_string(g.G) + " does not fit X " + shape_string(x.shape) + " and W " +
             shape_string(w.shape) + " (W must be [M, C/group, k...] with C and M divisible by group)");
  window_geometry(ctx, x.shape, kernel_dims(ctx, w.shape), false, g);
  const bool has_bias = cpu::has_input(ctx, 2);
  if (has_bias) {
    const KernelInput& b = ctx.inputs[2];
    if (b.dtype != x.dtype || b.shape != std::vector<int64_t>{g.M})
      ctx.fail("B must be " + dtype_name(x.dtype) + "[" + std::to_string(g.M) + "], got " + dtype_name(b.dtype) +
               shape_string(b.shape));
  }
  set_output(ctx, 0, x.dtype, out_shape(g, g.M));
  if (x.dtype == DType::Float32) return std::make_unique<ConvKernel<float>>(g, has_bias);
  if (x.dtype == DType::Float64) return std::make_unique<ConvKernel<double>>(g, has_bias);
  cpu::fail_dtype(ctx);
}

// ---- ConvTranspose ---------------------------------------------------------------------------------------
// y[n, m, i*s - pb + j*d] += x[n, c, i] * w[c, m', j], m = group(c) * Mg + m'. Geo's `in` is X's spatial
// dims and `out` Y's, as for Conv; here M = W.shape[1] * group.

template <class T> class ConvTransposeKernel final : public Kernel {
 public:
  ConvTransposeKernel(Geo g, Dims3 right_pad, bool has_bias) : g_(g), has_bias_(has_bias) {
    if constexpr (std::is_same_v<T, float>) {
      if (g_.N > 0 && g_.C > 0 && g_.M > 0) dnnl_ = build_dnnl_deconv(g_, right_pad, has_bias);
    }
  }

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const T* x = in[0]->ptr<T>();
    const T* w = in[1]->ptr<T>();
    const T* b = has_bias_ ? in[2]->ptr<T>() : nullptr;
    T* y = out[0]->ptr<T>();
    if (dnnl_) return run_dnnl(*dnnl_, x, w, b, y, *in[0]);
    const Geo g = g_;
    const int64_t Cg = g.C / g.G, Mg = g.M / g.G, isz = g.in_size(), osz = g.out_size(), ksz = g.k_size();
    const int64_t planes = g.N * g.M;
#pragma omp parallel for schedule(static) if (planes * isz * Cg * ksz > (1 << 15))
    for (int64_t p = 0; p < planes; ++p) {
      const int64_t n = p / g.M, m = p % g.M, grp = m / Mg, mg = m % Mg;
      T* yp = y + p * osz;
      std::fill(yp, yp + osz, b ? b[m] : T(0));
      for (int64_t c = 0; c < Cg; ++c) {
        const int64_t ci = grp * Cg + c;
        const T* xp = x + (n * g.C + ci) * isz;
        const T* wp = w + (ci * Mg + mg) * ksz;
        for (int64_t i0 = 0; i0 < g.in[0]; ++i0)
          for (int64_t i1 = 0; i1 < g.in[1]; ++i1)
            for (int64_t i2 = 0; i2 < g.in[2]; ++i2) {
              const T xv = xp[(i0 * g.in[1] + i1) * g.in[2] + i2];
              for (int64_t j0 = 0; j0 < g.k[0]; ++j0) {
                const int64_t o0 = i0 * g.s[0] - g.pb[0] + j0 * g.d[0];
                if (o0 < 0 || o0 >= g.out[0]) continue;
                for (int64_t j1 = 0; j1 < g.k[1]; ++j1) {
                  const int64_t o1 = i1 * g.s[1] - g.pb[1] + j1 * g.d[1];
                  if (o1 < 0 || o1 >= g.out[1]) continue;
                  T* yr = yp + (o0 * g.out[1] + o1) * g.out[2];
                  const T* wr = wp + (j0 * g.k[1] + j1) * g.k[2];
                  for (int64_t j2 = 0; j2 < g.k[2]; ++j2) {
                    const int64_t o2 = i2 * g.s[2] - g.pb[2] + j2 * g.d[2];
                    if (o2 < 0 || o2 >= g.out[2]) continue;
                    yr[o2] += xv * wr[j2];
                  }
                }
              }
            }
      }
    }
  }

 private:
  Geo g_;
  bool has_bias_;
  std::optional<DnnlConv> dnnl_;
};

std::unique_ptr<Kernel> make_conv_transpose(PrepareContext& ctx) {
  const KernelInput& x = required_input(ctx, 0, "X");
  const KernelInput& w = required_input(ctx, 1, "W");
  if (w.dtype != x.dtype) ctx.fail("W is " + dtype_name(w.dtype) + " but X is " + dtype_name(x.dtype));
  if (x.shape.size() < 3 || x.shape.size() > 5 || w.shape.size() != x.shape.size())
    ctx.fail("X " + shape_string(x.shape) + " and W " + shape_string(w.shape) + " must have the same rank, 3 to 5");
  Geo g;
  g.N = x.shape[0];
  g.C = x.shape[1];
  g.G = ctx.node.attr_int("group", 1);
  if (g.G < 1 || w.shape[0] != g.C || g.C % g.G)
    ctx.fail("W " + shape_string(w.shape) + " must be [C, M/group, k...] for X " + shape_string(x.shape) +
             " and group " + std::to_string(g.G));
  g.M = w.shape[1] * g.G;
  const size_t r = x.shape.size() - 2;
  g.rank = r;
  const std::vector<int64_t> k = kernel_dims(ctx, w.shape);
  const std::vector<int64_t> strides = spatial_attr(ctx, "strides", r, 1);
  const std::vector<int64_t> dil = spatial_attr(ctx, "dilations", r, 1);
  const std::vector<int64_t> opad = spatial_attr(ctx, "output_padding", r, 0);
  std::vector<int64_t> pads = ctx.node.attr_ints("pads", std::vector<int64_t>(2 * r, 0));
  if (pads.size() != 2 * r)
    ctx.fail("attribute 'pads' has " + std::to_string(pads.size()) + " entries, expected " + std::to_string(2 * r));
  const std::string auto_pad = ctx.node.attr_string("auto_pad", "NOTSET");
  if (auto_pad != "NOTSET" && auto_pad != "SAME_UPPER" && auto_pad != "SAME_LOWER" && auto_pad != "VALID")
    ctx.fail("auto_pad '" + auto_pad + "' is not one of NOTSET, SAME_UPPER, SAME_LOWER, VALID");
  std::vector<int64_t> oshape;
  if (ctx.node.has_attr("output_shape")) {
    oshape = ctx.node.attr_ints("output_shape");
    if (oshape.size() == r + 2) oshape.erase(oshape.begin(), oshape.begin() + 2);
    if (oshape.size() != r) ctx.fail("output_shape must list the " + std::to_string(r) + " spatial dims");
  }
  const size_t off = kMaxSpatial - r;
  Dims3 right_pad{0, 0, 0};
  for (size_t i = 0; i < r; ++i) {
    const int64_t in = x.shape[2 + i], s = strides[i], d = dil[i], ext = (k[i] - 1) * d + 1;
    if (k[i] < 1 || s < 1 || d < 1) ctx.fail("kernel, strides and dilations must be >= 1");
    int64_t pb = pads[i], pe = pads[i + r], out;
    const bool same = auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER";
    if (!oshape.empty() || same) {
      // The spec's rule: the padding that makes the output the requested size, split with the odd unit at the
      // end for SAME_UPPER and at the start otherwise.
      out = oshape.empty() ? in * s : oshape[i];
      const int64_t total = s * (in - 1) + opad[i] + ext - out;
      if (total < 0 && oshape.empty()) ctx.fail("negative total padding");
      const int64_t t = std::max<int64_t>(total, 0);
      if (auto_pad == "SAME_UPPER") {
        pb = t / 2;
        pe = t - t / 2;
      } else {
        pb = t - t / 2;
        pe = t / 2;
      }
      if (total < 0) pe = total;  // output_shape larger than the full result: the tail stays bias-only
    } else {
      if (auto_pad == "VALID") pb = pe = 0;
      out = s * (in - 1) + opad[i] + ext - pb - pe;
    }
    if (out <= 0) ctx.fail("the output would be empty for input " + shape_string(x.shape));
    // The end padding that gives exactly `out` (output_padding and output_shape folded in), for oneDNN.
    right_pad[off + i] = s * (in - 1) + ext - pb - out;
    g.in[off + i] = in;
    g.out[off + i] = out;
    g.k[off + i] = k[i];
    g.s[off + i] = s;
    g.d[off + i] = d;
    g.pb[off + i] = pb;
    g.pe[off + i] = pe;
  }
  const bool has_bias = cpu::has_input(ctx, 2);
  if (has_bias && (ctx.inputs[2].dtype != x.dtype || ctx.inputs[2].shape != std::vector<int64_t>{g.M}))
    ctx.fail("B must be " + dtype_name(x.dtype) + "[" + std::to_string(g.M) + "], got " +
             dtype_name(ctx.inputs[2].dtype) + shape_string(ctx.inputs[2].shape));
  set_output(ctx, 0, x.dtype, out_shape(g, g.M));
  if (x.dtype == DType::Float32) return std::make_unique<ConvTransposeKernel<float>>(g, right_pad, has_bias);
  if (x.dtype == DType::Float64) return std::make_unique<ConvTransposeKernel<double>>(g, right_pad, has_bias);
  cpu::fail_dtype(ctx);
}

// ---- pooling ---------------------------------------------------------------------------------------------

// Calls f(offset within the plane) for every input position of output (o0, o1, o2)'s pooling window that lies
// inside the input (padding is skipped). A template so the pooling loops stay inlined.
template <class F> inline void for_each_in_window(const Geo& g, int64_t o0, int64_t o1, int64_t o2, F&& f) {
  for (int64_t j0 = 0; j0 < g.k[0]; ++j0) {
    const int64_t i0 = o0 * g.s[0] - g.pb[0] + j0 * g.d[0];
    if (i0 < 0 || i0 >= g.in[0]) continue;
    for (int64_t j1 = 0; j1 < g.k[1]; ++j1) {
      const int64_t i1 = o1 * g.s[1] - g.pb[1] + j1 * g.d[1];
      if (i1 < 0 || i1 >= g.in[1]) continue;
      for (int64_t j2 = 0; j2 < g.k[2]; ++j2) {
        const int64_t i2 = o2 * g.s[2] - g.pb[2] + j2 * g.d[2];
        if (i2 < 0 || i2 >= g.in[2]) continue;
        f((i0 * g.in[1] + i1) * g.in[2] + i2);
      }
    }
  }
}

// The maxima of one output row (fixed o0, o1) of plane xp: best[o2] and their offsets arg[o2] within the plane
// (-1 where the window holds no input). Taps outer, the row inner: for each tap the row's in-bounds outputs
// read x at a fixed stride and update (best, arg) by selects, not branches (random data mispredicts a compare
// per tap otherwise; this loop was half of W2's training step). Per output the taps come in row-major order and
// the test keeps the first maximum and lets a NaN win, as in the reference. arg may be null (values only).
template <class T> void max_pool_row(const Geo& g, const T* xp, int64_t o0, int64_t o1, T* best, int64_t* arg) {
  std::fill(best, best + g.out[2], -std::numeric_limits<T>::infinity());
  if (arg) std::fill(arg, arg + g.out[2], int64_t{-1});
  for (int64_t j0 = 0; j0 < g.k[0]; ++j0) {
    const int64_t i0 = o0 * g.s[0] - g.pb[0] + j0 * g.d[0];
    if (i0 < 0 || i0 >= g.in[0]) continue;
    for (int64_t j1 = 0; j1 < g.k[1]; ++j1) {
      const int64_t i1 = o1 * g.s[1] - g.pb[1] + j1 * g.d[1];
      if (i1 < 0 || i1 >= g.in[1]) continue;
      const T* xr = xp + (i0 * g.in[1] + i1) * g.in[2];
      const int64_t base = (i0 * g.in[1] + i1) * g.in[2];
      for (int64_t j2 = 0; j2 < g.k[2]; ++j2) {
        // Outputs o2 whose tap i2 = o2*s - pb + j2*d lies in [0, in).
        const int64_t shift = j2 * g.d[2] - g.pb[2], s2 = g.s[2];
        const int64_t lo = shift >= 0 ? 0 : (-shift + s2 - 1) / s2;
        const int64_t hi = std::min(g.out[2], g.in[2] - shift <= 0 ? 0 : (g.in[2] - shift - 1) / s2 + 1);
        if (arg) {
          for (int64_t o2 = lo; o2 < hi; ++o2) {
            const T v = xr[shift + o2 * s2];
            const bool take = arg[o2] < 0 || v > best[o2] || (v != v && best[o2] == best[o2]);
            best[o2] = take ? v : best[o2];
            arg[o2] = take ? base + shift + o2 * s2 : arg[o2];
          }
        } else {
          for (int64_t o2 = lo; o2 < hi; ++o2) {
            const T v = xr[shift + o2 * s2];
            const bool take = v > best[o2] || (v != v && best[o2] == best[o2]);
            best[o2] = take ? v : best[o2];
          }
        }
      }
    }
  }
}

template <class T> class MaxPoolKernel final : public Kernel {
 public:
  MaxPoolKernel(Geo g, bool indices, bool col_major) : g_(g), indices_(indices), col_major_(col_major) {}

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const T* x = in[0]->ptr<T>();
    T* y = out[0]->ptr<T>();
    int64_t* idx = indices_ ? out[1]->ptr<int64_t>() : nullptr;
    const Geo g = g_;
    const int64_t isz = g.in_size(), osz = g.out_size(), planes = g.N * g.C;
#pragma omp parallel for schedule(static) if (planes * osz * g.k_size() > (1 << 15))
    for (int64_t p = 0; p < planes; ++p)
      for (int64_t o0 = 0; o0 < g.out[0]; ++o0)
        for (int64_t o1 = 0; o1 < g.out[1]; ++o1) {
          const int64_t row = p * osz + (o0 * g.out[1] + o1) * g.out[2];
          int64_t* arg = idx ? idx + row : nullptr;
          max_pool_row(g, x + p * isz, o0, o1, y + row, arg);
          if (arg)
            for (int64_t o2 = 0; o2 < g.out[2]; ++o2)
              if (arg[o2] >= 0) arg[o2] = p * isz + (col_major_ ? col_major_index(g, arg[o2]) : arg[o2]);
        }
  }

 private:
  // storage_order=1: the offset within the plane with the spatial dims in column-major order.
  static int64_t col_major_index(const Geo& g, int64_t at) {
    const int64_t i2 = at % g.in[2], i1 = (at / g.in[2]) % g.in[1], i0 = at / (g.in[2] * g.in[1]);
    const size_t off = kMaxSpatial - g.rank;
    const std::array<int64_t, 3> pos{i0, i1, i2};
    int64_t r = 0, mul = 1;
    for (size_t i = off; i < kMaxSpatial; ++i) {
      r += pos[i] * mul;
      mul *= g.in[i];
    }
    return r;
  }

  Geo g_;
  bool indices_, col_major_;
};

// onnxtrain.MaxPoolGrad(dY, X) -> dX, with MaxPool's attributes: each dY goes to its window's first maximum,
// found again from X (ONNX MaxPool outputs no indices unless asked), in one pass per plane. Its function body
// recomputes MaxPool's Indices and scatters dY into zeros with ScatterElements.
template <class T> class MaxPoolGradKernel final : public Kernel {
 public:
  explicit MaxPoolGradKernel(Geo g) : g_(g) {
    // One row of maxima and offsets per thread, so run() allocates nothing.
    const size_t threads = static_cast<size_t>(std::max(1, omp_get_max_threads()));
    best_.resize(threads * static_cast<size_t>(g_.out[2]));
    arg_.resize(threads * static_cast<size_t>(g_.out[2]));
  }

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const T* dy = in[0]->ptr<T>();
    const T* x = in[1]->ptr<T>();
    T* dx = out[0]->ptr<T>();
    const Geo g = g_;
    const int64_t isz = g.in_size(), osz = g.out_size(), planes = g.N * g.C;
    const int threads = static_cast<int>(best_.size() / static_cast<size_t>(g.out[2]));
#pragma omp parallel for schedule(static) num_threads(threads) if (planes * osz * g.k_size() > (1 << 15))
    for (int64_t p = 0; p < planes; ++p) {
      const size_t slot = static_cast<size_t>(omp_get_thread_num()) * static_cast<size_t>(g.out[2]);
      T* best = best_.data() + slot;
      int64_t* arg = arg_.data() + slot;
      T* dxp = dx + p * isz;
      std::fill(dxp, dxp + isz, T(0));
      for (int64_t o0 = 0; o0 < g.out[0]; ++o0)
        for (int64_t o1 = 0; o1 < g.out[1]; ++o1) {
          max_pool_row(g, x + p * isz, o0, o1, best, arg);
          const T* dyr = dy + p * osz + (o0 * g.out[1] + o1) * g.out[2];
          for (int64_t o2 = 0; o2 < g.out[2]; ++o2)
            if (arg[o2] >= 0) dxp[arg[o2]] += dyr[o2];
        }
    }
  }

 private:
  Geo g_;
  std::vector<T> best_;
  std::vector<int64_t> arg_;
};

template <class T> class AvgPoolKernel final : public Kernel {
 public:
  AvgPoolKernel(Geo g, bool include_pad) : g_(g), include_pad_(include_pad) {}

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const T* x = in[0]->ptr<T>();
    T* y = out[0]->ptr<T>();
    const Geo g = g_;
    const int64_t isz = g.in_size(), osz = g.out_size(), planes = g.N * g.C;
#pragma omp parallel for schedule(static) if (planes * osz * g.k_size() > (1 << 15))
    for (int64_t p = 0; p < planes; ++p) {
      const T* xp = x + p * isz;
      for (int64_t o0 = 0; o0 < g.out[0]; ++o0)
        for (int64_t o1 = 0; o1 < g.out[1]; ++o1)
          for (int64_t o2 = 0; o2 < g.out[2]; ++o2) {
            T acc = 0;
            const std::array<int64_t, 3> o{o0, o1, o2};
            for_each_in_window(g, o0, o1, o2, [&](int64_t at) { acc += xp[at]; });
            y[p * osz + (o0 * g.out[1] + o1) * g.out[2] + o2] = acc / static_cast<T>(count(g, o));
          }
    }
  }

  // Taps of the window at output o that are averaged: those inside the input, or with count_include_pad
  // those inside the padded input, where (as in the ONNX reference) ceil_mode's windows past the end pad
  // extend the padding. PyTorch instead leaves those taps out of the divisor.
  int64_t count(const Geo& g, const std::array<int64_t, 3>& o) const {
    int64_t n = 1;
    for (size_t i = 0; i < kMaxSpatial; ++i) {
      const int64_t padded_end = std::max(g.in[i] + g.pe[i], (g.out[i] - 1) * g.s[i] - g.pb[i] + (g.k[i] - 1) * g.d[i] + 1);
      const int64_t lo = include_pad_ ? -g.pb[i] : 0, hi = include_pad_ ? padded_end : g.in[i];
      int64_t c = 0;
      for (int64_t j = 0; j < g.k[i]; ++j) {
        const int64_t at = o[i] * g.s[i] - g.pb[i] + j * g.d[i];
        c += at >= lo && at < hi;
      }
      n *= c;
    }
    return std::max<int64_t>(n, 1);
  }

 private:
  Geo g_;
  bool include_pad_;
};

template <class T, bool Max> class GlobalPoolKernel final : public Kernel {
 public:
  GlobalPoolKernel(int64_t planes, int64_t size) : planes_(planes), size_(size) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const T* x = in[0]->ptr<T>();
    T* y = out[0]->ptr<T>();
#pragma omp parallel for schedule(static) if (planes_ * size_ > (1 << 15))
    for (int64_t p = 0; p < planes_; ++p) {
      const T* xp = x + p * size_;
      if constexpr (Max) {
        T m = -std::numeric_limits<T>::infinity();
        for (int64_t i = 0; i < size_; ++i)
          if (xp[i] > m || std::isnan(xp[i])) m = xp[i];
        y[p] = m;
      } else {
        double s = 0;  // a large spatial plane loses float digits otherwise
        for (int64_t i = 0; i < size_; ++i) s += xp[i];
        y[p] = static_cast<T>(s / static_cast<double>(size_));
      }
    }
  }

 private:
  int64_t planes_, size_;
};

Geo pool_geometry(PrepareContext& ctx, size_t x_input = 0) {
  const KernelInput& x = required_input(ctx, x_input, "X");
  if (x.shape.size() < 3) ctx.fail("X " + shape_string(x.shape) + " must have rank 3 to 5");
  if (!ctx.node.has_attr("kernel_shape")) ctx.fail("attribute 'kernel_shape' is required");
  const std::vector<int64_t> k = ctx.node.attr_ints("kernel_shape");
  if (k.size() != x.shape.size() - 2)
    ctx.fail("kernel_shape has " + std::to_string(k.size()) + " entries for input " + shape_string(x.shape));
  Geo g;
  g.N = x.shape[0];
  g.C = g.M = x.shape[1];
  window_geometry(ctx, x.shape, k, ctx.node.attr_int("ceil_mode", 0) != 0, g);
  return g;
}

std::unique_ptr<Kernel> make_max_pool(PrepareContext& ctx) {
  const Geo g = pool_geometry(ctx);
  const DType t = ctx.inputs[0].dtype;
  const bool indices = ctx.outputs.size() > 1 && !ctx.node.outputs[1].empty();
  const int64_t order = ctx.node.attr_int("storage_order", 0);
  if (order != 0 && order != 1) ctx.fail("storage_order must be 0 or 1");
  set_output(ctx, 0, t, out_shape(g, g.C));
  if (ctx.outputs.size() > 1) set_output(ctx, 1, DType::Int64, out_shape(g, g.C));
  if (t == DType::Float32) return std::make_unique<MaxPoolKernel<float>>(g, indices, order == 1);
  if (t == DType::Float64) return std::make_unique<MaxPoolKernel<double>>(g, indices, order == 1);
  cpu::fail_dtype(ctx);
}

std::unique_ptr<Kernel> make_max_pool_grad(PrepareContext& ctx) {
  const Geo g = pool_geometry(ctx, 1);
  const KernelInput& dy = required_input(ctx, 0, "dY");
  const DType t = ctx.inputs[1].dtype;
  if (dy.dtype != t || dy.shape != out_shape(g, g.C))
    ctx.fail("dY is " + dtype_name(dy.dtype) + shape_string(dy.shape) + ", expected MaxPool's output " +
             dtype_name(t) + shape_string(out_shape(g, g.C)));
  if (ctx.node.attr_int("storage_order", 0) != 0) ctx.fail("storage_order does not apply (no indices are output)");
  set_output(ctx, 0, t, ctx.inputs[1].shape);
  if (t == DType::Float32) return std::make_unique<MaxPoolGradKernel<float>>(g);
  if (t == DType::Float64) return std::make_unique<MaxPoolGradKernel<double>>(g);
  cpu::fail_dtype(ctx);
}

std::unique_ptr<Kernel> make_avg_pool(PrepareContext& ctx) {
  const Geo g = pool_geometry(ctx);
  const DType t = ctx.inputs[0].dtype;
  const bool include_pad = ctx.node.attr_int("count_include_pad", 0) != 0;
  set_output(ctx, 0, t, out_shape(g, g.C));
  if (t == DType::Float32) return std::make_unique<AvgPoolKernel<float>>(g, include_pad);
  if (t == DType::Float64) return std::make_unique<AvgPoolKernel<double>>(g, include_pad);
  cpu::fail_dtype(ctx);
}

template <bool Max> std::unique_ptr<Kernel> make_global_pool(PrepareContext& ctx) {
  const KernelInput& x = required_input(ctx, 0, "X");
  if (x.shape.size() < 3) ctx.fail("X " + shape_string(x.shape) + " must have rank >= 3");
  std::vector<int64_t> out{x.shape[0], x.shape[1]};
  int64_t size = 1;
  for (size_t i = 2; i < x.shape.size(); ++i) {
    out.push_back(1);
    size *= x.shape[i];
  }
  if (size == 0) ctx.fail("X " + shape_string(x.shape) + " has an empty spatial plane");
  set_output(ctx, 0, x.dtype, out);
  const int64_t planes = x.shape[0] * x.shape[1];
  if (x.dtype == DType::Float32) return std::make_unique<GlobalPoolKernel<float, Max>>(planes, size);
  if (x.dtype == DType::Float64) return std::make_unique<GlobalPoolKernel<double, Max>>(planes, size);
  cpu::fail_dtype(ctx);
}

}  // namespace

void register_cpu_conv(KernelRegistry& r) {
  const std::vector<DType> flt = {DType::Float32, DType::Float64};
  cpu::add(r, "Conv", 1, flt, make_conv);
  cpu::add(r, "ConvTranspose", 1, flt, make_conv_transpose);
  cpu::add(r, "MaxPool", 1, flt, make_max_pool);
  cpu::add(r, "onnxtrain", "MaxPoolGrad", 1, flt, make_max_pool_grad);
  cpu::add(r, "AveragePool", 1, flt, make_avg_pool);
  cpu::add(r, "GlobalAveragePool", 1, flt, make_global_pool<false>);
  cpu::add(r, "GlobalMaxPool", 1, flt, make_global_pool<true>);
}

}  // namespace onnxtrain
