// The executor's own float32 convolutions (executor/cpu/direct_conv.h: AVX-512 kernels that allocate nothing per
// call) against the oneDNN 2.6 primitives they replaced, at W2's two layers, three ResNet-like and two depthwise
// (MobileNet-like) layers, for the forward pass (y = conv(x, w) + b), backward data (dx) and backward weights (dw
// with db), on OMP_NUM_THREADS threads:
//
//   OMP_NUM_THREADS=1 build/release/benchmarks/bench_conv [--repeats 7] [--iters 10] [--batch N]
//
// --batch sets every layer's batch (N = 1: training on one image, where the threads share each image).
//
// onnxtrain dropped oneDNN's convolutions because every primitive execute builds its argument map on the heap, so a
// CNN's training step could never run free of allocations; this shows what that choice costs or gains in speed. The
// oneDNN side is set up as the executor had it (executor/cpu/conv.cpp before DirectConv): primitives built once on
// the layouts oneDNN chooses (format_tag::any: channel-blocked, for its avx512_core kernels), user-mode scratchpads
// allocated once, and reorders from and to the plain nchw / oihw tensors timed as part of each call, since the
// tensors live in plain layout. (When the executor ran both backward passes it reordered dY once for the two; here
// each pass reorders its own.)
//
// Prints each side's time per call and GFLOP/s, own speed / oneDNN speed (below 1: slower than oneDNN), the largest
// difference from oneDNN's result relative to its largest magnitude, and the oneDNN implementation; "-" where
// DirectConv does not take the geometry. Exits 1 when a result differs by 1e-4 or more. Ratios only mean something
// within one run: this machine is shared.
#include <oneapi/dnnl/dnnl.hpp>
#include <omp.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "executor/cpu/direct_conv.h"

namespace {

using onnxtrain::cpu::DirectConv;
using onnxtrain::cpu::Geo;

struct Shape {
  const char* what;
  int64_t n, c, m, h, w, k, s, p;  // batch, in and out channels, input height and width, kernel, stride, pad
  int64_t g = 1;                    // groups
};

const Shape kShapes[] = {
    {"w2 conv1", 64, 1, 16, 28, 28, 3, 1, 1},   {"w2 conv2", 64, 16, 32, 14, 14, 3, 1, 1},
    {"resnet 3x3", 8, 64, 64, 28, 28, 3, 1, 1}, {"pointwise 1x1", 8, 64, 128, 28, 28, 1, 1, 0},
    {"strided 3x3/2", 8, 32, 64, 28, 28, 3, 2, 1},
    {"depthwise 3x3", 8, 96, 96, 28, 28, 3, 1, 1, 96}, {"depthwise 3x3/2", 8, 96, 96, 28, 28, 3, 2, 1, 96},
};

enum Direction { kForward, kBackwardData, kBackwardWeights, kDirections };
const char* const kDirectionNames[kDirections] = {"forward", "backward data", "backward weights"};

// A 2-D convolution in Geo's three right-aligned spatial dims: the leading one is 1 with kernel 1.
Geo geometry(const Shape& s) {
  Geo g{.N = s.n, .C = s.c, .M = s.m, .G = s.g, .rank = 2, .in = {1, s.h, s.w}, .k = {1, s.k, s.k},
        .s = {1, s.s, s.s}, .pb = {0, s.p, s.p}, .pe = {0, s.p, s.p}};
  for (size_t i = 0; i < g.out.size(); ++i)
    g.out[i] = (g.in[i] + g.pb[i] + g.pe[i] - (g.k[i] - 1) * g.d[i] - 1) / g.s[i] + 1;
  return g;
}

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

dnnl::stream& stream() {
  static dnnl::stream s(engine());
  return s;
}

dnnl::primitive_attr user_scratchpad() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

// A primitive with a prebuilt argument array, executed through the C API as the executor did (the C++ execute()
// would add a conversion from std::unordered_map per call), and its scratchpad.
struct Step {
  dnnl::primitive prim;
  std::vector<dnnl_exec_arg_t> args;
  dnnl::memory scratchpad;  // empty when the primitive needs none

