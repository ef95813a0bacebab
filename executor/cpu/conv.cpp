// Conv, ConvTranspose and the fused ConvGrad on the CPU (pooling: pool.cpp). The geometry
// (executor/ops/conv_geometry.h) is canonicalised to three spatial dims, so one set of loops serves 1-D to 3-D.
// float32 Conv and ConvGrad run onnxtrain's own AVX-512 convolutions (direct_conv.h) where they take the geometry:
// they allocate nothing per call, which oneDNN's primitives cannot promise; so does ConvTranspose, as a Conv's input
// gradient. Otherwise (no AVX-512, fewer than 8 channels per group), float32 runs oneDNN primitives built at plan
// time on the layouts oneDNN chooses, with reorders from and to the plain (ncdhw/oidhw) tensors at the kernel
// boundary (see Staged); run() only swaps data handles. Everything else (float64 and geometries oneDNN refuses)
// is a direct loop, parallel over planes (or weight rows) so no two threads write the same output.
#include <omp.h>

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include "executor/ops/conv.h"
#include "executor/ops/conv_geometry.h"
#include "executor/cpu/direct_conv.h"
#include "executor/cpu/dnnl_context.h"
#include "executor/cpu/kernel_util.h"
#include "executor/kernel.h"
#include "graph/error.h"

#if defined(__AVX512F__)
#include <immintrin.h>

#include "executor/cpu/avx512.h"
#endif

namespace onnxtrain {
namespace {

using ops::conv_geometry;
using ops::conv_transpose_geometry;
using ops::Dims3;
using ops::Geo;
using ops::kMaxSpatial;
using ops::out_shape;
using ops::pool_geometry;
using cpu::required_input;
using cpu::set_output;
using ops::wanted_outputs;

// ---- Conv ------------------------------------------------------------------------------------------------

// Direct convolution: y[n, m, o] = b[m] + sum_{c in m's group, j} x[n, c, o*s - pb + j*d] * w[m, c, j].
template <class T> void conv_direct(const Geo& g, const T* x, const T* w, const T* b, T* y) {
  const int64_t Cg = g.C / g.G, Mg = g.M / g.G, isz = g.in_size(), osz = g.out_size(), ksz = g.k_size();
  const int64_t planes = g.N * g.M;
  cpu::parallel_for(planes, planes * osz * Cg * ksz > (1 << 15), [&](int64_t p) {
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
  });
}

using cpu::dnnl_engine;
using cpu::dnnl_stream;

// A 64-byte aligned byte buffer allocated once, at plan time.
struct AlignedBytes {
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::unique_ptr<std::byte, Free> p;
  static AlignedBytes of(size_t n) {
    const size_t size = (std::max<size_t>(n, 1) + 63) / 64 * 64;
    auto* raw = static_cast<std::byte*>(std::aligned_alloc(64, size));
    if (!raw) throw Error("cannot allocate " + std::to_string(size) + " bytes for a oneDNN buffer");
    return {std::unique_ptr<std::byte, Free>(raw)};
  }
};

// The staging buffers and scratchpads of every oneDNN convolution kernel on a thread share one arena: a kernel
// needs them only while it runs, so a plan holds the largest kernel's need once rather than every kernel's (with a
// buffer per kernel, W2's process grew by ~150 MB, most of it for the whole-data-set evaluation plan). The arena
// grows when a kernel is built and, should a plan run on another thread, on its first run there; never in a
// steady state. Thread-local, so plans running on different threads do not share it.
std::byte* conv_arena(size_t bytes) {
  thread_local AlignedBytes arena;
  thread_local size_t size = 0;
  if (size < bytes) {
    arena = AlignedBytes::of(bytes);
    size = bytes;
  }
  return arena.p.get();
}

// Offsets into the arena, assigned while a kernel's primitives are built.
struct ArenaLayout {
  size_t bytes = 0;
  size_t take(size_t n) {
    const size_t at = bytes;
    bytes += (n + 63) / 64 * 64;
    return at;
  }
};

// One primitive with its argument array and its user-managed scratchpad (in the arena, so execute() allocates
// no scratchpad), ready to run once bound to the arena.
struct DnnlStep {
  dnnl::primitive prim;
  std::vector<dnnl_exec_arg_t> args;
  dnnl::memory scratch_mem;  // empty when the primitive needs none
  size_t scratch_at = 0;
  void bind(std::byte* arena) const {
    if (scratch_mem) scratch_mem.set_data_handle(arena + scratch_at);
  }
};

DnnlStep make_step(const dnnl::primitive_desc_base& pd, std::vector<dnnl_exec_arg_t> args, ArenaLayout& arena) {
  DnnlStep s{dnnl::primitive(pd.get()), std::move(args), {}, 0};
  const dnnl::memory::desc d = pd.scratchpad_desc();
  if (d.get_size() > 0) {
    s.scratch_at = arena.take(d.get_size());
    s.scratch_mem = dnnl::memory(d, dnnl_engine(), DNNL_MEMORY_NONE);
    s.args.push_back({DNNL_ARG_SCRATCHPAD, s.scratch_mem.get()});
  }
  return s;
}

dnnl::primitive_attr user_scratchpad() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

void execute(const DnnlStep& s, const Tensor& what) {
  dnnl::stream& st = dnnl_stream();
  if (dnnl_primitive_execute(s.prim.get(), st.get(), static_cast<int>(s.args.size()), s.args.data()) != dnnl_success)
    throw Error("oneDNN convolution failed for " + what.describe());
  st.wait();
}

// A primitive argument in the layout the primitive chose (format_tag::any), next to the tensor as the plan
// stores it (plain ncdhw / oidhw). oneDNN's fast convolutions (jit:avx512_core and friends) want channel-
// blocked layouts (nChw16c, OIhw16i16o, ...); on plain layouts it falls back to gemm:jit, which runs one sgemm
// per image and mallocs its workspace per call. So when the layouts differ, the argument lives in a plan-time
// buffer and a reorder primitive converts at the kernel boundary (in before, out after). When they agree (the
// first layer's one-channel input, the bias), `inner` is `user` itself and nothing is copied.
struct Staged {
  dnnl::memory user;   // the tensor as stored; run() sets its handle
  dnnl::memory inner;  // what the primitive reads or writes
  std::optional<DnnlStep> reorder;
  size_t at = 0;       // inner's offset in the arena, when it is not `user`

