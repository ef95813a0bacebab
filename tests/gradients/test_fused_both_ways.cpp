// Every fused gradient op must compute the same through its native kernel and through its standard-ONNX
// function body (inlined), so that another runtime running our graphs gets our numbers.
#include <gtest/gtest.h>

#include <random>

#include "executor/executor.h"
#include "gradients/fused.h"

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
    n.inputs = {"dY", "Y"};
    n.outputs = {"dX"};
    g.nodes.push_back(n);
    const Shape s{Dim::of(3), Dim::of(5)};
    g.inputs = {{"dY", {DType::Float64, s}}, {"Y", {DType::Float64, s}}};
    g.outputs = {{"dX", {DType::Float64, s}}};
    // Y in (0, 1) suits every op: a sigmoid or softmax output, a positive relu output; log-softmax wants Y < 0.
    const bool log_domain = f.name.find("LogSoftmax") != std::string::npos;
    Tensor dy = random_tensor({3, 5}, rng, -1, 1);
    Tensor y = log_domain ? random_tensor({3, 5}, rng, -3, -0.1) : random_tensor({3, 5}, rng, -0.5, 1);
    const std::map<std::string, int64_t> opsets{{"", 17}, {f.domain, 1}};
    ExecutorOptions native, body;
    native.functions = body.functions = fns;
    body.prefer_function_bodies = true;
    Executor a(g, opsets, std::make_shared<TensorStore>(), native);
    Executor b(g, opsets, std::make_shared<TensorStore>(), body);
    ASSERT_EQ(a.graph().nodes.size(), 1u) << "the native run must not inline";
    ASSERT_GT(b.graph().nodes.size(), 1u) << "the body run must inline";
    Tensor ra = a.run({{"dY", dy}, {"Y", y}}).at(0);
    Tensor rb = b.run({{"dY", dy}, {"Y", y}}).at(0);
    for (int64_t i = 0; i < ra.numel(); ++i) EXPECT_NEAR(ra.ptr<double>()[i], rb.ptr<double>()[i], 1e-12) << i;
  }
}

}  // namespace
}  // namespace onnxtrain
