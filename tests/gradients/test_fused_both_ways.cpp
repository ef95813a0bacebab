// Every fused gradient op must compute the same through its native kernel and through its standard-ONNX
// function body (inlined), so that another runtime running our graphs gets our numbers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <stdexcept>

#include "common/test_env.h"
#include "executor/executor.h"
#include "gradients/fused.h"
#include "gradients/fused_graph.h"
#include "gradients/rule.h"
#include "graph/error.h"

namespace onnxtrain {
namespace {

Tensor random_tensor(std::vector<int64_t> shape, std::mt19937& rng, double lo, double hi) {
  Tensor t = Tensor::empty(DType::Float64, std::move(shape));
  std::uniform_real_distribution<double> u(lo, hi);
  for (double& v : t.span<double>()) v = u(rng);
  return t;
}

// Runs g (one fused node) with its native kernel and with its function body inlined, and requires the same
// outputs; `nonzero`: and no all-zero output, which would agree vacuously.
void expect_native_equals_body(const Graph& g, const std::map<std::string, Tensor>& feeds,
                               const std::vector<Function>& fns, bool nonzero,
                               std::vector<Tensor>* native_out = nullptr) {
  const std::map<std::string, int64_t> opsets{{"", 17}, {kFusedGradDomain, 1}};
  ExecutorOptions native, body;
  native.functions = body.functions = fns;
  body.prefer_function_bodies = true;
  Executor a(g, opsets, std::make_shared<TensorStore>(), native);
  Executor b(g, opsets, std::make_shared<TensorStore>(), body);
  ASSERT_EQ(a.graph().nodes.size(), 1u) << "the native run must not inline";
  ASSERT_GT(b.graph().nodes.size(), 1u) << "the body run must inline";
  std::vector<Tensor> ra = a.run(feeds), rb = b.run(feeds);
  ASSERT_EQ(ra.size(), g.outputs.size());
  ASSERT_EQ(rb.size(), g.outputs.size());
  for (size_t o = 0; o < ra.size(); ++o) {
    SCOPED_TRACE(g.outputs[o].name);
    ASSERT_EQ(ra[o].shape, rb[o].shape);
    double largest = 0;
    for (int64_t i = 0; i < ra[o].numel(); ++i) {
      largest = std::max(largest, std::abs(ra[o].ptr<double>()[i]));
      EXPECT_NEAR(ra[o].ptr<double>()[i], rb[o].ptr<double>()[i], 1e-12) << i;
    }
    if (nonzero) {
      EXPECT_GT(largest, 0.0) << "an all-zero gradient would agree vacuously";
    }
  }
  if (native_out) *native_out = std::move(ra);
}

std::map<std::string, TypeInfo> types_of(const std::map<std::string, Tensor>& feeds) {
  std::map<std::string, TypeInfo> types;
  for (const auto& [name, t] : feeds) types[name] = static_type(t.dtype, t.shape);
  return types;
}

// Runs f's op once through its native kernel and once through its inlined body, on the same feeds.
// Inputs that are initializers (a target shape the output's shape depends on) are not fed.
void expect_both_ways(const std::vector<Function>& fns, const Function& f, std::map<std::string, Attribute> attrs,
                      const std::map<std::string, Tensor>& feeds,
                      const std::map<std::string, TensorData>& initializers = {}) {
  const Graph g =
      fused_op_graph(f.name, std::move(attrs), f.inputs, types_of(feeds), f.outputs, DType::Float64, initializers);
  expect_native_equals_body(g, feeds, fns, false);
}

const Function& function_named(const std::vector<Function>& fns, const std::string& name) {
  auto it = std::find_if(fns.begin(), fns.end(), [&](const Function& f) { return f.name == name; });
  if (it == fns.end()) throw std::runtime_error("no fused function " + name);
  return *it;
}

TEST(FusedBothWays, NativeKernelEqualsInlinedBody) {
  const std::vector<Function> fns = fused_grad_functions();
  ASSERT_FALSE(fns.empty());
  std::mt19937 rng(5);
  for (const Function& f : fns) {
    if (f.name == "ConvGrad" || f.name == "AveragePoolGrad") continue;  // ConvolutionFamilyTable below
    if (f.name == "MaxRoiPoolGrad") continue;                           // MaxRoiPoolGradBins below
    if (f.name == "GridSampleGrad") continue;                           // GridSampleGradEveryMode below
    if (f.name == "DropoutMask") continue;  // not a gradient: test_dropout_mask_body.cpp
    if (f.name == "RNNGrad" || f.name == "GRUGrad" || f.name == "LSTMGrad") continue;  // *GradForward below
    SCOPED_TRACE(f.name);
    // MaxPoolGrad carries MaxPool's attributes (its body reads them by reference): overlapping windows with
    // asymmetric padding, so the body's scatter must add. X [2, 3, 7, 6] pools to dY [2, 3, 4, 6]. The
    // normalisation grads' bodies read axis / epsilon by reference too.
    const bool pool = f.name == "MaxPoolGrad";
    std::map<std::string, Attribute> attrs;
    if (pool)
      attrs = {{"kernel_shape", std::vector<int64_t>{3, 2}},
               {"strides", std::vector<int64_t>{2, 1}},
               {"pads", std::vector<int64_t>{1, 0, 1, 1}}};
    if (f.name == "LayerNormalizationGrad" || f.name.find("Softmax") != std::string::npos) attrs = {{"axis", int64_t{-1}}};
    if (f.name == "BatchNormalizationGrad") attrs = {{"epsilon", 0.01f}};  // X [3, 5]: N = 3, C = 5
    // GatherGrad and SumToShape take int64 inputs: indices (repeated, negative) fed at run time, and the
    // target shape as an initializer, since the output's shape depends on its value.
    const bool gather = f.name == "GatherGrad", sum_to = f.name == "SumToShape";
    if (gather) attrs = {{"axis", int64_t{-2}}};
    std::map<std::string, Tensor> int_feeds;
    std::map<std::string, TensorData> initializers;
    if (gather) {
      int_feeds["indices"] = Tensor::from_vector<int64_t>({2, 2}, {4, -1, 0, 4});
      initializers["shape"] = TensorData::from<int64_t>({3}, std::span<const int64_t>(std::vector<int64_t>{3, 5, 2}));
    }
    if (sum_to)
      initializers["shape"] = TensorData::from<int64_t>({2}, std::span<const int64_t>(std::vector<int64_t>{3, 1}));
    // Inputs by name: (dY, Y) for the elementwise-style ops. Y in (0, 1) suits every op: a sigmoid or softmax
    // output, a positive relu output; log-softmax wants Y < 0. LayerNormalizationGrad takes (dY, X, Scale,
    // Mean, InvStdDev) with one statistic per row (InvStdDev positive).
    const bool log_domain = f.name.find("LogSoftmax") != std::string::npos;
    std::map<std::string, Tensor> feeds;
    for (const std::string& in : f.inputs) {
      Tensor t;
      if (initializers.count(in)) continue;
      if (int_feeds.count(in))
        t = std::move(int_feeds[in]);
      else if (in == "dY" && gather)
        t = random_tensor({3, 2, 2, 2}, rng, -1, 1);
      else if (in == "dY" && sum_to)
        t = random_tensor({2, 3, 4}, rng, -1, 1);
      else if (in == "Y")
        t = log_domain ? random_tensor({3, 5}, rng, -3, -0.1) : random_tensor({3, 5}, rng, -0.5, 1);
      else if (in == "Scale")
        t = random_tensor({5}, rng, 0.5, 1.5);
      else if (in == "Mean")
        t = random_tensor({3, 1}, rng, -0.5, 0.5);
      else if (in == "InvStdDev")
        t = random_tensor({3, 1}, rng, 0.5, 2);
      else if (in == "X" && pool)
        t = random_tensor({2, 3, 7, 6}, rng, -1, 1);
      else if (in == "dY" && pool)
        t = random_tensor({2, 3, 4, 6}, rng, -1, 1);
      else if (in == "X")  // GELU's input: its tails too
        t = random_tensor({3, 5}, rng, -4, 4);
      else
        t = random_tensor({3, 5}, rng, -1, 1);
      feeds[in] = std::move(t);
    }
    expect_both_ways(fns, f, attrs, feeds, initializers);
  }
}

// LayerNormalizationGrad at an inner axis: X [2, 3, 4] normalised over its last two dims.
TEST(FusedBothWays, LayerNormGradInnerAxis) {
  const std::vector<Function> fns = fused_grad_functions();
  std::mt19937 rng(6);
  std::map<std::string, Tensor> feeds{{"dY", random_tensor({2, 3, 4}, rng, -1, 1)},
                                      {"X", random_tensor({2, 3, 4}, rng, -2, 2)},
                                      {"Scale", random_tensor({3, 4}, rng, 0.5, 1.5)},
                                      {"Mean", random_tensor({2, 1, 1}, rng, -0.5, 0.5)},
                                      {"InvStdDev", random_tensor({2, 1, 1}, rng, 0.5, 2)}};
  expect_both_ways(fns, function_named(fns, "LayerNormalizationGrad"), {{"axis", int64_t{1}}}, feeds);
}

// SoftmaxGrad and LogSoftmaxGrad over a middle axis of [2, 4, 3].
TEST(FusedBothWays, SoftmaxGradsInnerAxis) {
  const std::vector<Function> fns = fused_grad_functions();
  std::mt19937 rng(8);
  for (const char* name : {"SoftmaxGrad", "LogSoftmaxGrad"}) {
    SCOPED_TRACE(name);
    std::map<std::string, Tensor> feeds{{"dY", random_tensor({2, 4, 3}, rng, -1, 1)},
                                        {"Y", random_tensor({2, 4, 3}, rng, -2, -0.1)}};
    expect_both_ways(fns, function_named(fns, name), {{"axis", int64_t{1}}}, feeds);
  }
}

// BatchNormalizationGrad on a 4-D input with a non-zero mean (N = 2, C = 3, 4 x 5 planes).
TEST(FusedBothWays, BatchNormGrad4d) {
  const std::vector<Function> fns = fused_grad_functions();
  std::mt19937 rng(7);
  std::map<std::string, Tensor> feeds{{"dY", random_tensor({2, 3, 4, 5}, rng, -1, 1)},
                                      {"X", random_tensor({2, 3, 4, 5}, rng, 1, 4)},
                                      {"Scale", random_tensor({3}, rng, -1.5, 1.5)}};
  expect_both_ways(fns, function_named(fns, "BatchNormalizationGrad"), {{"epsilon", 1e-5f}}, feeds);
}

// MaxRoiPoolGrad: the body recomputes the kernel's bins and first maxima. X holds few distinct values, so
// most bins tie and the first maximum decides; the regions cover rounding halves (0.5 * odd corners), a
// region past the image (clipped and empty bins), a one-pixel region, bins overlapping (a position hit by
// several bins adds up) and a plane full of -inf. float64 and float32, native against body.
TEST(FusedBothWays, MaxRoiPoolGradBins) {
  const std::vector<Function> fns = fused_grad_functions();
  struct Case {
    std::string label;
    std::vector<int64_t> pooled;
    float scale;
    std::vector<double> rois;
  };
  const std::vector<Case> cases = {
      {"scale 0.5 halves", {3, 2}, 0.5f, {0, 1, 3, 9, 11, 1, 5, 1, 13, 7, 1, 3, 5, 3, 5, 0, -3, -1, 4, 3}},
      {"scale 0.8 past the image", {2, 3}, 0.8f, {0, 0.4, 1.2, 7.6, 5.1, 1, 3.5, 2.5, 10.2, 8.9, 0, 6, 1, 30, 4,
                                                 1, 12, 12, 20, 20}},
      {"scale 1 finer than the region", {4, 4}, 1.0f, {1, 1, 2, 3, 3, 0, 0, 0, 8, 6, 1, 7, 5, 8, 6}},
  };
  std::mt19937 rng(23);
  std::uniform_int_distribution<int> level(-2, 2);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.label);
    const int64_t R = static_cast<int64_t>(c.rois.size() / 5);
    Tensor x = Tensor::empty(DType::Float64, {2, 3, 7, 9});
    for (double& v : x.span<double>()) v = level(rng) * 0.5;
    for (int64_t i = 0; i < 7 * 9; ++i) x.ptr<double>()[(1 * 3 + 2) * 63 + i] = -INFINITY;  // n 1, c 2
    Tensor rois = Tensor::from_vector<double>({R, 5}, c.rois);
    Tensor dy = random_tensor({R, 3, c.pooled[0], c.pooled[1]}, rng, -1, 1);
    const std::map<std::string, Attribute> attrs{{"pooled_shape", c.pooled}, {"spatial_scale", c.scale}};
    std::map<std::string, Tensor> feeds{{"dY", dy}, {"X", x}, {"rois", rois}};
    const Graph g = fused_op_graph("MaxRoiPoolGrad", attrs, {"dY", "X", "rois"}, types_of(feeds), {"dX"},
                                   DType::Float64);
    expect_native_equals_body(g, feeds, fns, true);
    // float32: the body takes its bins in float64 whatever X's type, as the kernel does.
    std::map<std::string, Tensor> feeds32;
    for (const auto& [name, t] : feeds) {
      Tensor f = Tensor::empty(DType::Float32, t.shape);
      for (int64_t i = 0; i < t.numel(); ++i) f.ptr<float>()[i] = static_cast<float>(t.ptr<double>()[i]);
      feeds32[name] = std::move(f);
    }
    const Graph g32 = fused_op_graph("MaxRoiPoolGrad", attrs, {"dY", "X", "rois"}, types_of(feeds32), {"dX"},
                                     DType::Float32);
    ExecutorOptions native, body;
    native.functions = body.functions = fns;
    body.prefer_function_bodies = true;
    const std::map<std::string, int64_t> opsets{{"", 17}, {kFusedGradDomain, 1}};
    const Tensor a = Executor(g32, opsets, std::make_shared<TensorStore>(), native).run(feeds32)[0];
    const Tensor b = Executor(g32, opsets, std::make_shared<TensorStore>(), body).run(feeds32)[0];
    ASSERT_EQ(a.shape, b.shape);
    int64_t nonzero = 0;
    for (int64_t i = 0; i < a.numel(); ++i) {
      // The body sums per region, then per batch entry; the kernel adds one by one: equal to rounding.
      EXPECT_NEAR(a.ptr<float>()[i], b.ptr<float>()[i], 1e-6 * (1 + std::abs(a.ptr<float>()[i]))) << i;
      nonzero += a.ptr<float>()[i] != 0;
    }
    EXPECT_GT(nonzero, 0);
  }
}