  void set(const void* p) { user.set_data_handle(const_cast<void*>(p)); }
  void bind(std::byte* arena) const {
    if (!reorder) return;
    inner.set_data_handle(arena + at);
    reorder->bind(arena);
  }
  void convert(const Tensor& what) const {
    if (reorder) execute(*reorder, what);
  }
};

// `into`: the reorder runs plain -> chosen (an input of the primitive), else chosen -> plain (an output).
Staged stage(const dnnl::memory::desc& plain, const dnnl::memory::desc& chosen, bool into, ArenaLayout& arena) {
  const dnnl::engine& eng = dnnl_engine();
  Staged s{dnnl::memory(plain, eng, DNNL_MEMORY_NONE), {}, std::nullopt, 0};
  if (chosen == plain) {
    s.inner = s.user;
    return s;
  }
  s.at = arena.take(chosen.get_size());
  s.inner = dnnl::memory(chosen, eng, DNNL_MEMORY_NONE);
  const dnnl::memory& from = into ? s.user : s.inner;
  const dnnl::memory& to = into ? s.inner : s.user;
  const dnnl::reorder::primitive_desc pd(eng, from.get_desc(), eng, to.get_desc(), user_scratchpad());
  s.reorder = make_step(pd, {{DNNL_ARG_FROM, from.get()}, {DNNL_ARG_TO, to.get()}}, arena);
  return s;
}

// A forward convolution or deconvolution: X and W reordered in, Y reordered out when their chosen layouts
// are not the plain ones.
struct DnnlConv {
  Staged x, w, y;
  dnnl::memory b;
  DnnlStep conv;
  size_t arena_bytes = 0;
};

template <class PD> DnnlConv bind_conv(const PD& pd, const dnnl::memory::desc& x_md, const dnnl::memory::desc& w_md,
                                       const dnnl::memory::desc& b_md, const dnnl::memory::desc& y_md, bool has_bias) {
  ArenaLayout arena;
  DnnlConv c{stage(x_md, pd.src_desc(), true, arena), stage(w_md, pd.weights_desc(), true, arena),
             stage(y_md, pd.dst_desc(), false, arena), dnnl::memory(b_md, dnnl_engine(), DNNL_MEMORY_NONE), {}, 0};
  std::vector<dnnl_exec_arg_t> args{{DNNL_ARG_SRC, c.x.inner.get()},
                                    {DNNL_ARG_WEIGHTS, c.w.inner.get()},
                                    {DNNL_ARG_DST, c.y.inner.get()}};
  if (has_bias) args.push_back({DNNL_ARG_BIAS, c.b.get()});
  c.conv = make_step(pd, std::move(args), arena);
  c.arena_bytes = arena.bytes;
  conv_arena(arena.bytes);
  return c;
}

// oneDNN's view of a geometry: activations [N, C, in...] and [N, M, out...], weights [(G,) M/G, C/G, k...],
// dilations as gaps between taps, and the right pads given (Conv's pe; ConvTranspose's folds in
// output_padding and output_shape). Empty when oneDNN cannot express it (a negative pad).
struct DnnlGeo {
  dnnl::memory::dims x, y, w, strides, dil, pl, pr;
};

std::optional<DnnlGeo> dnnl_geo(const Geo& g, const Dims3& right_pad) {
  const size_t off = kMaxSpatial - g.rank;
  DnnlGeo d{{g.N, g.C}, {g.N, g.M}, {}, {}, {}, {}, {}};
  if (g.G > 1) d.w = {g.G, g.M / g.G, g.C / g.G};
  else d.w = {g.M, g.C};
  for (size_t i = off; i < kMaxSpatial; ++i) {
    if (right_pad[i] < 0 || g.pb[i] < 0) return std::nullopt;
    d.x.push_back(g.in[i]);
    d.y.push_back(g.out[i]);
    d.w.push_back(g.k[i]);
    d.strides.push_back(g.s[i]);
    d.dil.push_back(g.d[i] - 1);  // oneDNN counts the gaps between taps
    d.pl.push_back(g.pb[i]);
    d.pr.push_back(right_pad[i]);
  }
  return d;
}

// Plain-layout (ncdhw / oidhw / goidhw) descriptors of a Conv's X, W, B and Y, as the tensors are stored.
struct ConvMds {
  dnnl::memory::desc x, w, b, y;
};

ConvMds plain_conv_mds(const Geo& g, const DnnlGeo& geo) {
  using tag = dnnl::memory::format_tag;
  using dt = dnnl::memory::data_type;
  static const tag act[] = {tag::ncw, tag::nchw, tag::ncdhw};
  static const tag wt[] = {tag::oiw, tag::oihw, tag::oidhw};
  static const tag gwt[] = {tag::goiw, tag::goihw, tag::goidhw};
  return {dnnl::memory::desc(geo.x, dt::f32, act[g.rank - 1]),
          dnnl::memory::desc(geo.w, dt::f32, g.G > 1 ? gwt[g.rank - 1] : wt[g.rank - 1]),
          dnnl::memory::desc({g.M}, dt::f32, tag::x), dnnl::memory::desc(geo.y, dt::f32, act[g.rank - 1])};
}

// The same shapes with the layouts left to the primitive (format_tag::any); the bias stays plain.
ConvMds any_conv_mds(const Geo& g, const DnnlGeo& geo) {
  using tag = dnnl::memory::format_tag;
  using dt = dnnl::memory::data_type;
  return {dnnl::memory::desc(geo.x, dt::f32, tag::any), dnnl::memory::desc(geo.w, dt::f32, tag::any),
          dnnl::memory::desc({g.M}, dt::f32, tag::x), dnnl::memory::desc(geo.y, dt::f32, tag::any)};
}

// A chosen activation layout that pads the channels a lot (a blocked layout for 1-4 channels stores 16): the
// primitive would read and write several times the data, plus the reorders. Then the plain layouts are used (the
// AveragePoolGrad function body's single-channel Conv and ConvTranspose ran 3-4x slower blocked).
bool pads_much(const dnnl::memory::desc& chosen, const dnnl::memory::desc& plain) {
  return chosen.get_size() > plain.get_size() + plain.get_size() / 4;
}

std::optional<DnnlConv> build_dnnl_conv(const Geo& g, bool has_bias) {
  const std::optional<DnnlGeo> geo = dnnl_geo(g, g.pe);
  if (!geo) return std::nullopt;
  try {
    const ConvMds plain = plain_conv_mds(g, *geo);
    const auto algo = dnnl::algorithm::convolution_direct;
    const auto prop = dnnl::prop_kind::forward_inference;
    auto make = [&](const ConvMds& md) {
      auto desc = has_bias ? dnnl::convolution_forward::desc(prop, algo, md.x, md.w, md.b, md.y, geo->strides,
                                                             geo->dil, geo->pl, geo->pr)
                           : dnnl::convolution_forward::desc(prop, algo, md.x, md.w, md.y, geo->strides, geo->dil,
                                                             geo->pl, geo->pr);
      return dnnl::convolution_forward::primitive_desc(desc, user_scratchpad(), dnnl_engine());
    };
    dnnl::convolution_forward::primitive_desc pd = make(any_conv_mds(g, *geo));
    if (pads_much(pd.src_desc(), plain.x) || pads_much(pd.dst_desc(), plain.y)) pd = make(plain);
    return bind_conv(pd, plain.x, plain.w, plain.b, plain.y, has_bias);
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
  const std::optional<DnnlGeo> geo = dnnl_geo(g, right_pad);
  if (!geo) return std::nullopt;
  // Named references, not a structured binding: clang 14 (the sanitizer build) cannot capture those in a lambda.
  const dims &xd = geo->x, &yd = geo->y, &wd = geo->w, &strides = geo->strides, &dil = geo->dil, &pl = geo->pl,
             &pr = geo->pr;
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
    const dnnl::memory::desc xa(xd, dt::f32, tag::any), wa(wd, dt::f32, tag::any), ya(yd, dt::f32, tag::any);
    auto make = [&](const dnnl::memory::desc& x, const dnnl::memory::desc& w, const dnnl::memory::desc& y) {
      auto desc = has_bias ? dnnl::deconvolution_forward::desc(dnnl::prop_kind::forward_inference,
                                                               dnnl::algorithm::deconvolution_direct, x, w, b_md, y,
                                                               strides, dil, pl, pr)
                           : dnnl::deconvolution_forward::desc(dnnl::prop_kind::forward_inference,
                                                               dnnl::algorithm::deconvolution_direct, x, w, y, strides,
                                                               dil, pl, pr);
      return dnnl::deconvolution_forward::primitive_desc(desc, user_scratchpad(), dnnl_engine());
    };
    dnnl::deconvolution_forward::primitive_desc pd = make(xa, wa, ya);
    if (pads_much(pd.src_desc(), x_md) || pads_much(pd.dst_desc(), y_md)) pd = make(x_md, w_md, y_md);
    return bind_conv(pd, x_md, w_md, b_md, y_md, has_bias);
  } catch (const dnnl::error&) {
    return std::nullopt;
  }
}

// Executes the prebuilt primitives on the given buffers: reorders in, the convolution, the reorder out.
void run_dnnl(DnnlConv& d, const void* x, const void* w, const void* b, void* y, const Tensor& what) {
  d.x.set(x);
  d.w.set(w);
  if (b) d.b.set_data_handle(const_cast<void*>(b));
  d.y.set(y);
  std::byte* arena = conv_arena(d.arena_bytes);
  d.x.bind(arena);
  d.w.bind(arena);
  d.y.bind(arena);
  d.conv.bind(arena);
  d.x.convert(what);
  d.w.convert(what);
  execute(d.conv, what);
  d.y.convert(what);
}

template <class T> class ConvKernel final : public Kernel {
 public:
  ConvKernel(Geo g, bool has_bias) : g_(g), has_bias_(has_bias) {
    if constexpr (std::is_same_v<T, float>) {
      if (cpu::DirectConv::supports_forward(g_))
        own_.emplace(g_);
      else if (g_.N > 0 && g_.C > 0 && g_.M > 0)
        dnnl_ = build_dnnl_conv(g_, has_bias);
    }
  }

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const T* x = in[0]->ptr<T>();
    const T* w = in[1]->ptr<T>();
    const T* b = has_bias_ ? in[2]->ptr<T>() : nullptr;
    T* y = out[0]->ptr<T>();
    if constexpr (std::is_same_v<T, float>) {
      if (own_) return own_->forward(x, w, b, y);
    }
    if (dnnl_) return run_dnnl(*dnnl_, x, w, b, y, *in[0]);
    conv_direct(g_, x, w, b, y);
  }