  void run() const {
    dnnl::stream& st = stream();
    if (dnnl_primitive_execute(prim.get(), st.get(), static_cast<int>(args.size()), args.data()) != dnnl_success)
      throw dnnl::error(dnnl_runtime_error, "bench_conv: a oneDNN primitive failed");
    st.wait();
  }
};

Step make_step(const dnnl::primitive_desc_base& pd, std::vector<dnnl_exec_arg_t> args) {
  Step s{dnnl::primitive(pd.get()), std::move(args), {}};
  const dnnl::memory::desc d = pd.scratchpad_desc();
  if (d.get_size() > 0) {
    s.scratchpad = dnnl::memory(d, engine());  // allocated here, so that execute() allocates none
    s.args.push_back({DNNL_ARG_SCRATCHPAD, s.scratchpad.get()});
  }
  return s;
}

// A tensor as stored (plain) and as the primitive reads or writes it (the layout it chose), with the reorder
// between them when they differ: plain -> chosen for an input (`into`), chosen -> plain for an output.
struct Staged {
  dnnl::memory plain, inner;
  std::optional<Step> reorder;
};

Staged stage(const dnnl::memory::desc& plain, const dnnl::memory::desc& chosen, const float* data, bool into) {
  Staged s{dnnl::memory(plain, engine(), const_cast<float*>(data)), {}, std::nullopt};
  if (chosen == plain) {
    s.inner = s.plain;
    return s;
  }
  s.inner = dnnl::memory(chosen, engine());
  const dnnl::memory& from = into ? s.plain : s.inner;
  const dnnl::memory& to = into ? s.inner : s.plain;
  const dnnl::reorder::primitive_desc pd(engine(), from.get_desc(), engine(), to.get_desc(), user_scratchpad());
  s.reorder = make_step(pd, {{DNNL_ARG_FROM, from.get()}, {DNNL_ARG_TO, to.get()}});
  return s;
}

// One direction on oneDNN: its two inputs reordered in, the convolution, its output reordered out. `bias` (the
// bias or its gradient) is plain for every primitive.
struct DnnlPass {
  std::array<Staged, 2> in;
  Staged out;
  dnnl::memory bias;
  Step conv;
  std::string impl;