// GridSampleGrad: every mode, padding and align_corners on 2-D sampling, and 1-D and 3-D sampling, native
// against body in float64 and float32. The grids reach past [-1, 1] (padding), hold values far outside
// (every tap reads zero; reflection folds several times), exact tap positions (-1, 0, 1) and an infinite value.
TEST(FusedBothWays, GridSampleGradEveryMode) {
  const std::vector<Function> fns = fused_grad_functions();
  std::mt19937 rng(31);
  struct Case {
    std::vector<int64_t> x, grid;
  };
  const std::vector<Case> shapes = {{{2, 3, 5, 6}, {2, 4, 3, 2}}, {{2, 2, 7}, {2, 5, 1}}, {{1, 2, 3, 4, 5}, {1, 2, 3, 2, 3}}};
  const char* modes[] = {"linear", "nearest", "cubic"};
  const char* pads[] = {"zeros", "border", "reflection"};
  int checked = 0;
  for (const Case& sh : shapes)
    for (int m = 0; m < 3; ++m)
      for (int p = 0; p < 3; ++p)
        for (int64_t align : {0, 1}) {
          const bool plane = sh.x.size() == 4;
          if (!plane && (m + p + align) % 2) continue;  // 1-D and 3-D: half the combinations
          SCOPED_TRACE(std::to_string(sh.x.size()) + "-D X, " + modes[m] + ", " + pads[p] + ", align " +
                       std::to_string(align));
          Tensor x = random_tensor(sh.x, rng, -1, 1);
          Tensor grid = random_tensor(sh.grid, rng, -1.7, 1.7);
          const std::vector<double> special{-1, 0, 1, 7.25, -9.5, 0.5, INFINITY};
          for (size_t i = 0; i < special.size() && i < static_cast<size_t>(grid.numel()); ++i)
            grid.ptr<double>()[i * 3 % grid.numel()] = special[i];
          std::vector<int64_t> ys{sh.x[0], sh.x[1]};
          ys.insert(ys.end(), sh.grid.begin() + 1, sh.grid.end() - 1);
          Tensor dy = random_tensor(ys, rng, -1, 1);
          const std::map<std::string, Attribute> attrs{
              {"mode", std::string(modes[m])}, {"padding_mode", std::string(pads[p])}, {"align_corners", align},
              {"interpolation", int64_t{m}}, {"padding", int64_t{p}}};
          std::map<std::string, Tensor> feeds{{"dY", dy}, {"X", x}, {"grid", grid}};
          const Graph g = fused_op_graph("GridSampleGrad", attrs, {"dY", "X", "grid"}, types_of(feeds),
                                         {"dX", "dGrid"}, DType::Float64);
          std::vector<Tensor> want;
          expect_native_equals_body(g, feeds, fns, false, &want);
          double largest = 0;
          for (int64_t i = 0; i < want[0].numel(); ++i) largest = std::max(largest, std::abs(want[0].ptr<double>()[i]));
          EXPECT_GT(largest, 0.0) << "dX all zero";
          if (m != 1) {
            largest = 0;
            for (int64_t i = 0; i < want[1].numel(); ++i) largest = std::max(largest, std::abs(want[1].ptr<double>()[i]));
            EXPECT_GT(largest, 0.0) << "dGrid all zero";
          }
          // float32: the native kernel against the body, both in float32.
          std::map<std::string, Tensor> feeds32;
          for (const auto& [name, t] : feeds) {
            Tensor f = Tensor::empty(DType::Float32, t.shape);
            for (int64_t i = 0; i < t.numel(); ++i) f.ptr<float>()[i] = static_cast<float>(t.ptr<double>()[i]);
            feeds32[name] = std::move(f);
          }
          const Graph g32 = fused_op_graph("GridSampleGrad", attrs, {"dY", "X", "grid"}, types_of(feeds32),
                                           {"dX", "dGrid"}, DType::Float32);
          ExecutorOptions native, body;
          native.functions = body.functions = fns;
          body.prefer_function_bodies = true;
          const std::map<std::string, int64_t> opsets{{"", 17}, {kFusedGradDomain, 1}};
          const std::vector<Tensor> a = Executor(g32, opsets, std::make_shared<TensorStore>(), native).run(feeds32);
          const std::vector<Tensor> b = Executor(g32, opsets, std::make_shared<TensorStore>(), body).run(feeds32);
          for (size_t o = 0; o < 2; ++o) {
            ASSERT_EQ(a[o].shape, b[o].shape);
            for (int64_t i = 0; i < a[o].numel(); ++i)
              EXPECT_NEAR(a[o].ptr<float>()[i], b[o].ptr<float>()[i], 1e-5 * (1 + std::abs(a[o].ptr<float>()[i])))
                  << "float32 output " << o << " at " << i;
          }
          ++checked;
        }
  EXPECT_EQ(checked, 18 + 9 + 9);
}