 private:
  Geo g_;
  bool has_bias_;
  std::optional<cpu::DirectConv> own_;
  std::optional<DnnlConv> dnnl_;
};

std::unique_ptr<Kernel> make_conv(PrepareContext& ctx) {
  const ops::ConvAttrs a = ops::prepare_conv(ctx);
  const DType t = ctx.inputs[0].dtype;
  if (t == DType::Float32) return std::make_unique<ConvKernel<float>>(a.g, a.has_bias);
  if (t == DType::Float64) return std::make_unique<ConvKernel<double>>(a.g, a.has_bias);
  cpu::fail_dtype(ctx);
}

// ---- ConvGrad --------------------------------------------------------------------------------------------
// onnxtrain.ConvGrad(dY, X, W) -> (dX, dW, dB) with Conv's attributes (explicit pads; auto_pad is resolved by
// the rule, because the function body hands pads to ConvTranspose, whose auto_pad means something else). An
// omitted output is not computed. float32 runs oneDNN's backward-data and backward-weights primitives (with
// dB when dW is wanted too), built at plan time on the layouts they choose like the forward one, so run() only
// swaps data handles and runs the reorders. float64, and geometries oneDNN refuses, take the direct loops.

// Calls f(output offset, input offset, kernel offset) for every tap of every output whose input position
// lies inside the input (within one plane).
template <class F> inline void for_each_tap(const Geo& g, F&& f) {
  for (int64_t o0 = 0; o0 < g.out[0]; ++o0)
    for (int64_t j0 = 0; j0 < g.k[0]; ++j0) {
      const int64_t i0 = o0 * g.s[0] - g.pb[0] + j0 * g.d[0];
      if (i0 < 0 || i0 >= g.in[0]) continue;
      for (int64_t o1 = 0; o1 < g.out[1]; ++o1)
        for (int64_t j1 = 0; j1 < g.k[1]; ++j1) {
          const int64_t i1 = o1 * g.s[1] - g.pb[1] + j1 * g.d[1];
          if (i1 < 0 || i1 >= g.in[1]) continue;
          const int64_t ob = (o0 * g.out[1] + o1) * g.out[2], ib = (i0 * g.in[1] + i1) * g.in[2],
                        jb = (j0 * g.k[1] + j1) * g.k[2];
          for (int64_t o2 = 0; o2 < g.out[2]; ++o2)
            for (int64_t j2 = 0; j2 < g.k[2]; ++j2) {
              const int64_t i2 = o2 * g.s[2] - g.pb[2] + j2 * g.d[2];
              if (i2 >= 0 && i2 < g.in[2]) f(ob + o2, ib + i2, jb + j2);
            }
        }
    }
}

// dx[n, c, i] = sum over m in c's group and taps j with i = o*s - pb + j*d of dy[n, m, o] * w[m, c', j].
template <class T> void conv_backward_data(const Geo& g, const T* dy, const T* w, T* dx) {
  const int64_t Cg = g.C / g.G, Mg = g.M / g.G, isz = g.in_size(), osz = g.out_size(), ksz = g.k_size();
  const int64_t planes = g.N * g.C;
  cpu::parallel_for(planes, planes * osz * Mg * ksz > (1 << 15), [&](int64_t p) {
    const int64_t n = p / g.C, c = p % g.C, grp = c / Cg, cg = c % Cg;
    T* dxp = dx + p * isz;
    std::fill(dxp, dxp + isz, T(0));
    for (int64_t mg = 0; mg < Mg; ++mg) {
      const int64_t m = grp * Mg + mg;
      const T* dyp = dy + (n * g.M + m) * osz;
      const T* wp = w + (m * Cg + cg) * ksz;
      for_each_tap(g, [&](int64_t o, int64_t i, int64_t j) { dxp[i] += dyp[o] * wp[j]; });
    }
  });
}

// dw[m, c', j] = sum over n and outputs o of dy[n, m, o] * x[n, c, o*s - pb + j*d], c = group(m) * C/G + c'.
template <class T> void conv_backward_weights(const Geo& g, const T* dy, const T* x, T* dw) {
  const int64_t Cg = g.C / g.G, Mg = g.M / g.G, isz = g.in_size(), osz = g.out_size(), ksz = g.k_size();
  const int64_t rows = g.M * Cg;
  cpu::parallel_for(rows, g.N * rows * osz * ksz > (1 << 15), [&](int64_t r) {
    const int64_t m = r / Cg, c = (m / Mg) * Cg + r % Cg;
    T* dwp = dw + r * ksz;
    std::fill(dwp, dwp + ksz, T(0));
    for (int64_t n = 0; n < g.N; ++n) {
      const T* dyp = dy + (n * g.M + m) * osz;
      const T* xp = x + (n * g.C + c) * isz;
      for_each_tap(g, [&](int64_t o, int64_t i, int64_t j) { dwp[j] += dyp[o] * xp[i]; });
    }
  });
}

template <class T> void conv_backward_bias(const Geo& g, const T* dy, T* db) {
  const int64_t osz = g.out_size();
  for (int64_t m = 0; m < g.M; ++m) {
    T acc = 0;
    for (int64_t n = 0; n < g.N; ++n) {
      const T* dyp = dy + (n * g.M + m) * osz;
      for (int64_t o = 0; o < osz; ++o) acc += dyp[o];
    }
    db[m] = acc;
  }
}

// Backward data reads dY and W and writes dX; backward weights reads X and dY and writes dW (and dB). Each
// argument is staged like the forward's (reordered to the layout its primitive chose). dY is reordered once when
// both primitives chose the same layout for it (they normally do: the forward hint fixes it).
struct DnnlConvGrad {
  std::optional<Staged> dy_data, w, dx;       // backward data, when dX is wanted
  std::optional<Staged> dy_weights, x, dw;    // backward weights, when dW is wanted
  bool dy_shared = false;                     // dy_weights is unused: the weights step reads dy_data's buffer
  dnnl::memory db;
  std::optional<DnnlStep> data, weights;
  bool bias_with_weights = false;
  size_t arena_bytes = 0;