  void run() const {
    for (const Staged& s : in)
      if (s.reorder) s.reorder->run();
    conv.run();
    if (out.reorder) out.reorder->run();
  }
};

// Descriptors of X, W, B and Y.
struct Mds {
  dnnl::memory::desc x, w, b, y;
};

// oneDNN's view of a geometry, with the tensors' plain layouts and the layouts left to the primitive (the bias
// stays plain either way).
struct DnnlGeo {
  Mds plain, any;
  dnnl::memory::dims strides, dil, pl, pr;
};

DnnlGeo dnnl_geo(const Geo& g) {
  using tag = dnnl::memory::format_tag;
  using dt = dnnl::memory::data_type;
  const dnnl::memory::dims x{g.N, g.C, g.in[1], g.in[2]}, y{g.N, g.M, g.out[1], g.out[2]};
  // Grouped weights as oneDNN takes them: [group][out of group][in of group][kh][kw], the same bytes as ONNX's.
  const dnnl::memory::dims w = g.G == 1 ? dnnl::memory::dims{g.M, g.C, g.k[1], g.k[2]}
                                        : dnnl::memory::dims{g.G, g.M / g.G, g.C / g.G, g.k[1], g.k[2]};
  const dnnl::memory::desc b({g.M}, dt::f32, tag::x);
  return {{{x, dt::f32, tag::nchw}, {w, dt::f32, g.G == 1 ? tag::oihw : tag::goihw}, b, {y, dt::f32, tag::nchw}},
          {{x, dt::f32, tag::any}, {w, dt::f32, tag::any}, b, {y, dt::f32, tag::any}},
          {g.s[1], g.s[2]},
          {g.d[1] - 1, g.d[2] - 1},  // oneDNN counts the gaps between taps
          {g.pb[1], g.pb[2]},
          {g.pe[1], g.pe[2]}};
}

// As the executor did: a chosen activation layout that pads the channels a lot (16 stored for W2's one input
// channel) would move several times the data, so then the primitive is built on the plain layouts instead.
bool pads_much(const dnnl::memory::desc& chosen, const dnnl::memory::desc& plain) {
  return chosen.get_size() > plain.get_size() + plain.get_size() / 4;
}

constexpr dnnl::algorithm kAlgo = dnnl::algorithm::convolution_direct;

DnnlPass build_forward(const DnnlGeo& d, const float* x, const float* w, const float* b, float* y) {
  const auto make = [&](const Mds& md) {
    return dnnl::convolution_forward::primitive_desc(
        dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference, kAlgo, md.x, md.w, md.b, md.y, d.strides,
                                        d.dil, d.pl, d.pr),
        user_scratchpad(), engine());
  };
  dnnl::convolution_forward::primitive_desc pd = make(d.any);
  if (pads_much(pd.src_desc(), d.plain.x) || pads_much(pd.dst_desc(), d.plain.y)) pd = make(d.plain);
  DnnlPass p{{stage(d.plain.x, pd.src_desc(), x, true), stage(d.plain.w, pd.weights_desc(), w, true)},
             stage(d.plain.y, pd.dst_desc(), y, false),
             dnnl::memory(d.plain.b, engine(), const_cast<float*>(b)),
             {},
             pd.impl_info_str()};
  p.conv = make_step(pd, {{DNNL_ARG_SRC, p.in[0].inner.get()},
                          {DNNL_ARG_WEIGHTS, p.in[1].inner.get()},
                          {DNNL_ARG_BIAS, p.bias.get()},
                          {DNNL_ARG_DST, p.out.inner.get()}});
  return p;
}

// The backward primitives take the forward training primitive's descriptor as a hint.
dnnl::convolution_forward::primitive_desc hint(const DnnlGeo& d, const Mds& md) {
  return {dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, kAlgo, md.x, md.w, md.y, d.strides,
                                          d.dil, d.pl, d.pr),
          engine()};
}

DnnlPass build_backward_data(const DnnlGeo& d, const float* dy, const float* w, float* dx) {
  const auto make = [&](const Mds& md) {
    return dnnl::convolution_backward_data::primitive_desc(
        dnnl::convolution_backward_data::desc(kAlgo, md.x, md.w, md.y, d.strides, d.dil, d.pl, d.pr),
        user_scratchpad(), engine(), hint(d, md));
  };
  dnnl::convolution_backward_data::primitive_desc pd = make(d.any);
  if (pads_much(pd.diff_dst_desc(), d.plain.y) || pads_much(pd.diff_src_desc(), d.plain.x)) pd = make(d.plain);
  DnnlPass p{{stage(d.plain.y, pd.diff_dst_desc(), dy, true), stage(d.plain.w, pd.weights_desc(), w, true)},
             stage(d.plain.x, pd.diff_src_desc(), dx, false),
             {},
             {},
             pd.impl_info_str()};
  p.conv = make_step(pd, {{DNNL_ARG_DIFF_DST, p.in[0].inner.get()},
                          {DNNL_ARG_WEIGHTS, p.in[1].inner.get()},
                          {DNNL_ARG_DIFF_SRC, p.out.inner.get()}});
  return p;
}