// The ints the body reads must say what GridSample's strings say: the kernel refuses a node where they differ.
TEST(FusedBothWays, GridSampleGradIntsMustAgreeWithTheStrings) {
  auto error_of = [](std::map<std::string, Attribute> attrs) {
    std::map<std::string, Tensor> feeds{{"dY", Tensor::empty(DType::Float32, {1, 1, 2, 2})},
                                        {"X", Tensor::empty(DType::Float32, {1, 1, 3, 3})},
                                        {"grid", Tensor::empty(DType::Float32, {1, 2, 2, 2})}};
    const Graph g = fused_op_graph("GridSampleGrad", std::move(attrs), {"dY", "X", "grid"}, types_of(feeds),
                                   {"dX", "dGrid"}, DType::Float32);
    return test::error_of([&] { Executor(g, {{"", 17}, {kFusedGradDomain, 1}}, std::make_shared<TensorStore>(), {}).run(feeds); });
  };
  EXPECT_NE(error_of({{"mode", std::string("nearest")}, {"interpolation", int64_t{0}}, {"padding", int64_t{0}}})
                .find("attribute 'interpolation' 0 disagrees with mode 'nearest'"),
            std::string::npos);
  EXPECT_NE(error_of({{"padding_mode", std::string("border")}, {"interpolation", int64_t{0}}, {"padding", int64_t{2}}})
                .find("attribute 'padding' 2 disagrees with padding_mode 'border'"),
            std::string::npos);
}

// The recurrent grads' bodies (default activations; gradients/fused_recurrent.cpp) against the native BPTT
// kernels, float64 and float32, on random inputs; returns the native float64 gradients. `gates`: 1 for RNN, 3 for
// GRU, 4 for LSTM. With direction 'bidirectional' the inputs carry two directions (D = 2). The options: `lens`
// sequence_lens (one per batch row) or none; `layout1` batch-major X, states, dY and their gradients; `peepholes`
// a random P for LSTM (else zeros, as the rule passes for an absent one; dP is compared either way). clip and
// input_forget come in `attrs`; the helper writes what the rule always writes beside them (reverse, layout,
// clip_bound, input_forget).
struct RecurrentCase {
  std::vector<int32_t> lens;
  bool layout1 = false;
  bool peepholes = false;
};

