// The execution plan: lifetime-based arena, compile-time folding, the plan cache, and input checks.
#include <gtest/gtest.h>

#include <cmath>

#include "common/node.h"
#include "executor/executor.h"
#include "graph/error.h"

namespace onnxtrain {
namespace {

Shape dims(std::initializer_list<int64_t> d) {
  Shape s;
  for (int64_t v : d) s.push_back(Dim::of(v));
  return s;
}

using test::node;

// x -> Exp -> a -> Neg -> b -> Exp -> c -> Neg -> y: each intermediate dies after its one reader, so the arena
// needs two buffers' worth, not three.
TEST(Plan, ArenaReusesMemoryOfDeadValues) {
  Graph g;
  g.inputs = {{"x", {DType::Float32, Shape{Dim::sym("n")}}}};
  g.outputs = {{"y", {DType::Float32, Shape{Dim::sym("n")}}}};
  g.nodes = {node("Exp", {"x"}, {"a"}), node("Neg", {"a"}, {"b"}), node("Exp", {"b"}, {"c"}), node("Neg", {"c"}, {"y"})};
  // Every node as written: by default the four would fuse into one step (test_elementwise_fusion.cpp).
  ExecutorOptions opts;
  opts.check_every_value = true;
  Executor ex(g, {{"", 17}}, std::make_shared<TensorStore>(), opts);
  Tensor x = Tensor::from_vector<float>({1024}, std::vector<float>(1024, 0.5f));
  Tensor y = ex.run({{"x", x}}).at(0);
  const float want = -std::exp(-std::exp(0.5f));
  EXPECT_NEAR(y.ptr<float>()[7], want, 1e-6);
  const ExecutionPlan* p = ex.last_plan();
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->num_steps(), 4u);
  EXPECT_EQ(p->unplanned_bytes(), 4u * 4096);
  // 'y' is an output and lives to the end; a, b, c share the rest: at most 3 buffers of 4 KiB in flight.
  EXPECT_LE(p->arena_bytes(), 3u * 4096);
  EXPECT_LT(p->arena_bytes(), p->unplanned_bytes());
}

// Shape -> Reshape target arithmetic (as PyTorch exports it) folds away at plan time.
TEST(Plan, ShapeArithmeticFoldsAtCompileTime) {
  Graph g;
  g.inputs = {{"x", {DType::Float32, dims({2, 3, 4})}}};
  g.outputs = {{"y", {DType::Float32, dims({2, 12})}}};
  g.initializers["zero"] = TensorData::from<int64_t>({1}, std::vector<int64_t>{0});
  g.initializers["minus1"] = TensorData::from<int64_t>({1}, std::vector<int64_t>{-1});
  Node gather = node("Gather", {"s", "zero"}, {"batch"});
  g.nodes = {node("Shape", {"x"}, {"s"}), gather, node("Concat", {"batch", "minus1"}, {"target"}),
             node("Reshape", {"x", "target"}, {"r"}), node("Relu", {"r"}, {"y"})};
  g.nodes[2].attributes["axis"] = int64_t{0};
  Executor ex(g, {{"", 17}}, std::make_shared<TensorStore>());
  std::vector<float> v(24);
  for (int i = 0; i < 24; ++i) v[i] = float(i) - 12;
  Tensor y = ex.run({{"x", Tensor::from_vector<float>({2, 3, 4}, v)}}).at(0);
  EXPECT_EQ(y.shape, (std::vector<int64_t>{2, 12}));
  EXPECT_EQ(y.ptr<float>()[0], 0.0f);
  EXPECT_EQ(y.ptr<float>()[23], 11.0f);
  EXPECT_EQ(ex.last_plan()->num_steps(), 2u) << "only Reshape and Relu should remain as steps";
}

TEST(Plan, OnePlanPerShapeSignature) {
  Graph g;
  g.inputs = {{"x", {DType::Float32, Shape{Dim::sym("n"), Dim::of(2)}}}};
  g.outputs = {{"y", {DType::Float32, Shape{Dim::sym("n"), Dim::of(2)}}}};
  g.nodes = {node("Relu", {"x"}, {"y"})};
  Executor ex(g, {{"", 17}}, std::make_shared<TensorStore>());
  Tensor a = Tensor::empty(DType::Float32, {3, 2}), b = Tensor::empty(DType::Float32, {5, 2});
  ex.run({{"x", a}});
  ex.run({{"x", b}});
  ex.run({{"x", a}});
  EXPECT_EQ(ex.num_plans(), 2u);
}

TEST(Plan, BadFeedsAreNamed) {
  Graph g;
  g.inputs = {{"x", {DType::Float32, Shape{Dim::sym("n"), Dim::of(2)}}}};
  g.outputs = {{"y", {DType::Float32, Shape{Dim::sym("n"), Dim::of(2)}}}};
  g.nodes = {node("Relu", {"x"}, {"y"})};
  Executor ex(g, {{"", 17}}, std::make_shared<TensorStore>());
  auto message = [&](const std::map<std::string, Tensor>& feeds) {
    try {
      ex.run(feeds);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({{"x", Tensor::empty(DType::Float64, {3, 2})}}).find("input 'x': expected dtype float32, got float64"), std::string::npos);
  EXPECT_NE(message({{"x", Tensor::empty(DType::Float32, {3, 4})}}).find("input 'x': expected shape [n,2], got [3,4]"), std::string::npos);
  EXPECT_NE(message({}).find("input 'x': missing"), std::string::npos);
  EXPECT_NE(message({{"x", Tensor::empty(DType::Float32, {3, 2})}, {"z", Tensor::empty(DType::Float32, {1})}}).find("input 'z'"), std::string::npos);
}

TEST(Plan, MissingKernelIsNamed) {
  Graph g;
  g.inputs = {{"x", {DType::Float32, dims({2})}}};
  g.outputs = {{"y", {DType::Float32, dims({2})}}};
  g.nodes = {node("Frobnicate", {"x"}, {"y"})};
  Executor ex(g, {{"", 17}}, std::make_shared<TensorStore>());
  try {
    ex.run({{"x", Tensor::empty(DType::Float32, {2})}});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("node 'y' (Frobnicate): no cpu kernel for op 'Frobnicate' at opset 17"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace onnxtrain

namespace onnxtrain {
namespace {

// Reshape, Flatten, Identity and a same-type Cast produce views of their input's buffer: no copy, no memory.
TEST(Plan, ReshapeLikeOpsAreViews) {
  Graph g;
  g.inputs = {{"x", {DType::Float32, dims({4, 6})}}};
  g.outputs = {{"y", {DType::Float32, dims({24})}}};
  g.initializers["flat"] = TensorData::from<int64_t>({1}, std::vector<int64_t>{24});
  Node cast = node("Cast", {"c"}, {"d"});
  cast.attributes["to"] = int64_t{1};
  g.nodes = {node("Exp", {"x"}, {"a"}), node("Reshape", {"a", "flat"}, {"b"}), node("Identity", {"b"}, {"c"}), cast,
             node("Neg", {"d"}, {"y"})};
  Executor ex(g, {{"", 17}}, std::make_shared<TensorStore>());
  std::vector<float> v(24);
  for (int i = 0; i < 24; ++i) v[i] = 0.1f * float(i);
  Tensor y = ex.run({{"x", Tensor::from_vector<float>({4, 6}, v)}}).at(0);
  for (int i = 0; i < 24; ++i) EXPECT_FLOAT_EQ(y.ptr<float>()[i], -std::exp(0.1f * float(i)));
  // 'a' (viewed by b, c, d) and 'y' are the only buffers.
  EXPECT_EQ(ex.last_plan()->arena_bytes(), 2u * 128);
}

}  // namespace
}  // namespace onnxtrain

namespace onnxtrain {
namespace {

// Optimizer-style updates: w_new = w * 2 + x, written back into the state "w" after each run. The plan hands its
// buffer of w_new to the state (ExecutionPlan::hand_over) instead of copying, so the two buffers alternate; a
// state that views memory it does not own gets the bytes copied into that memory instead.
Graph doubling_update() {
  Graph g;
  g.inputs = {{"x", {DType::Float32, dims({4})}}, {"w", {DType::Float32, dims({4})}}};
  g.outputs = {{"s", {DType::Float32, dims({4})}}};
  g.initializers["two"] = TensorData::from<float>({1}, std::vector<float>{2.0f});
  g.initializers["w"] = TensorData::from<float>({4}, std::vector<float>{1, 2, 3, 4});
  g.nodes = {node("Mul", {"w", "two"}, {"w2"}), node("Add", {"w2", "x"}, {"w_new"}), node("Neg", {"w_new"}, {"s"})};
  return g;
}

TEST(Plan, UpdatesHandTheirBufferToTheState) {
  auto store = std::make_shared<TensorStore>();
  ExecutorOptions opts;
  opts.updates = {{"w_new", "w"}};
  Executor ex(doubling_update(), {{"", 17}}, store, opts);
  const Tensor x = Tensor::from_vector<float>({4}, std::vector<float>{1, 1, 1, 1});
  const void* first = store->at("w").data;
  ex.run({{"x", x}});
  const void* second = store->at("w").data;
  EXPECT_NE(second, first) << "the new value should have been handed over, not copied";
  EXPECT_EQ(store->at("w").span<float>()[3], 9.0f);  // 4 * 2 + 1
  ex.run({{"x", x}});
  EXPECT_EQ(store->at("w").data, first) << "the buffers alternate";
  EXPECT_EQ(store->at("w").span<float>()[3], 19.0f);
  ex.run({{"x", x}});
  EXPECT_EQ(store->at("w").span<float>()[0], 2.0f * (2.0f * (2.0f * 1 + 1) + 1) + 1);

  // A view state (memory owned by the caller, like a bound buffer) keeps its memory and receives copies.
  auto viewed = std::make_shared<TensorStore>();
  std::vector<float> mine = {1, 2, 3, 4};
  (*viewed)["w"] = Tensor::view(DType::Float32, {4}, mine.data());
  Executor ex2(doubling_update(), {{"", 17}}, viewed, opts);
  ex2.run({{"x", x}});
  ex2.run({{"x", x}});
  EXPECT_EQ(viewed->at("w").data, mine.data());
  EXPECT_EQ(mine[3], 19.0f);
}

}  // namespace
}  // namespace onnxtrain