DnnlPass build_backward_weights(const DnnlGeo& d, const float* dy, const float* x, float* dw, float* db) {
  const auto make = [&](const Mds& md) {
    return dnnl::convolution_backward_weights::primitive_desc(
        dnnl::convolution_backward_weights::desc(kAlgo, md.x, md.w, md.b, md.y, d.strides, d.dil, d.pl, d.pr),
        user_scratchpad(), engine(), hint(d, md));
  };
  dnnl::convolution_backward_weights::primitive_desc pd = make(d.any);
  if (pads_much(pd.diff_dst_desc(), d.plain.y) || pads_much(pd.src_desc(), d.plain.x)) pd = make(d.plain);
  DnnlPass p{{stage(d.plain.y, pd.diff_dst_desc(), dy, true), stage(d.plain.x, pd.src_desc(), x, true)},
             stage(d.plain.w, pd.diff_weights_desc(), dw, false),
             dnnl::memory(d.plain.b, engine(), db),
             {},
             pd.impl_info_str()};
  p.conv = make_step(pd, {{DNNL_ARG_SRC, p.in[1].inner.get()},
                          {DNNL_ARG_DIFF_DST, p.in[0].inner.get()},
                          {DNNL_ARG_DIFF_WEIGHTS, p.out.inner.get()},
                          {DNNL_ARG_DIFF_BIAS, p.bias.get()}});
  return p;
}

// What one side computes.
struct Outputs {
  std::vector<float> y, dx, dw, db;
  explicit Outputs(const Geo& g)
      : y(static_cast<size_t>(g.N * g.M * g.out_size())),
        dx(static_cast<size_t>(g.N * g.C * g.in_size())),
        dw(static_cast<size_t>(g.M * g.C * g.k_size())),
        db(static_cast<size_t>(g.M)) {}
};