std::vector<Tensor> expect_recurrent_body_equals_kernel(const std::string& op, int64_t gates,
                                                        std::map<std::string, Attribute> attrs, uint32_t seed,
                                                        const RecurrentCase& rc = {}) {
  const std::vector<Function> fns = fused_grad_functions();
  std::mt19937 rng(seed);
  const int64_t S = 5, Bn = 3, I = 4, H = 6;
  const auto dir = attrs.find("direction");
  const int64_t D = dir != attrs.end() && std::get<std::string>(dir->second) == "bidirectional" ? 2 : 1;
  const bool lstm = gates == 4;
  const std::vector<int32_t>& lens = rc.lens;
  attrs["hidden_size"] = H;
  attrs.emplace("reverse", int64_t{0});
  attrs.emplace("layout", int64_t{rc.layout1 ? 1 : 0});
  const auto clip = attrs.find("clip");
  attrs["clip_bound"] = clip != attrs.end() ? std::get<float>(clip->second) : std::numeric_limits<float>::max();
  if (lstm) attrs.emplace("input_forget", int64_t{0});
  // The default activations, coded (ActKind: 0 Sigmoid, 1 Tanh) per direction, unless the case gives others.
  if (!attrs.count("activation_kinds")) {
    std::vector<int64_t> kinds;
    for (int64_t k = 0; k < D; ++k)
      for (int64_t code : lstm ? std::vector<int64_t>{0, 1, 1} : gates == 3 ? std::vector<int64_t>{0, 1} : std::vector<int64_t>{1})
        kinds.push_back(code);
    attrs["activation_kinds"] = kinds;
    attrs["activation_alphas"] = attrs["activation_betas"] = std::vector<float>(kinds.size(), 0.0f);
  }
  const auto state = [&]() -> std::vector<int64_t> {
    return rc.layout1 ? std::vector<int64_t>{Bn, D, H} : std::vector<int64_t>{D, Bn, H};
  };
  std::map<std::string, Tensor> feeds{
      {"X", random_tensor(rc.layout1 ? std::vector<int64_t>{Bn, S, I} : std::vector<int64_t>{S, Bn, I}, rng, -1, 1)},
      {"W", random_tensor({D, gates * H, I}, rng, -0.6, 0.6)},
      {"R", random_tensor({D, gates * H, H}, rng, -0.6, 0.6)},
      {"B", random_tensor({D, 2 * gates * H}, rng, -0.5, 0.5)},
      {"initial_h", random_tensor(state(), rng, -1, 1)},
      {"dY", random_tensor(rc.layout1 ? std::vector<int64_t>{Bn, S, D, H} : std::vector<int64_t>{S, D, Bn, H}, rng, -1, 1)},
      {"dY_h", random_tensor(state(), rng, -1, 1)}};
  std::vector<std::string> inputs{"X", "W", "R", "B", "", "initial_h", "dY", "dY_h"};
  std::vector<std::string> outputs{"dX", "dW", "dR", "dB", "", "dinitial_h"};
  if (lstm) {
    feeds["initial_c"] = random_tensor(state(), rng, -1, 1);
    feeds["dY_c"] = random_tensor(state(), rng, -1, 1);
    feeds["P"] = random_tensor({D, 3 * H}, rng, rc.peepholes ? -0.8 : 0, rc.peepholes ? 0.8 : 0);
    inputs = {"X", "W", "R", "B", "", "initial_h", "initial_c", "P", "dY", "dY_h", "dY_c"};
    outputs = {"dX", "dW", "dR", "dB", "", "dinitial_h", "dinitial_c", "dP"};
  }
  if (!lens.empty()) {
    feeds["sequence_lens"] = Tensor::from_vector<int32_t>({Bn}, lens);
    inputs[4] = "sequence_lens";
  }
  std::vector<std::string> named;
  for (const std::string& i : inputs)
    if (!i.empty()) named.push_back(i);
  const auto graph_of = [&](const std::map<std::string, Tensor>& fs, DType t) {
    Graph g = fused_op_graph(op, attrs, named, types_of(fs), {}, t);
    g.nodes[0].inputs = inputs;
    g.nodes[0].outputs = outputs;
    for (const std::string& o : outputs)
      if (!o.empty()) g.outputs.push_back({o, {t, std::nullopt}});
    return g;
  };
  std::vector<Tensor> want;
  expect_native_equals_body(graph_of(feeds, DType::Float64), feeds, fns, true, &want);
  // Every direction's slice of dW, dR, dB, dP and the initial states' gradients is nonzero: a direction the body
  // left out would not agree vacuously. (The states' direction axis is the second one in layout 1.)
  std::vector<std::string> named_out;
  for (const std::string& o : outputs)
    if (!o.empty()) named_out.push_back(o);
  if (want.size() != named_out.size()) {
    ADD_FAILURE() << "expected " << named_out.size() << " outputs";
    return want;
  }
  for (size_t o = 0; o < want.size(); ++o) {
    if (named_out[o] == "dX") continue;
    const bool state_grad = named_out[o] == "dinitial_h" || named_out[o] == "dinitial_c";
    const int64_t per = want[o].numel() / D;
    std::vector<double> largest(D, 0.0);
    for (int64_t i = 0; i < want[o].numel(); ++i) {
      const int64_t k = rc.layout1 && state_grad ? (i / H) % D : i / per;
      largest[k] = std::max(largest[k], std::abs(want[o].ptr<double>()[i]));
    }
    for (int64_t k = 0; k < D; ++k) EXPECT_GT(largest[k], 0.0) << named_out[o] << " direction " << k;
  }
  // sequence_lens, from the ONNX spec rather than the kernel: a row's steps past its length do not run, so X
  // there gets no gradient, and a row of length 0 passes dY_h straight to initial_h.
  const auto x_at = [&](int64_t t, int64_t b) { return rc.layout1 ? (b * S + t) * I : (t * Bn + b) * I; };
  const auto state_at = [&](int64_t k, int64_t b) { return rc.layout1 ? (b * D + k) * H : (k * Bn + b) * H; };
  for (int64_t b = 0; b < static_cast<int64_t>(lens.size()); ++b) {
    SCOPED_TRACE("row " + std::to_string(b) + " of length " + std::to_string(lens[b]));
    const Tensor& dx = want[0];
    for (int64_t t = lens[b]; t < S; ++t)
      for (int64_t i = 0; i < I; ++i) EXPECT_EQ(dx.ptr<double>()[x_at(t, b) + i], 0.0) << "dX at step " << t;
    if (lens[b] != 0) continue;
    const Tensor& dh0 = want[4];
    for (int64_t k = 0; k < D; ++k)
      for (int64_t j = 0; j < H; ++j)
        EXPECT_EQ(dh0.ptr<double>()[state_at(k, b) + j], feeds.at("dY_h").ptr<double>()[state_at(k, b) + j]);
  }
  std::map<std::string, Tensor> feeds32;
  for (const auto& [name, t] : feeds) {
    if (t.dtype != DType::Float64) {  // sequence_lens
      feeds32[name] = t;
      continue;
    }
    Tensor x = Tensor::empty(DType::Float32, t.shape);
    for (int64_t i = 0; i < t.numel(); ++i) x.ptr<float>()[i] = static_cast<float>(t.ptr<double>()[i]);
    feeds32[name] = std::move(x);
  }
  const Graph g32 = graph_of(feeds32, DType::Float32);
  ExecutorOptions native, body;
  native.functions = body.functions = fns;
  body.prefer_function_bodies = true;
  const std::map<std::string, int64_t> opsets{{"", 17}, {kFusedGradDomain, 1}};
  const std::vector<Tensor> a = Executor(g32, opsets, std::make_shared<TensorStore>(), native).run(feeds32);
  const std::vector<Tensor> b = Executor(g32, opsets, std::make_shared<TensorStore>(), body).run(feeds32);
  EXPECT_EQ(a.size(), b.size());
  for (size_t o = 0; o < std::min(a.size(), b.size()); ++o) {
    EXPECT_EQ(a[o].shape, b[o].shape);
    if (a[o].shape != b[o].shape) continue;
    for (int64_t i = 0; i < a[o].numel(); ++i)
      EXPECT_NEAR(a[o].ptr<float>()[i], b[o].ptr<float>()[i], 2e-5 * (1 + std::abs(a[o].ptr<float>()[i])))
          << "float32 " << g32.outputs[o].name << " at " << i;
  }
  return want;
}

// The reverse direction: the kernels run it backwards in time, the bodies on time-flipped tensors.
const std::map<std::string, Attribute> kReverse{{"direction", std::string("reverse")}, {"reverse", int64_t{1}}};

TEST(FusedBothWays, RNNGradForward) { expect_recurrent_body_equals_kernel("RNNGrad", 1, {}, 41); }

TEST(FusedBothWays, RecurrentGradsReverse) {
  {
    SCOPED_TRACE("RNNGrad");
    expect_recurrent_body_equals_kernel("RNNGrad", 1, kReverse, 51);
  }
  for (int64_t lbr : {0, 1}) {
    SCOPED_TRACE("GRUGrad, linear_before_reset " + std::to_string(lbr));
    std::map<std::string, Attribute> attrs = kReverse;
    attrs["linear_before_reset"] = lbr;
    expect_recurrent_body_equals_kernel("GRUGrad", 3, attrs, 52 + lbr);
  }
  {
    SCOPED_TRACE("LSTMGrad");
    expect_recurrent_body_equals_kernel("LSTMGrad", 4, kReverse, 55);
  }
}

// Bidirectional: the forward direction on slice 0 and the reverse one (time-flipped) on slice 1 of W, R, B, the
// states and dY; dX sums both. The rule writes reverse 0 there.
const std::map<std::string, Attribute> kBidirectional{{"direction", std::string("bidirectional")},
                                                      {"reverse", int64_t{0}}};

TEST(FusedBothWays, RecurrentGradsBidirectional) {
  {
    SCOPED_TRACE("RNNGrad");
    expect_recurrent_body_equals_kernel("RNNGrad", 1, kBidirectional, 62);
  }
  for (int64_t lbr : {0, 1}) {
    SCOPED_TRACE("GRUGrad, linear_before_reset " + std::to_string(lbr));
    std::map<std::string, Attribute> attrs = kBidirectional;
    attrs["linear_before_reset"] = lbr;
    expect_recurrent_body_equals_kernel("GRUGrad", 3, attrs, 63 + lbr);
  }
  {
    SCOPED_TRACE("LSTMGrad");
    expect_recurrent_body_equals_kernel("LSTMGrad", 4, kBidirectional, 65);
  }
}

// Every direction, as (direction, reverse) attributes.
const std::vector<std::map<std::string, Attribute>> kDirections{
    {{"direction", std::string("forward")}, {"reverse", int64_t{0}}}, kReverse, kBidirectional};

std::string direction_of(const std::map<std::string, Attribute>& attrs) {
  return std::get<std::string>(attrs.at("direction"));
}

// sequence_lens: rows of full length, of length 0 and shorter, in every direction (the reverse direction runs a
// row from its last step down, so its steps past the length come first in step order).
TEST(FusedBothWays, RecurrentGradsSequenceLens) {
  const RecurrentCase lens{{5, 0, 2}};
  uint32_t seed = 71;
  for (const auto& attrs : kDirections) {
    const std::string direction = direction_of(attrs);
    {
      SCOPED_TRACE("RNNGrad " + direction);
      expect_recurrent_body_equals_kernel("RNNGrad", 1, attrs, seed++, lens);
    }
    for (int64_t lbr : {0, 1}) {
      SCOPED_TRACE("GRUGrad " + direction + ", linear_before_reset " + std::to_string(lbr));
      std::map<std::string, Attribute> a = attrs;
      a["linear_before_reset"] = lbr;
      expect_recurrent_body_equals_kernel("GRUGrad", 3, a, seed++, lens);
    }
    {
      SCOPED_TRACE("LSTMGrad " + direction);
      expect_recurrent_body_equals_kernel("LSTMGrad", 4, attrs, seed++, lens);
    }
  }
}