  void bind(std::byte* arena) const {
    for (const std::optional<Staged>* s : {&dy_data, &w, &dx, &dy_weights, &x, &dw})
      if (*s) (*s)->bind(arena);
    if (data) data->bind(arena);
    if (weights) weights->bind(arena);
  }
};

// `choose_layouts`: let the primitives choose (the first attempt); false when that padded the channels much.
std::optional<DnnlConvGrad> build_dnnl_conv_grad(const Geo& g, bool want_dx, bool want_dw, bool want_db,
                                                 bool choose_layouts = true) {
  const std::optional<DnnlGeo> geo = dnnl_geo(g, g.pe);
  if (!geo) return std::nullopt;
  const auto algo = dnnl::algorithm::convolution_direct;
  try {
    const ConvMds plain = plain_conv_mds(g, *geo), md = choose_layouts ? any_conv_mds(g, *geo) : plain;
    const dnnl::engine& eng = dnnl_engine();
    DnnlConvGrad r;
    ArenaLayout arena;
    r.bias_with_weights = want_dw && want_db;
    r.db = dnnl::memory(plain.b, eng, DNNL_MEMORY_NONE);
    const dnnl::primitive_attr attr = user_scratchpad();
    // The backward primitives take the forward training primitive's descriptor as a hint.
    const dnnl::convolution_forward::primitive_desc hint(
        dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, algo, md.x, md.w, md.y, geo->strides,
                                        geo->dil, geo->pl, geo->pr),
        eng);
    if (want_dx) {
      dnnl::convolution_backward_data::desc d(algo, md.x, md.w, md.y, geo->strides, geo->dil, geo->pl, geo->pr);
      const dnnl::convolution_backward_data::primitive_desc pd(d, attr, eng, hint);
      if (choose_layouts && (pads_much(pd.diff_dst_desc(), plain.y) || pads_much(pd.diff_src_desc(), plain.x)))
        return build_dnnl_conv_grad(g, want_dx, want_dw, want_db, false);
      r.dy_data = stage(plain.y, pd.diff_dst_desc(), true, arena);
      r.w = stage(plain.w, pd.weights_desc(), true, arena);
      r.dx = stage(plain.x, pd.diff_src_desc(), false, arena);
      r.data = make_step(pd, {{DNNL_ARG_DIFF_DST, r.dy_data->inner.get()},
                              {DNNL_ARG_WEIGHTS, r.w->inner.get()},
                              {DNNL_ARG_DIFF_SRC, r.dx->inner.get()}},
                         arena);
    }
    if (want_dw) {
      auto d = r.bias_with_weights ? dnnl::convolution_backward_weights::desc(algo, md.x, md.w, md.b, md.y,
                                                                              geo->strides, geo->dil, geo->pl, geo->pr)
                                   : dnnl::convolution_backward_weights::desc(algo, md.x, md.w, md.y, geo->strides,
                                                                              geo->dil, geo->pl, geo->pr);
      const dnnl::convolution_backward_weights::primitive_desc pd(d, attr, eng, hint);
      if (choose_layouts && (pads_much(pd.diff_dst_desc(), plain.y) || pads_much(pd.src_desc(), plain.x)))
        return build_dnnl_conv_grad(g, want_dx, want_dw, want_db, false);
      r.dy_shared = r.dy_data && r.dy_data->inner.get_desc() == pd.diff_dst_desc();
      if (!r.dy_shared) r.dy_weights = stage(plain.y, pd.diff_dst_desc(), true, arena);
      r.x = stage(plain.x, pd.src_desc(), true, arena);
      r.dw = stage(plain.w, pd.diff_weights_desc(), false, arena);
      const Staged& dy = r.dy_shared ? *r.dy_data : *r.dy_weights;
      std::vector<dnnl_exec_arg_t> args{{DNNL_ARG_SRC, r.x->inner.get()},
                                        {DNNL_ARG_DIFF_DST, dy.inner.get()},
                                        {DNNL_ARG_DIFF_WEIGHTS, r.dw->inner.get()}};
      if (r.bias_with_weights) args.push_back({DNNL_ARG_DIFF_BIAS, r.db.get()});
      r.weights = make_step(pd, std::move(args), arena);
    }
    r.arena_bytes = arena.bytes;
    conv_arena(arena.bytes);
    return r;
  } catch (const dnnl::error&) {
    return std::nullopt;
  }
}