// The largest difference relative to the reference's largest magnitude: the sums run over up to 50176 products
// (W2 conv1's dW), so an absolute bound would not fit every shape.
double relative_diff(const std::vector<float>& ref, const std::vector<float>& got) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    diff = std::max(diff, double(std::abs(got[i] - ref[i])));
    scale = std::max(scale, double(std::abs(ref[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

std::vector<float> random_floats(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> v(n);
  for (float& f : v) f = u(rng);
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  int repeats = 7, iters = 10, batch = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--repeats" || a == "--iters" || a == "--batch") && i + 1 < argc) {
      (a == "--repeats" ? repeats : a == "--iters" ? iters : batch) = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: bench_conv [--repeats R] [--iters N] [--batch N]\n");
      return 2;
    }
  }
  if (repeats < 1 || iters < 1 || batch < 0) {
    std::fprintf(stderr, "bench_conv: --repeats and --iters must be positive, --batch too when given\n");
    return 2;
  }
  if (std::none_of(std::begin(kShapes), std::end(kShapes),
                   [](const Shape& s) { return DirectConv::supports_forward(geometry(s)); })) {
    std::printf("this build has no AVX-512 convolutions (DirectConv takes none of the shapes): nothing to compare\n");
    return 0;
  }
  std::mt19937 rng(1);
  std::printf("threads: %d\n", omp_get_max_threads());
  // µ is two bytes in UTF-8: %9s pads "dnnl µs" to the 8 columns of the times below.
  std::printf("%-14s %-26s %-16s %9s %9s %8s %9s %9s %9s  %s\n", "layer", "NxCxHxW > M, kernel", "direction",
              "dnnl µs", "own µs", "own/dnnl", "dnnl GF/s", "own GF/s", "rel diff", "dnnl impl");
  std::array<std::vector<double>, kDirections> ratios;
  bool agree = true;
  try {
    for (Shape s : kShapes) {
      if (batch > 0) s.n = batch;
      const Geo g = geometry(s);
      const std::vector<float> x = random_floats(static_cast<size_t>(g.N * g.C * g.in_size()), rng),
                               w = random_floats(static_cast<size_t>(g.M * g.C * g.k_size()), rng),
                               b = random_floats(static_cast<size_t>(g.M), rng),
                               dy = random_floats(static_cast<size_t>(g.N * g.M * g.out_size()), rng);
      Outputs ref(g), mine(g);
      const DnnlGeo d = dnnl_geo(g);
      const std::array<DnnlPass, kDirections> passes{
          build_forward(d, x.data(), w.data(), b.data(), ref.y.data()),
          build_backward_data(d, dy.data(), w.data(), ref.dx.data()),
          build_backward_weights(d, dy.data(), x.data(), ref.dw.data(), ref.db.data())};
      const std::array<bool, kDirections> own_takes{DirectConv::supports_forward(g),
                                                    DirectConv::supports_backward_data(g),
                                                    DirectConv::supports_backward_weights(g)};
      DirectConv own(g);
      const auto run_own = [&](int dir) {
        if (dir == kForward) own.forward(x.data(), w.data(), b.data(), mine.y.data());
        else if (dir == kBackwardData) own.backward_data(dy.data(), w.data(), mine.dx.data());
        else own.backward_weights(dy.data(), x.data(), mine.dw.data(), mine.db.data());
      };
      char shape[32];
      std::snprintf(shape, sizeof shape, "%ldx%ldx%ldx%ld > %ld, %ldx%ld/%ld p%ld", long(s.n), long(s.c), long(s.h),
                    long(s.w), long(s.m), long(s.k), long(s.k), long(s.s), long(s.p));
      const double gflop = 2.0 * double(g.N * g.M * (g.C / g.G) * g.k_size() * g.out_size()) / 1e9;
      for (int dir = 0; dir < kDirections; ++dir) {
        const DnnlPass& pass = passes[static_cast<size_t>(dir)];
        const bool takes = own_takes[static_cast<size_t>(dir)];
        // The first calls also warm both sides up: DirectConv's per-thread buffers, oneDNN's jit code.
        pass.run();
        double diff = 0;
        if (takes) {
          run_own(dir);
          diff = dir == kForward       ? relative_diff(ref.y, mine.y)
                 : dir == kBackwardData ? relative_diff(ref.dx, mine.dx)
                                        : std::max(relative_diff(ref.dw, mine.dw), relative_diff(ref.db, mine.db));
          if (!(diff < 1e-4)) {
            std::fprintf(stderr, "bench_conv: %s %s differs from oneDNN's by %.1e of its largest value\n", s.what,
                         kDirectionNames[dir], diff);
            agree = false;
          }
        }
        double best_dnnl = 1e30, best_own = 1e30;
        const auto time = [&](auto&& run, double& best) {
          const auto t0 = std::chrono::steady_clock::now();
          for (int i = 0; i < iters; ++i) run();
          best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters);
        };
        for (int r = 0; r < repeats; ++r) {  // interleaved, best of each
          time([&] { pass.run(); }, best_dnnl);
          if (takes) time([&] { run_own(dir); }, best_own);
        }
        std::printf("%-14s %-26s %-16s %8.0f ", s.what, shape, kDirectionNames[dir], best_dnnl * 1e6);
        if (takes) {
          ratios[static_cast<size_t>(dir)].push_back(best_dnnl / best_own);
          std::printf("%8.0f %8.2f %9.1f %9.1f %9.1e  %s\n", best_own * 1e6, best_dnnl / best_own, gflop / best_dnnl,
                      gflop / best_own, diff, pass.impl.c_str());
        } else {
          std::printf("%8s %8s %9.1f %9s %9s  %s\n", "-", "-", gflop / best_dnnl, "-", "-", pass.impl.c_str());
        }
        std::fflush(stdout);
      }
    }
  } catch (const dnnl::error& e) {
    std::fprintf(stderr, "bench_conv: oneDNN: %s\n", e.what());
    return 1;
  }
  for (int dir = 0; dir < kDirections; ++dir) {
    std::vector<double>& r = ratios[static_cast<size_t>(dir)];
    if (r.empty()) continue;
    std::sort(r.begin(), r.end());
    std::printf("own / dnnl, %s: %.2f to %.2f (median %.2f over %zu shapes)\n", kDirectionNames[dir], r.front(),
                r.back(), r[r.size() / 2], r.size());
  }
  if (!agree) std::fprintf(stderr, "bench_conv: results differ from oneDNN's by 1e-4 of their magnitude or more\n");
  return agree ? 0 : 1;
}