// The largest difference between two runs' gradients (of the same outputs).
double largest_difference(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  double d = 0;
  for (size_t o = 0; o < std::min(a.size(), b.size()); ++o)
    for (int64_t i = 0; i < std::min(a[o].numel(), b[o].numel()); ++i)
      d = std::max(d, std::abs(a[o].ptr<double>()[i] - b[o].ptr<double>()[i]));
  return d;
}

// clip: every gate's pre-activation clipped to [-clip, clip] (not LSTM's cell state), no gradient where clipped.
// Every op in every direction, with sequence_lens too; clip 0.5 clips many of these pre-activations, which the test
// checks (the kernel's gradients move when clip is removed), so a body that ignored clip would disagree.
TEST(FusedBothWays, RecurrentGradsClip) {
  uint32_t seed = 81;
  for (const auto& dir : kDirections) {
    for (const RecurrentCase& rc : {RecurrentCase{}, RecurrentCase{{5, 0, 2}}}) {
      const std::string label = direction_of(dir) + (rc.lens.empty() ? "" : ", sequence_lens");
      for (const auto& [op, gates] : {std::pair<std::string, int64_t>{"RNNGrad", 1}, {"GRUGrad", 3}, {"GRUGrad", 3},
                                      {"LSTMGrad", 4}}) {
        std::map<std::string, Attribute> attrs = dir;
        if (op == "GRUGrad") attrs["linear_before_reset"] = int64_t{seed % 2};
        SCOPED_TRACE(op + " " + label + (op == "GRUGrad" ? ", linear_before_reset " + std::to_string(seed % 2) : ""));
        const std::vector<Tensor> unclipped = expect_recurrent_body_equals_kernel(op, gates, attrs, seed, rc);
        attrs["clip"] = 0.5f;
        const std::vector<Tensor> clipped = expect_recurrent_body_equals_kernel(op, gates, attrs, seed, rc);
        EXPECT_GT(largest_difference(clipped, unclipped), 1e-3) << "clip 0.5 clipped nothing";
        ++seed;
      }
    }
  }
}

// layout 1: X [B, S, I], the states [B, D, H], dY [B, S, D, H] and the gradients of X and the states batch-major;
// every op in every direction, with sequence_lens on the reverse one (whose spec checks read batch-major dX).
TEST(FusedBothWays, RecurrentGradsLayout1) {
  uint32_t seed = 101;
  for (const auto& dir : kDirections) {
    RecurrentCase rc;
    rc.layout1 = true;
    if (direction_of(dir) == "reverse") rc.lens = {2, 5, 0};
    for (const auto& [op, gates] : {std::pair<std::string, int64_t>{"RNNGrad", 1}, {"GRUGrad", 3}, {"LSTMGrad", 4}}) {
      SCOPED_TRACE(op + " " + direction_of(dir) + " layout 1");
      std::map<std::string, Attribute> attrs = dir;
      if (op == "GRUGrad") attrs["linear_before_reset"] = int64_t{seed % 2};
      expect_recurrent_body_equals_kernel(op, gates, attrs, seed++, rc);
    }
  }
}

// LSTM peepholes (a random P; dP is compared and nonzero per direction) and input_forget (f = 1 - i), apart and
// together, in every direction; and everything at once: bidirectional, batch-major, clip, sequence_lens,
// peepholes, input_forget. input_forget changes the kernel's gradients, so a body that ignored it would disagree.
TEST(FusedBothWays, LSTMGradPeepholesAndInputForget) {
  uint32_t seed = 121;
  for (const auto& dir : kDirections) {
    for (const auto& [peepholes, input_forget] : {std::pair<bool, int64_t>{true, 0}, {false, 1}, {true, 1}}) {
      SCOPED_TRACE(direction_of(dir) + (peepholes ? ", peepholes" : "") + ", input_forget " + std::to_string(input_forget));
      RecurrentCase rc;
      rc.peepholes = peepholes;
      std::map<std::string, Attribute> attrs = dir;
      const std::vector<Tensor> uncoupled = expect_recurrent_body_equals_kernel("LSTMGrad", 4, attrs, seed, rc);
      attrs["input_forget"] = input_forget;
      const std::vector<Tensor> coupled = expect_recurrent_body_equals_kernel("LSTMGrad", 4, attrs, seed, rc);
      if (input_forget) {
        EXPECT_GT(largest_difference(coupled, uncoupled), 1e-3) << "input_forget changed nothing";
      }
      ++seed;
    }
  }
  SCOPED_TRACE("everything at once");
  RecurrentCase rc{{3, 0, 5}, true, true};
  std::map<std::string, Attribute> attrs = kBidirectional;
  attrs["clip"] = 0.7f;
  attrs["input_forget"] = int64_t{1};
  expect_recurrent_body_equals_kernel("LSTMGrad", 4, attrs, seed, rc);
}

// Non-default activations, with the ints and floats the rule writes beside the strings (activation_kinds as the
// kernel's ActKind: 0 Sigmoid, 1 Tanh, 2 Relu, 3 Affine, 4 LeakyRelu, 5 ThresholdedRelu, 6 ScaledTanh,
// 7 HardSigmoid, 8 Elu, 9 Softsign, 10 Softplus; alpha and beta with the defaults filled in, as float attributes
// hold them). The kernel refuses ints that do not say what the strings say, so these also pin the coding.
std::vector<float> F6() { return std::vector<float>(6, 0.0f); }

struct ActivationCase {
  std::vector<std::string> names;
  std::vector<float> alpha, beta;                        // the ONNX attributes (empty: not given)
  std::vector<int64_t> kinds;                            // what the rule writes
  std::vector<float> alphas, betas;
};

std::map<std::string, Attribute> with_activations(std::map<std::string, Attribute> attrs, const ActivationCase& a) {
  attrs["activations"] = a.names;
  if (!a.alpha.empty()) attrs["activation_alpha"] = a.alpha;
  if (!a.beta.empty()) attrs["activation_beta"] = a.beta;
  attrs["activation_kinds"] = a.kinds;
  attrs["activation_alphas"] = a.alphas;
  attrs["activation_betas"] = a.betas;
  return attrs;
}

// Every function in RNN's one slot (given alpha and beta, and the defaults), with clip for every other one; then
// two functions per direction, bidirectional. Each differs from Tanh's gradients, so a body that ignored the
// kinds would disagree.
TEST(FusedBothWays, RNNGradEveryActivation) {
  const std::vector<ActivationCase> cases{
      {{"Sigmoid"}, {}, {}, {0}, {0}, {0}},
      {{"Relu"}, {}, {}, {2}, {0}, {0}},
      {{"Affine"}, {0.7f}, {0.1f}, {3}, {0.7f}, {0.1f}},
      {{"Affine"}, {}, {}, {3}, {1}, {0}},
      {{"LeakyRelu"}, {0.2f}, {}, {4}, {0.2f}, {0}},
      {{"LeakyRelu"}, {}, {}, {4}, {0.01f}, {0}},
      {{"ThresholdedRelu"}, {0.3f}, {}, {5}, {0.3f}, {0}},
      {{"ScaledTanh"}, {1.5f}, {0.8f}, {6}, {1.5f}, {0.8f}},
      {{"HardSigmoid"}, {0.3f}, {0.45f}, {7}, {0.3f}, {0.45f}},
      {{"HardSigmoid"}, {}, {}, {7}, {0.2f}, {0.5f}},
      {{"Elu"}, {0.9f}, {}, {8}, {0.9f}, {0}},
      {{"Softsign"}, {}, {}, {9}, {0}, {0}},
      {{"Softplus"}, {}, {}, {10}, {0}, {0}},
  };
  uint32_t seed = 141;
  for (size_t i = 0; i < cases.size(); ++i) {
    const ActivationCase& a = cases[i];
    SCOPED_TRACE(a.names[0] + (a.alpha.empty() ? " (defaults)" : "") + (i % 2 ? ", clip" : ""));
    std::map<std::string, Attribute> attrs;
    if (i % 2) attrs["clip"] = 0.8f;
    const std::vector<Tensor> tanh = expect_recurrent_body_equals_kernel("RNNGrad", 1, attrs, seed);
    const std::vector<Tensor> other = expect_recurrent_body_equals_kernel("RNNGrad", 1, with_activations(attrs, a), seed);
    EXPECT_GT(largest_difference(tanh, other), 1e-3) << "the activation changed nothing";
    ++seed;
  }
  // alpha and beta are consumed in order by the functions that take them; one list stands for both directions
  // (the second LeakyRelu finds no alpha left and takes the default).
  const std::vector<ActivationCase> pairs{
      {{"Relu", "Softplus"}, {}, {}, {2, 10}, {0, 0}, {0, 0}},
      {{"Affine", "LeakyRelu"}, {0.7f, 0.2f}, {0.1f}, {3, 4}, {0.7f, 0.2f}, {0.1f, 0}},
      {{"ScaledTanh", "HardSigmoid"}, {1.5f, 0.3f}, {0.8f, 0.45f}, {6, 7}, {1.5f, 0.3f}, {0.8f, 0.45f}},
      {{"Elu", "ThresholdedRelu"}, {0.9f, 0.3f}, {}, {8, 5}, {0.9f, 0.3f}, {0, 0}},
      {{"Softsign", "Sigmoid"}, {}, {}, {9, 0}, {0, 0}, {0, 0}},
      {{"LeakyRelu"}, {0.2f}, {}, {4, 4}, {0.2f, 0.01f}, {0, 0}},
  };
  for (const ActivationCase& a : pairs) {
    SCOPED_TRACE("bidirectional " + a.names[0] + (a.names.size() > 1 ? ", " + a.names[1] : " for both"));
    expect_recurrent_body_equals_kernel("RNNGrad", 1, with_activations(kBidirectional, a), seed++, RecurrentCase{{5, 0, 2}});
  }
}

