// Step profiling (PlanSpec::profile, docs/performance.md "Profiling a step"): every step of every run is counted
// and timed under the name of its node, fused elementwise steps under the ops they run, plans for other shapes
// add up per step, and with profiling off nothing is recorded.
#include <gtest/gtest.h>

#include <random>

#include "common/node.h"
#include "executor/executor.h"

namespace onnxtrain {
namespace {

using test::node;

// y = gelu(x @ w + b): a product, then a six-node elementwise chain the plan fuses into one step.
Graph product_then_gelu() {
  Graph g;
  g.inputs = {{"x", {DType::Float32, Shape{Dim::sym("N"), Dim::of(8)}}}};
  g.outputs = {{"y", {DType::Float32, std::nullopt}}};
  g.nodes = {node("MatMul", {"x", "w"}, {"h"}),         node("Add", {"h", "b"}, {"z"}),  node("Div", {"z", "sqrt2"}, {"zs"}),
             node("Erf", {"zs"}, {"e"}),                  node("Add", {"e", "one"}, {"e1"}), node("Mul", {"z", "e1"}, {"ze"}),
             node("Mul", {"ze", "half"}, {"y"})};
  return g;
}

std::shared_ptr<TensorStore> weights() {
  auto store = std::make_shared<TensorStore>();
  std::mt19937 rng(4);
  std::normal_distribution<float> nd;
  std::vector<float> w(8 * 16), b(16);
  for (float& v : w) v = nd(rng);
  for (float& v : b) v = nd(rng);
  (*store)["w"] = Tensor::from_vector<float>({8, 16}, w);
  (*store)["b"] = Tensor::from_vector<float>({16}, b);
  (*store)["sqrt2"] = Tensor::from_vector<float>({}, {1.41421356f});
  (*store)["one"] = Tensor::from_vector<float>({}, {1.0f});
  (*store)["half"] = Tensor::from_vector<float>({}, {0.5f});
  return store;
}

Tensor rows(int64_t n) {
  std::vector<float> v(static_cast<size_t>(n * 8));
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.01f * static_cast<float>(i);
  return Tensor::from_vector<float>({n, 8}, v);
}

const std::map<std::string, int64_t> kOpsets = {{"", 17}};

TEST(Profile, EveryStepIsCountedUnderItsNodeAndFusedStepsUnderTheirOps) {
  ExecutorOptions o;
  o.profile = true;
  Executor ex(product_then_gelu(), kOpsets, weights(), o);
  for (int i = 0; i < 3; ++i) ex.run({{"x", rows(4)}});
  const std::vector<StepTime> p = ex.last_plan()->profile();
  ASSERT_EQ(p.size(), 2u);  // the product, then the fused chain
  EXPECT_EQ(p[0].step, "node 'h' (MatMul)");
  EXPECT_EQ(p[0].op, "MatMul");
  EXPECT_EQ(p[1].step, "fused 6 ops (Add Div Erf Add Mul Mul) through node 'y' (Mul)");
  EXPECT_EQ(p[1].op, "fused elementwise");
  for (const StepTime& t : p) {
    EXPECT_EQ(t.calls, 3) << t.step;
    EXPECT_GT(t.seconds, 0.0) << t.step;
  }
  const std::string report = format_profile(ex.profile());
  EXPECT_NE(report.find("MatMul (1)"), std::string::npos) << report;
  EXPECT_NE(report.find("fused elementwise (1)"), std::string::npos) << report;
  EXPECT_NE(report.find("node 'h' (MatMul)"), std::string::npos) << report;
}

TEST(Profile, PlansForOtherShapesAddUpPerStep) {
  ExecutorOptions o;
  o.profile = true;
  Executor ex(product_then_gelu(), kOpsets, weights(), o);
  ex.run({{"x", rows(4)}});
  ex.run({{"x", rows(5)}});
  ex.run({{"x", rows(4)}});
  ASSERT_EQ(ex.num_plans(), 2u);
  const std::vector<StepTime> all = ex.profile();
  ASSERT_EQ(all.size(), 2u);
  for (const StepTime& t : all) EXPECT_EQ(t.calls, 3) << t.step;
  EXPECT_GE(all[0].seconds, all[1].seconds);  // most expensive first
}

TEST(Profile, OffRecordsNothing) {
  Executor ex(product_then_gelu(), kOpsets, weights());
  ex.run({{"x", rows(4)}});
  EXPECT_TRUE(ex.last_plan()->profile().empty());
  EXPECT_TRUE(ex.profile().empty());
}

// Checking every value keeps every node as its own step; profiling then times each of them.
TEST(Profile, WithEveryValueCheckedEachNodeIsAStep) {
  ExecutorOptions o;
  o.profile = true;
  o.check_every_value = true;
  Executor ex(product_then_gelu(), kOpsets, weights(), o);
  ex.run({{"x", rows(4)}});
  const std::vector<StepTime> p = ex.last_plan()->profile();
  ASSERT_EQ(p.size(), 7u);
  EXPECT_EQ(p.back().step, "node 'y' (Mul)");
  for (const StepTime& t : p) EXPECT_EQ(t.calls, 1) << t.step;
}

}  // namespace
}  // namespace onnxtrain
