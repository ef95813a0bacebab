// The plan compiler runs the passes the backend registered for the plan's device (executor/plan_pass.h) and knows
// no backend itself: the CPU registers its Transpose folding and step fusion; CUDA and the guarded test device
// register none; a registry that replaces a built-in kernel runs none (the passes assume built-in semantics).
#include <gtest/gtest.h>

#include <cstring>

#include "executor/executor.h"
#include "executor/kernel.h"
#include "executor/plan_pass.h"

namespace onnxtrain {
namespace {

TEST(PlanPasses, TheCpuRegistersItsPassesAndOtherDevicesNone) {
  const KernelRegistry& r = default_kernels();
  const PlanPasses* cpu = r.plan_passes(Device::CPU);
  ASSERT_NE(cpu, nullptr);
  EXPECT_TRUE(cpu->rewrite_nodes);
  EXPECT_TRUE(cpu->fuse_steps);
  EXPECT_EQ(r.plan_passes(Device::CUDA), nullptr);
  EXPECT_EQ(r.plan_passes(Device::Guarded), nullptr);
}

// Writes 10 * x: not what the graph computes, so the output shows that the pass's kernel ran in the plan.
class TimesTen : public Kernel {
 public:
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    for (int64_t i = 0; i < in[0]->numel(); ++i) out[0]->ptr<float>()[i] = 10 * in[0]->ptr<float>()[i];
  }
};

// y = Neg(Neg(x)) under a pass that fuses both steps into TimesTen, and sees the nodes first.
Graph two_negations() {
  Graph g;
  g.inputs = {{"x", {DType::Float32, Shape{Dim::of(3)}}}};
  Node a, b;
  a.name = "first";
  a.op_type = "Neg";
  a.inputs = {"x"};
  a.outputs = {"nx"};
  b.name = "second";
  b.op_type = "Neg";
  b.inputs = {"nx"};
  b.outputs = {"y"};
  g.nodes = {a, b};
  g.outputs = {{"y", {DType::Float32, Shape{Dim::of(3)}}}};
  return g;
}

TEST(PlanPasses, ThePlanRunsARegisteredPassAndTheKernelItFuses) {
  KernelRegistry r = default_kernels();  // a copy: still the built-in kernels, so passes apply
  size_t rewrites = 0, offered = 0;
  PlanPasses p;
  p.rewrite_nodes = [&](std::vector<Node>& nodes, const std::vector<std::string>& keep, const Graph*) {
    ++rewrites;
    EXPECT_EQ(nodes.size(), 2u);
    EXPECT_EQ(keep, std::vector<std::string>{"y"});
  };
  p.fuse_steps = [&](std::span<const PlannedStep> steps, const std::unordered_set<const Tensor*>&) {
    offered = steps.size();
    std::vector<FusedSteps> out(1);
    out[0].steps = {0, 1};
    out[0].kernel = std::make_unique<TimesTen>();
    out[0].in = {steps[0].in[0]};
    out[0].out = {steps[1].out[0]};
    out[0].step = "both negations";
    out[0].op = "times ten";
    return out;
  };
  r.set_plan_passes(Device::CPU, std::move(p));
  ExecutorOptions opts;
  opts.registry = &r;
  opts.profile = true;
  Executor ex(two_negations(), {{"", 17}}, std::make_shared<TensorStore>(), opts);
  std::vector<Tensor> y = ex.run({{"x", Tensor::from_vector<float>({3}, {1, -2, 3})}});
  EXPECT_EQ(rewrites, 1u);
  EXPECT_EQ(offered, 2u);
  ASSERT_EQ(y.size(), 1u);
  EXPECT_EQ(y[0].ptr<float>()[0], 10);
  EXPECT_EQ(y[0].ptr<float>()[1], -20);
  EXPECT_EQ(y[0].ptr<float>()[2], 30);
  bool named = false;
  for (const StepTime& t : ex.profile()) named = named || (t.step == "both negations" && t.op == "times ten");
  EXPECT_TRUE(named) << "the profiler reports the fused step by the pass's names";

  // The same graph on a registry that replaced a built-in kernel: no pass runs, the graph runs as written.
  KernelRegistry replaced = r;
  const KernelDef* neg = default_kernels().find("", "Neg", 17, Device::CPU, DType::Float32);
  ASSERT_NE(neg, nullptr);
  replaced.add(*neg);
  rewrites = offered = 0;
  ExecutorOptions plain;
  plain.registry = &replaced;
  Executor as_written(two_negations(), {{"", 17}}, std::make_shared<TensorStore>(), plain);
  std::vector<Tensor> z = as_written.run({{"x", Tensor::from_vector<float>({3}, {1, -2, 3})}});
  EXPECT_EQ(rewrites, 0u);
  EXPECT_EQ(offered, 0u);
  EXPECT_EQ(z[0].ptr<float>()[1], -2);
}

}  // namespace
}  // namespace onnxtrain