// GRU's two slots and LSTM's three with other functions, per direction or one list for both (the kernel, like
// onnxruntime, takes one direction's list for both), with clip, sequence_lens, layout 1 and peepholes among them.
TEST(FusedBothWays, GRUAndLSTMGradsActivations) {
  {
    SCOPED_TRACE("GRUGrad Softsign, Affine");
    for (int64_t lbr : {0, 1}) {
      std::map<std::string, Attribute> attrs{{"linear_before_reset", lbr}};
      expect_recurrent_body_equals_kernel(
          "GRUGrad", 3, with_activations(attrs, {{"Softsign", "Affine"}, {0.7f}, {0.1f}, {9, 3}, {0, 0.7f}, {0, 0.1f}}),
          161 + lbr);
    }
  }
  {
    SCOPED_TRACE("GRUGrad bidirectional HardSigmoid, Elu / Relu, LeakyRelu, clip, sequence_lens");
    std::map<std::string, Attribute> attrs = kBidirectional;
    attrs["linear_before_reset"] = int64_t{1};
    attrs["clip"] = 1.5f;
    expect_recurrent_body_equals_kernel(
        "GRUGrad", 3,
        with_activations(attrs, {{"HardSigmoid", "Elu", "Relu", "LeakyRelu"}, {0.3f, 0.9f, 0.2f}, {0.45f},
                                 {7, 8, 2, 4}, {0.3f, 0.9f, 0, 0.2f}, {0.45f, 0, 0, 0}}),
        163, RecurrentCase{{5, 0, 2}});
  }
  {
    SCOPED_TRACE("LSTMGrad bidirectional HardSigmoid, Softsign, ScaledTanh / Sigmoid, Tanh, Elu, peepholes");
    RecurrentCase rc;
    rc.peepholes = true;
    expect_recurrent_body_equals_kernel(
        "LSTMGrad", 4,
        with_activations(kBidirectional, {{"HardSigmoid", "Softsign", "ScaledTanh", "Sigmoid", "Tanh", "Elu"},
                                          {0.3f, 0.8f, 1.5f}, {0.45f, 1.2f}, {7, 9, 6, 0, 1, 8},
                                          {0.3f, 0, 0.8f, 0, 0, 1.5f}, {0.45f, 0, 1.2f, 0, 0, 0}}),
        165, rc);
  }
  {
    SCOPED_TRACE("LSTMGrad bidirectional, one list Softsign, Softplus, Relu for both, clip, layout 1, input_forget");
    RecurrentCase rc{{3, 5, 0}, true, true};
    std::map<std::string, Attribute> attrs = kBidirectional;
    attrs["clip"] = 0.9f;
    attrs["input_forget"] = int64_t{1};
    expect_recurrent_body_equals_kernel(
        "LSTMGrad", 4,
        with_activations(attrs, {{"Softsign", "Softplus", "Relu"}, {}, {}, {9, 10, 2, 9, 10, 2}, F6(), F6()}), 167, rc);
  }
  {
    SCOPED_TRACE("LSTMGrad reverse LeakyRelu, ThresholdedRelu, Affine (defaults)");
    expect_recurrent_body_equals_kernel(
        "LSTMGrad", 4,
        with_activations(kReverse, {{"LeakyRelu", "ThresholdedRelu", "Affine"}, {}, {}, {4, 5, 3},
                                    {0.01f, 1, 1}, {0, 0, 0}}),
        169);
  }
}

TEST(FusedBothWays, LSTMGradForward) { expect_recurrent_body_equals_kernel("LSTMGrad", 4, {}, 47); }

TEST(FusedBothWays, GRUGradForward) {
  for (int64_t lbr : {0, 1}) {
    SCOPED_TRACE("linear_before_reset " + std::to_string(lbr));
    expect_recurrent_body_equals_kernel("GRUGrad", 3, {{"linear_before_reset", lbr}}, 43 + lbr);
  }
}