template <class T> class ConvGradKernel final : public Kernel {
 public:
  ConvGradKernel(Geo g, std::array<bool, 3> want) : g_(g), want_(want) {
    if constexpr (std::is_same_v<T, float>) {
      if (cpu::DirectConv::supports_backward(g_, want[0], want[1]))
        own_.emplace(g_);
      else if (g_.N > 0 && g_.C > 0 && g_.M > 0)
        dnnl_ = build_dnnl_conv_grad(g_, want[0], want[1], want[2]);
    }
  }

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const T* dy = in[0]->ptr<T>();
    const T* x = in[1]->ptr<T>();
    const T* w = in[2]->ptr<T>();
    T* dx = want_[0] ? out[0]->ptr<T>() : nullptr;
    T* dw = want_[1] ? out[1]->ptr<T>() : nullptr;
    T* db = want_[2] ? out[2]->ptr<T>() : nullptr;
    if constexpr (std::is_same_v<T, float>) {
      if (own_) {
        own_->backward(dy, x, w, dx, dw, db);
        return;
      }
    }
    if (dnnl_) {
      DnnlConvGrad& d = *dnnl_;
      const Tensor& what = *in[0];
      d.bind(conv_arena(d.arena_bytes));
      if (dx) {
        d.dy_data->set(dy);
        d.w->set(w);
        d.dx->set(dx);
        d.dy_data->convert(what);
        d.w->convert(what);
        execute(*d.data, what);
        d.dx->convert(what);
      }
      if (dw) {
        if (!d.dy_shared) {
          d.dy_weights->set(dy);
          d.dy_weights->convert(what);
        }
        d.x->set(x);
        d.dw->set(dw);
        if (d.bias_with_weights) d.db.set_data_handle(db);
        d.x->convert(what);
        execute(*d.weights, what);
        d.dw->convert(what);
      }
      if (db && !d.bias_with_weights) conv_backward_bias(g_, dy, db);
      return;
    }
    if (dx) conv_backward_data(g_, dy, w, dx);
    if (dw) conv_backward_weights(g_, dy, x, dw);
    if (db) conv_backward_bias(g_, dy, db);
  }

 private:
  Geo g_;
  std::array<bool, 3> want_;
  std::optional<cpu::DirectConv> own_;
  std::optional<DnnlConvGrad> dnnl_;
};

