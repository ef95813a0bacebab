// Every fused gradient op must compute the same through its native kernel and through its standard-ONNX
// function body (inlined), so that another runtime running our graphs gets our numbers.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

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

TEST(FusedBothWays, NativeKernelEqualsInlinedBody) {
  const std::vector<Function> fns = fused_grad_functions();
  ASSERT_FALSE(fns.empty());
  std::mt19937 rng(5);
  for (const Function& f : fns) {
    SCOPED_TRACE(f.name);
    Graph g;
    Node n;
    n.name = "fused";
    n.op_type = f.name;
    n.domain = f.domain;
    n.inputs = f.inputs;
    n.outputs = f.outputs;
    // MaxPoolGrad carries MaxPool's attributes (its body reads them by reference): overlapping windows with
    // asymmetric padding, so the body's scatter must add. X [2, 3, 7, 6] pools to dY [2, 3, 4, 6].
    const bool pool = f.name == "MaxPoolGrad";
    if (pool)
      n.attributes = {{"kernel_shape", std::vector<int64_t>{3, 2}},
                      {"strides", std::vector<int64_t>{2, 1}},
                      {"pads", std::vector<int64_t>{1, 0, 1, 1}}};
    g.nodes.push_back(n);
    // Inputs by name: (dY, Y) for the elementwise-style ops. Y in (0, 1) suits every op: a sigmoid or softmax
    // output, a positive relu output; log-softmax wants Y < 0. LayerNormalizationGrad takes (dY, X, Scale,
    // Mean, InvStdDev) with one statistic per row (InvStdDev positive).
    const bool log_domain = f.name.find("LogSoftmax") != std::string::npos;
    std::map<std::string, Tensor> feeds;
    for (const std::string& in : f.inputs) {
      Tensor t;
      if (in == "Y")
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
      Shape s;
      for (int64_t d : t.shape) s.push_back(Dim::of(d));
      g.inputs.push_back({in, {DType::Float64, s}});
      feeds[in] = std::move(t);
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