// What the recurrent bodies cannot serve (attributes or inputs the rule always writes or passes, missing or
// malformed) is named (export_gradient_model refuses such a node with this text); what the rules emit, every
// activation, clip, layout 1, peepholes and input_forget included, is accepted.
TEST(FusedBothWays, RecurrentBodyRefusalsNameTheAttribute) {
  const float no_clip = std::numeric_limits<float>::max();
  const auto node = [&](const std::string& op, std::map<std::string, Attribute> attrs, std::vector<std::string> in) {
    Node n;
    n.name = "g";
    n.op_type = op;
    n.domain = kFusedGradDomain;
    n.attributes = std::move(attrs);
    n.attributes.emplace("hidden_size", int64_t{4});
    n.attributes.emplace("reverse", int64_t{0});
    n.attributes.emplace("layout", int64_t{0});
    n.attributes.emplace("clip_bound", no_clip);
    if (op == "LSTMGrad") n.attributes.emplace("input_forget", int64_t{0});
    const bool bidirectional = n.attr_string("direction", "forward") == "bidirectional";
    const size_t count = (op == "LSTMGrad" ? 3 : op == "GRUGrad" ? 2 : 1) * (bidirectional ? 2 : 1);
    n.attributes.emplace("activation_kinds", std::vector<int64_t>(count, 1));
    n.attributes.emplace("activation_alphas", std::vector<float>(count, 0.0f));
    n.attributes.emplace("activation_betas", std::vector<float>(count, 0.0f));
    n.inputs = std::move(in);
    return n;
  };
  const std::vector<std::string> rnn_in{"x", "w", "r", "b", "", "h0", "dy", "dyh"};
  const std::vector<std::string> lstm_in{"x", "w", "r", "b", "", "h0", "c0", "p", "dy", "dyh", "dyc"};
  using S = std::vector<std::string>;
  EXPECT_EQ(fused_body_refusal(node("RNNGrad", {}, rnn_in)), "");
  EXPECT_EQ(fused_body_refusal(node("GRUGrad", {{"linear_before_reset", int64_t{1}}}, rnn_in)), "");
  EXPECT_EQ(fused_body_refusal(node("LSTMGrad", {{"activations", S{"Sigmoid", "Tanh", "Tanh"}}}, lstm_in)), "");
  const auto refusal = [&](const std::string& op, std::map<std::string, Attribute> attrs,
                           std::vector<std::string> in) { return fused_body_refusal(node(op, std::move(attrs), std::move(in))); };
  EXPECT_EQ(refusal("RNNGrad", {{"direction", std::string("reverse")}, {"reverse", int64_t{1}}}, rnn_in), "");
  // Every direction the ONNX ops define has a body; the int `reverse` must still agree with the string.
  const std::map<std::string, Attribute> both{{"direction", std::string("bidirectional")}};
  EXPECT_EQ(refusal("RNNGrad", both, rnn_in), "");
  EXPECT_EQ(refusal("GRUGrad", {{"direction", std::string("bidirectional")}, {"linear_before_reset", int64_t{1}}}, rnn_in),
            "");
  EXPECT_EQ(refusal("LSTMGrad", both, lstm_in), "");
  EXPECT_NE(refusal("LSTMGrad", {{"direction", std::string("bidirectional")}, {"reverse", int64_t{1}}}, lstm_in)
                .find("attribute 'reverse' must be 0 for direction 'bidirectional'"),
            std::string::npos);
  EXPECT_NE(refusal("RNNGrad", {{"direction", std::string("sideways")}}, rnn_in).find("attribute 'direction' is 'sideways'"),
            std::string::npos);
  EXPECT_NE(refusal("LSTMGrad", {{"direction", std::string("reverse")}}, lstm_in).find("attribute 'reverse' must be 1"),
            std::string::npos);
  // Every activation is served, read from the ints and floats the rule writes beside the strings (F functions per
  // direction); without them, or with a count or code that does not fit, the node is refused.
  using I = std::vector<int64_t>;
  using F = std::vector<float>;
  const auto coded = [](I kinds, std::map<std::string, Attribute> attrs = {}) {
    attrs["activation_alphas"] = attrs["activation_betas"] = F(kinds.size(), 0.5f);
    attrs["activation_kinds"] = std::move(kinds);
    return attrs;
  };
  EXPECT_EQ(refusal("RNNGrad", coded({2}, {{"activations", S{"Relu"}}}), rnn_in), "");
  EXPECT_EQ(refusal("LSTMGrad", coded({7, 9, 10}, {{"activations", S{"HardSigmoid", "Softsign", "Softplus"}}}), lstm_in), "");
  const std::map<std::string, Attribute> both_lbr{{"direction", std::string("bidirectional")},
                                                  {"linear_before_reset", int64_t{0}}};
  EXPECT_EQ(refusal("GRUGrad", coded({3, 4, 5, 6}, both_lbr), rnn_in), "");
  EXPECT_NE(refusal("GRUGrad", coded({3, 4}, both_lbr), rnn_in).find("must each list 4 values"), std::string::npos);
  EXPECT_NE(refusal("RNNGrad", coded({11}), rnn_in).find("holds 11, which codes no activation function"),
            std::string::npos);
  EXPECT_NE(refusal("RNNGrad", coded({-1}), rnn_in).find("holds -1"), std::string::npos);
  for (const char* a : {"activation_kinds", "activation_alphas", "activation_betas"}) {
    Node without = node("RNNGrad", {}, rnn_in);
    without.attributes.erase(a);
    EXPECT_NE(fused_body_refusal(without).find("'activation_kinds', 'activation_alphas' and 'activation_betas' must"),
              std::string::npos)
        << a;
  }
  // clip, layout 1, input_forget and peepholes are served; clip with the clip_bound the rule writes beside it.
  for (const char* op : {"RNNGrad", "GRUGrad", "LSTMGrad"}) {
    SCOPED_TRACE(op);
    const std::vector<std::string>& in = std::string(op) == "LSTMGrad" ? lstm_in : rnn_in;
    const std::map<std::string, Attribute> lbr{{"linear_before_reset", int64_t{0}}};
    std::map<std::string, Attribute> clipped = lbr, unbounded = lbr, wrong = lbr, batch_major = lbr;
    clipped["clip"] = unbounded["clip"] = wrong["clip"] = 3.0f;
    clipped["clip_bound"] = 3.0f;
    wrong["clip_bound"] = 2.0f;
    batch_major["layout"] = int64_t{1};
    EXPECT_EQ(refusal(op, clipped, in), "");
    EXPECT_EQ(refusal(op, batch_major, in), "");
    EXPECT_NE(refusal(op, unbounded, in).find("attribute 'clip_bound' must be the clip"), std::string::npos);
    EXPECT_NE(refusal(op, wrong, in).find("attribute 'clip_bound' must be the clip"), std::string::npos);
    Node no_bound = node(op, lbr, in);
    no_bound.attributes.erase("clip_bound");
    EXPECT_NE(fused_body_refusal(no_bound).find("attribute 'clip_bound' must be the largest float"), std::string::npos);
    Node no_layout = node(op, lbr, in);
    no_layout.attributes.erase("layout");
    EXPECT_NE(fused_body_refusal(no_layout).find("attribute 'layout' must be set"), std::string::npos);
    std::vector<std::string> without_b = in;
    without_b[3] = "";
    EXPECT_NE(refusal(op, lbr, without_b).find("B is absent"), std::string::npos);
  }
  EXPECT_NE(refusal("GRUGrad", {}, rnn_in).find("'linear_before_reset' is not set"), std::string::npos);
  EXPECT_EQ(refusal("LSTMGrad", {{"input_forget", int64_t{1}}}, lstm_in), "");
  Node no_input_forget = node("LSTMGrad", {}, lstm_in);
  no_input_forget.attributes.erase("input_forget");
  EXPECT_NE(fused_body_refusal(no_input_forget).find("attribute 'input_forget' is not set"), std::string::npos);
  std::vector<std::string> without_p = lstm_in, with_lens = rnn_in, without_h0 = rnn_in, lstm_lens = lstm_in;
  without_p[7] = "";
  with_lens[4] = "lens";
  lstm_lens[4] = "lens";
  without_h0[5] = "";
  EXPECT_NE(refusal("LSTMGrad", {}, without_p).find("initial_h, initial_c, P, dY, dY_h or dY_c is absent"),
            std::string::npos);
  EXPECT_EQ(refusal("RNNGrad", {}, with_lens), "");  // sequence_lens: served
  EXPECT_EQ(refusal("GRUGrad", {{"linear_before_reset", int64_t{0}}}, with_lens), "");
  EXPECT_EQ(refusal("LSTMGrad", both, lstm_lens), "");
  EXPECT_NE(refusal("RNNGrad", {}, without_h0).find("initial_h, dY or dY_h is absent"), std::string::npos);
}

const std::vector<std::string> kConvInputs{"dY", "X", "W"};  // the first two for AveragePoolGrad

// The convolution family's fused ops carry the forward op's attributes (explicit pads, as the rules emit
// them); their bodies read those by reference and take sizes from runtime shapes. One row per geometry.
struct ConvFamilyCase {
  std::string label, op;
  std::map<std::string, Attribute> attrs;
  std::vector<std::vector<int64_t>> inputs;  // dY, X (, W): dY has the forward output's shape
  std::vector<std::string> outputs;          // "" for an omitted optional output
};