std::unique_ptr<Kernel> make_conv_grad(PrepareContext& ctx) {
  const ops::ConvGradAttrs a = ops::prepare_conv_grad(ctx);
  const DType t = ctx.inputs[1].dtype;
  if (t == DType::Float32) return std::make_unique<ConvGradKernel<float>>(a.g, a.want);
  if (t == DType::Float64) return std::make_unique<ConvGradKernel<double>>(a.g, a.want);
  cpu::fail_dtype(ctx, 1);
}

// ---- ConvTranspose ---------------------------------------------------------------------------------------
// y[n, m, i*s - pb + j*d] += x[n, c, i] * w[c, m', j], m = group(c) * Mg + m'. Geo's `in` is X's spatial
// dims and `out` Y's, as for Conv; here M = W.shape[1] * group.

template <class T> class ConvTransposeKernel final : public Kernel {
 public:
  ConvTransposeKernel(Geo g, Dims3 right_pad, bool has_bias) : g_(g), has_bias_(has_bias) {
    if constexpr (std::is_same_v<T, float>) {
      const Geo c = as_conv(g_, right_pad);
      if (cpu::DirectConv::supports_backward_data(c))
        own_.emplace(c);
      else if (g_.N > 0 && g_.C > 0 && g_.M > 0)
        dnnl_ = build_dnnl_deconv(g_, right_pad, has_bias);
    }
  }

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const T* x = in[0]->ptr<T>();
    const T* w = in[1]->ptr<T>();
    const T* b = has_bias_ ? in[2]->ptr<T>() : nullptr;
    T* y = out[0]->ptr<T>();
    if constexpr (std::is_same_v<T, float>) {
      if (own_) {
        own_->backward_data(x, w, y);
        if (b) add_bias(g_, b, y);
        return;
      }
    }
    if (dnnl_) return run_dnnl(*dnnl_, x, w, b, y, *in[0]);
    const Geo g = g_;
    const int64_t Cg = g.C / g.G, Mg = g.M / g.G, isz = g.in_size(), osz = g.out_size(), ksz = g.k_size();
    const int64_t planes = g.N * g.M;
    cpu::parallel_for(planes, planes * isz * Cg * ksz > (1 << 15), [&](int64_t p) {
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
    });
  }

 private:
  // ConvTranspose is the input gradient of the Conv that maps Y's shape to X's, with the same weights (W [C, M/G,
  // k...] is that Conv's [out channels, in channels / G, k...]) and pads (the end pad that gives Y's size).
  static Geo as_conv(const Geo& g, const Dims3& right_pad) {
    Geo c = g;
    c.C = g.M;
    c.M = g.C;
    c.in = g.out;
    c.out = g.in;
    c.pe = right_pad;
    return c;
  }

  static void add_bias(const Geo& g, const float* b, float* y) {
    const int64_t osz = g.out_size();
    for (int64_t p = 0; p < g.N * g.M; ++p) {
      float* row = y + p * osz;
      const float bm = b[p % g.M];
      for (int64_t i = 0; i < osz; ++i) row[i] += bm;
    }
  }

  Geo g_;
  bool has_bias_;
  std::optional<cpu::DirectConv> own_;
  std::optional<DnnlConv> dnnl_;
};

std::unique_ptr<Kernel> make_conv_transpose(PrepareContext& ctx) {
  const ops::ConvTransposeAttrs a = ops::prepare_conv_transpose(ctx);
  const DType t = ctx.inputs[0].dtype;
  if (t == DType::Float32) return std::make_unique<ConvTransposeKernel<float>>(a.g, a.right_pad, a.has_bias);
  if (t == DType::Float64) return std::make_unique<ConvTransposeKernel<double>>(a.g, a.right_pad, a.has_bias);
  cpu::fail_dtype(ctx);
}

}  // namespace

void register_cpu_conv(KernelRegistry& r) {
  const std::vector<DType> flt = {DType::Float32, DType::Float64};
  cpu::add(r, "Conv", 1, flt, make_conv);
  cpu::add(r, "onnxtrain", "ConvGrad", 1, flt, make_conv_grad);
  cpu::add(r, "ConvTranspose", 1, flt, make_conv_transpose);
}

}  // namespace onnxtrain
