// Every fused gradient op must compute the same through its native kernel and through its standard-ONNX
// function body (inlined), so that another runtime running our graphs gets our numbers.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <stdexcept>

#include "executor/executor.h"
#include "gradients/fused.h"
#include "gradients/rule.h"

namespace onnxtrain {
namespace {

Tensor random_tensor(std::vector<int64_t> shape, std::mt19937& rng, double lo, double hi) {
  Tensor t = Tensor::empty(DType::Float64, std::move(shape));
  std::uniform_real_distribution<double> u(lo, hi);
  for (double& v : t.span<double>()) v = u(rng);
  return t;
}

// Runs f's op once through its native kernel and once through its inlined body, on the same feeds.
// Inputs that are initializers (a target shape the output's shape depends on) are not fed.
void expect_both_ways(const std::vector<Function>& fns, const Function& f, std::map<std::string, Attribute> attrs,
                      const std::map<std::string, Tensor>& feeds,
                      const std::map<std::string, TensorData>& initializers = {}) {
  Graph g;
  Node n;
  n.name = "fused";
  n.op_type = f.name;
  n.domain = f.domain;
  n.inputs = f.inputs;
  n.outputs = f.outputs;
  n.attributes = std::move(attrs);
  g.nodes.push_back(n);
  g.initializers = initializers;
  for (const std::string& in : f.inputs) {
    if (initializers.count(in)) continue;
    Shape s;
    for (int64_t d : feeds.at(in).shape) s.push_back(Dim::of(d));
    g.inputs.push_back({in, {feeds.at(in).dtype, s}});
  }
  for (const std::string& out : f.outputs) g.outputs.push_back({out, {DType::Float64, std::nullopt}});
  const std::map<std::string, int64_t> opsets{{"", 17}, {f.domain, 1}};
  ExecutorOptions native, body;
  native.functions = body.functions = fns;
  body.prefer_function_bodies = true;
  Executor a(g, opsets, std::make_shared<TensorStore>(), native);
  Executor b(g, opsets, std::make_shared<TensorStore>(), body);
  ASSERT_EQ(a.graph().nodes.size(), 1u) << "the native run must not inline";
  ASSERT_GT(b.graph().nodes.size(), 1u) << "the body run must inline";
  std::vector<Tensor> ra = a.run(feeds), rb = b.run(feeds);
  ASSERT_EQ(ra.size(), f.outputs.size());
  ASSERT_EQ(rb.size(), f.outputs.size());
  for (size_t o = 0; o < ra.size(); ++o) {
    SCOPED_TRACE(f.outputs[o]);
    ASSERT_EQ(ra[o].shape, rb[o].shape);
    for (int64_t i = 0; i < ra[o].numel(); ++i)
      EXPECT_NEAR(ra[o].ptr<double>()[i], rb[o].ptr<double>()[i], 1e-12) << i;
  }
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

TEST(FusedBothWays, EveryFusedOpARuleEmitsHasABodyAndAKernel) {
  const std::vector<Function> fns = fused_grad_functions();
  for (const auto& [forward, fused] : fused_grad_uses()) {
    SCOPED_TRACE(forward + " -> " + fused);
    EXPECT_TRUE(std::any_of(fns.begin(), fns.end(), [&](const Function& f) { return f.name == fused; }));
    EXPECT_NE(default_kernels().find(kFusedGradDomain, fused, 1, Device::CPU, DType::Float32), nullptr);
    EXPECT_NE(default_rules().find("", forward), nullptr);
  }
}

}  // namespace
}  // namespace onnxtrain