TEST(FusedBothWays, ConvolutionFamilyTable) {
  using I = std::vector<int64_t>;
  const std::vector<std::string> all3{"dX", "dW", "dB"};
  const std::vector<ConvFamilyCase> cases = {
      {"ConvGrad 1d stride2 pad1", "ConvGrad", {{"strides", I{2}}, {"pads", I{1, 1}}}, {{2, 4, 5}, {2, 3, 9}, {4, 3, 3}}, all3},
      {"ConvGrad 2d group2 strides dilations asym pads", "ConvGrad",
       {{"group", int64_t{2}}, {"strides", I{2, 1}}, {"dilations", I{1, 2}}, {"pads", I{1, 0, 0, 1}}},
       {{1, 6, 3, 5}, {1, 4, 7, 6}, {6, 2, 3, 2}}, all3},
      {"ConvGrad 3d pads strides", "ConvGrad", {{"pads", I{1, 0, 1, 0, 1, 0}}, {"strides", I{1, 2, 1}}},
       {{1, 2, 4, 2, 3}, {1, 2, 4, 3, 3}, {2, 2, 2, 2, 2}}, all3},
      // auto_pad='SAME_LOWER' with stride 2 over 8 as the rule resolves it (odd total: the extra pad first).
      {"ConvGrad 1d SAME_LOWER resolved", "ConvGrad", {{"strides", I{2}}, {"pads", I{1, 0}}, {"kernel_shape", I{3}}},
       {{1, 2, 4}, {1, 2, 8}, {2, 2, 3}}, all3},
      {"ConvGrad depthwise stride2 pad1, no dB", "ConvGrad",
       {{"group", int64_t{3}}, {"strides", I{2, 2}}, {"pads", I{1, 1, 1, 1}}}, {{2, 3, 3, 3}, {2, 3, 6, 6}, {3, 1, 3, 3}},
       {"dX", "dW"}},
      {"ConvGrad weights and bias only", "ConvGrad", {{"pads", I{1, 1, 1, 1}}, {"strides", I{1, 1}}}, {{2, 4, 5, 5}, {2, 3, 5, 5}, {4, 3, 3, 3}},
       {"", "dW", "dB"}},
      // Stride 3 leaves X's tail unread (dX's end padding) and the weight-gradient Conv longer than the kernel.
      {"ConvGrad stride3 unread tail", "ConvGrad", {{"strides", I{3, 3}}, {"pads", I{0, 0, 0, 0}}}, {{1, 3, 2, 2}, {1, 2, 8, 8}, {3, 2, 3, 3}},
       {"dX", "dW", "dB"}},
      {"AveragePoolGrad pads exclude", "AveragePoolGrad",
       {{"kernel_shape", I{3, 3}}, {"strides", I{2, 2}}, {"pads", I{1, 1, 1, 1}}, {"count_include_pad", int64_t{0}}},
       {{1, 2, 3, 3}, {1, 2, 5, 5}}, {"dX"}},
      {"AveragePoolGrad asym pads include", "AveragePoolGrad",
       {{"kernel_shape", I{3, 3}}, {"strides", I{2, 2}}, {"pads", I{1, 0, 0, 1}}, {"count_include_pad", int64_t{1}}},
       {{1, 2, 2, 2}, {1, 2, 5, 5}}, {"dX"}},
      {"AveragePoolGrad 1d ceil", "AveragePoolGrad",
       {{"kernel_shape", I{3}}, {"strides", I{2}}, {"pads", I{0, 0}}, {"ceil_mode", int64_t{1}},
        {"count_include_pad", int64_t{0}}},
       {{2, 2, 4}, {2, 2, 8}}, {"dX"}},
      {"AveragePoolGrad ceil include pad", "AveragePoolGrad",
       {{"kernel_shape", I{3, 2}}, {"strides", I{2, 2}}, {"pads", I{1, 0, 0, 0}}, {"ceil_mode", int64_t{1}},
        {"count_include_pad", int64_t{1}}},
       {{1, 2, 4, 4}, {1, 2, 8, 7}}, {"dX"}},
      {"AveragePoolGrad ceil exclude pad", "AveragePoolGrad",
       {{"kernel_shape", I{3, 3}}, {"strides", I{2, 2}}, {"pads", I{1, 1, 1, 1}}, {"ceil_mode", int64_t{1}},
        {"count_include_pad", int64_t{0}}},
       {{1, 1, 4, 4}, {1, 1, 6, 6}}, {"dX"}},
      {"AveragePoolGrad 3d SAME_UPPER resolved", "AveragePoolGrad",
       {{"kernel_shape", I{2, 3, 2}}, {"strides", I{1, 1, 1}}, {"pads", I{0, 1, 0, 1, 1, 1}},
        {"count_include_pad", int64_t{0}}},
       {{1, 2, 3, 4, 3}, {1, 2, 3, 4, 3}}, {"dX"}},
  };
  const std::vector<Function> fns = fused_grad_functions();
  std::mt19937 rng(11);
  for (const ConvFamilyCase& c : cases) {
    SCOPED_TRACE(c.label);
    const std::vector<std::string> inputs(kConvInputs.begin(), kConvInputs.begin() + c.inputs.size());
    std::map<std::string, Tensor> feeds;
    for (size_t i = 0; i < c.inputs.size(); ++i) feeds[inputs[i]] = random_tensor(c.inputs[i], rng, -1, 1);
    const Graph g = fused_op_graph(c.op, c.attrs, inputs, types_of(feeds), c.outputs, DType::Float64);
    std::vector<Tensor> want;
    expect_native_equals_body(g, feeds, fns, true, &want);
    // float32 takes other paths (oneDNN's backward primitives for ConvGrad): against the float64 result.
    std::map<std::string, Tensor> feeds32;
    for (const auto& [name, t] : feeds) {
      Tensor f = Tensor::empty(DType::Float32, t.shape);
      for (int64_t i = 0; i < t.numel(); ++i) f.ptr<float>()[i] = static_cast<float>(t.ptr<double>()[i]);
      feeds32[name] = std::move(f);
    }
    const Graph g32 = fused_op_graph(c.op, c.attrs, inputs, types_of(feeds32), c.outputs, DType::Float32);
    Executor e(g32, {{"", 17}, {kFusedGradDomain, 1}}, std::make_shared<TensorStore>(), ExecutorOptions{});
    const std::vector<Tensor> got = e.run(feeds32);
    ASSERT_EQ(got.size(), want.size());
    for (size_t o = 0; o < got.size(); ++o) {
      SCOPED_TRACE("float32 " + g32.outputs[o].name);
      ASSERT_EQ(got[o].shape, want[o].shape);
      for (int64_t i = 0; i < got[o].numel(); ++i) {
        const double w = want[o].ptr<double>()[i];
        EXPECT_NEAR(got[o].ptr<float>()[i], w, 1e-5 * (1 + std::abs(w))) << i;
      }
    }
  }
}

// The kernels refuse what the bodies cannot express, naming it.
TEST(FusedBothWays, ConvolutionFamilyNeedsExplicitGeometry) {
  using I = std::vector<int64_t>;
  auto error_of = [](const std::string& op, std::map<std::string, Attribute> attrs,
                     const std::vector<std::vector<int64_t>>& shapes) -> std::string {
    const std::vector<std::string> inputs(kConvInputs.begin(), kConvInputs.begin() + shapes.size());
    std::map<std::string, Tensor> feeds;
    for (size_t i = 0; i < shapes.size(); ++i) feeds[inputs[i]] = Tensor::empty(DType::Float32, shapes[i]);
    const Graph g = fused_op_graph(op, std::move(attrs), inputs, types_of(feeds), {"dX"}, DType::Float32);
    try {
      Executor e(g, {{"", 17}, {kFusedGradDomain, 1}}, std::make_shared<TensorStore>(), ExecutorOptions{});
      e.run(feeds);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(error_of("ConvGrad", {{"strides", I{1}}}, {{1, 1, 2}, {1, 1, 4}, {1, 1, 3}}).find("attribute 'pads' must be given explicitly"),
            std::string::npos);
  EXPECT_NE(error_of("ConvGrad", {{"auto_pad", std::string("SAME_UPPER")}}, {{1, 1, 4}, {1, 1, 4}, {1, 1, 3}})
                .find("auto_pad 'SAME_UPPER' is not supported here"),
            std::string::npos);
  EXPECT_NE(error_of("AveragePoolGrad", {{"kernel_shape", I{2}}, {"strides", I{1}}, {"count_include_pad", int64_t{0}}},
                     {{1, 1, 3}, {1, 1, 4}})
                .find("attribute 'pads' must be given explicitly"),
            std::string::npos);
  EXPECT_NE(error_of("ConvGrad", {{"pads", I{0, 0}}, {"strides", I{1}}}, {{1, 1, 5}, {1, 1, 4}, {1, 1, 3}}).find("expected Conv's output"),
            std::string::npos);
}

TEST(FusedBothWays, OneNodeGraphNamesAnInputWithoutAType) {
  const std::string error = test::error_of(
      [] { fused_op_graph("GatherGrad", {}, {"dY", "indices", "shape"}, {{"dY", static_type(DType::Float32, {2})}},
                          {"dX"}, DType::Float32); });
  EXPECT_EQ(error, "node 'fused' (onnxtrain.GatherGrad): input 'indices' has neither a type nor an initializer");
}

TEST(FusedBothWays, EveryFusedOpARuleEmitsHasABodyAndAKernel) {
  const std::vector<Function> fns = fused_grad_functions();
  for (const auto& [forward, fused] : fused_grad_uses()) {
    SCOPED_TRACE(forward + " -> " + fused);
    // An explicit capture: clang 14 (the sanitizer build) cannot capture a structured binding implicitly.
    EXPECT_TRUE(std::any_of(fns.begin(), fns.end(), [&fused = fused](const Function& f) { return f.name == fused; }));
    EXPECT_NE(default_kernels().find(kFusedGradDomain, fused, 1, Device::CPU, DType::Float32), nullptr);
    EXPECT_NE(default_rules().find("", forward), nullptr);
  }
}

}  // namespace
}  // namespace onnxtrain
