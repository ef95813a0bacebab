// If, Loop and Scan kernels beyond the ONNX node tests: values read from the enclosing scope, a Loop that its
// condition ends early, Scan directions and axes, and the refusals where an output's shape would only be known
// at run time (each naming the node).
#include <gtest/gtest.h>

#include <functional>

#include "common/node.h"
#include "executor/executor.h"
#include "graph/error.h"

namespace onnxtrain {
namespace {

using test::named_node;

TypeInfo f32(const std::vector<int64_t>& dims) { return test::static_type(DType::Float32, dims); }

const std::map<std::string, int64_t> kOpsets{{"", 17}};

Tensor boolean(bool v) {
  Tensor t = Tensor::empty(DType::Bool, {});
  *t.ptr<bool>() = v;
  return t;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "did not throw";
  return {};
}

// If(cond) then X + B else X * B, where X is a graph input and B an initializer, both read by the branches only.
Graph if_graph(std::vector<int64_t> else_shape) {
  Graph g;
  g.inputs = {{"cond", {DType::Bool, Shape{}}}, {"X", f32({2})}};
  g.initializers["B"] = Tensor::from_vector<float>({2}, {10, 20}).to_data();
  auto then_b = std::make_shared<Graph>();
  then_b->nodes = {named_node("t", "Add", {"X", "B"}, {"t_y"})};
  then_b->outputs = {{"t_y", f32({2})}};
  auto else_b = std::make_shared<Graph>();
  if (else_shape == std::vector<int64_t>{2}) {
    else_b->nodes = {named_node("e", "Mul", {"X", "B"}, {"e_y"})};
  } else {
    else_b->initializers["e_shape"] = TensorData::from<int64_t>({static_cast<int64_t>(else_shape.size())},
                                                               std::span<const int64_t>(else_shape));
    else_b->nodes = {named_node("e", "Reshape", {"X", "e_shape"}, {"e_y"})};
  }
  else_b->outputs = {{"e_y", f32(else_shape)}};
  Node n = named_node("choose", "If", {"cond"}, {"Y"});
  n.attributes["then_branch"] = then_b;
  n.attributes["else_branch"] = else_b;
  g.nodes.push_back(n);
  g.outputs = {{"Y", {DType::Float32, std::nullopt}}};
  return g;
}

TEST(ControlFlowKernels, IfRunsTheBranchTheConditionPicksWithOuterValues) {
  Executor ex(if_graph({2}), kOpsets, std::make_shared<TensorStore>());
  Tensor x = Tensor::from_vector<float>({2}, {1, 2});
  std::vector<Tensor> t = ex.run({{"cond", boolean(true)}, {"X", x}});
  EXPECT_EQ(t[0].ptr<float>()[0], 11);
  EXPECT_EQ(t[0].ptr<float>()[1], 22);
  std::vector<Tensor> e = ex.run({{"cond", boolean(false)}, {"X", x}});
  EXPECT_EQ(e[0].ptr<float>()[0], 10);
  EXPECT_EQ(e[0].ptr<float>()[1], 40);
}

TEST(ControlFlowKernels, IfWhoseBranchesDisagreeOnShapeIsRefusedNamingTheNode) {
  Executor ex(if_graph({1, 2}), kOpsets, std::make_shared<TensorStore>());
  const std::string e = error_of([&] { ex.run({{"cond", boolean(true)}, {"X", Tensor::from_vector<float>({2}, {1, 2})}}); });
  EXPECT_NE(e.find("node 'choose' (If)"), std::string::npos) << e;
  EXPECT_NE(e.find("would depend on the condition"), std::string::npos) << e;
}

TEST(ControlFlowKernels, IfWithAConstantConditionPlansOnlyTheBranchTaken) {
  Graph g = if_graph({1, 2});
  g.inputs.erase(g.inputs.begin());
  g.initializers["cond"] = TensorData::scalar<bool>(false);
  Executor ex(g, kOpsets, std::make_shared<TensorStore>());
  std::vector<Tensor> r = ex.run({{"X", Tensor::from_vector<float>({2}, {3, 4})}});
  EXPECT_EQ(r[0].shape, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(r[0].ptr<float>()[1], 4);
}

// Loop(M, cond, x): body (i, c, x) -> (i < 2, x * 2): the condition stops it after 3 iterations of at most 10.
Graph doubling_loop(const std::string& cond) {
  Graph g;
  g.inputs = {{"x", f32({1})}};
  g.initializers["M"] = TensorData::scalar<int64_t>(10);
  g.initializers["go"] = TensorData::scalar<bool>(true);
  auto body = std::make_shared<Graph>();
  body->inputs = {{"i", {DType::Int64, Shape{}}}, {"c", {DType::Bool, Shape{}}}, {"v", f32({1})}};
  body->initializers["two"] = TensorData::scalar<int64_t>(2);
  body->initializers["twice"] = TensorData::scalar<float>(2);
  body->nodes = {named_node("more", "Less", {"i", "two"}, {"c_out"}), named_node("dbl", "Mul", {"v", "twice"}, {"v_out"})};
  body->outputs = {{"c_out", {DType::Bool, Shape{}}}, {"v_out", f32({1})}};
  Node n = named_node("repeat", "Loop", {"M", cond, "x"}, {"y"});
  n.attributes["body"] = body;
  g.nodes.push_back(n);
  g.outputs = {{"y", f32({1})}};
  return g;
}

TEST(ControlFlowKernels, LoopStopsWhenItsConditionTurnsFalse) {
  Executor ex(doubling_loop("go"), kOpsets, std::make_shared<TensorStore>());
  EXPECT_EQ(ex.run({{"x", Tensor::from_vector<float>({1}, {1.5f})}})[0].ptr<float>()[0], 1.5f * 8);
}

// Without the cond input ONNX ignores the body's condition ("a for loop"): all M = 10 iterations run.
TEST(ControlFlowKernels, LoopWithoutACondInputRunsItsTripCount) {
  Executor ex(doubling_loop(""), kOpsets, std::make_shared<TensorStore>());
  EXPECT_EQ(ex.run({{"x", Tensor::from_vector<float>({1}, {1.5f})}})[0].ptr<float>()[0], 1.5f * 1024);
}

TEST(ControlFlowKernels, LoopScanOutputWithARunTimeTripCountIsRefusedNamingTheNode) {
  Graph g;
  g.inputs = {{"M", {DType::Int64, Shape{}}}, {"x", f32({1})}};
  auto body = std::make_shared<Graph>();
  body->inputs = {{"i", {DType::Int64, Shape{}}}, {"c", {DType::Bool, Shape{}}}, {"v", f32({1})}};
  body->nodes = {named_node("keep", "Identity", {"c"}, {"c_out"}), named_node("neg", "Neg", {"v"}, {"v_out"}),
                 named_node("emit", "Identity", {"v_out"}, {"y_i"})};
  body->outputs = {{"c_out", {DType::Bool, Shape{}}}, {"v_out", f32({1})}, {"y_i", f32({1})}};
  Node n = named_node("repeat", "Loop", {"M", "", "x"}, {"y", "ys"});
  n.attributes["body"] = body;
  g.nodes.push_back(n);
  g.outputs = {{"y", f32({1})}, {"ys", {DType::Float32, std::nullopt}}};
  Executor ex(g, kOpsets, std::make_shared<TensorStore>());
  Tensor m = Tensor::empty(DType::Int64, {});
  *m.ptr<int64_t>() = 3;
  const std::string e = error_of([&] { ex.run({{"M", m}, {"x", Tensor::from_vector<float>({1}, {1})}}); });
  EXPECT_NE(e.find("node 'repeat' (Loop)"), std::string::npos) << e;
  EXPECT_NE(e.find("scan output"), std::string::npos) << e;
}

// Scan over the columns of X (axis 1), last column first; the running sums stacked on axis 1, last step first:
// the result reads as the suffix sums of each row, in column order.
TEST(ControlFlowKernels, ScanHonoursAxesAndDirections) {
  Graph g;
  g.inputs = {{"s0", f32({2})}, {"X", f32({2, 3})}};
  auto body = std::make_shared<Graph>();
  body->inputs = {{"s", f32({2})}, {"col", f32({2})}};
  body->nodes = {named_node("acc", "Add", {"s", "col"}, {"s_out"}), named_node("emit", "Identity", {"s_out"}, {"y"})};
  body->outputs = {{"s_out", f32({2})}, {"y", f32({2})}};
  Node n = named_node("sweep", "Scan", {"s0", "X"}, {"S", "Ys"});
  n.attributes["body"] = body;
  n.attributes["num_scan_inputs"] = int64_t{1};
  n.attributes["scan_input_axes"] = std::vector<int64_t>{1};
  n.attributes["scan_input_directions"] = std::vector<int64_t>{1};
  n.attributes["scan_output_axes"] = std::vector<int64_t>{-1};
  n.attributes["scan_output_directions"] = std::vector<int64_t>{1};
  g.nodes.push_back(n);
  g.outputs = {{"S", f32({2})}, {"Ys", f32({2, 3})}};
  Executor ex(g, kOpsets, std::make_shared<TensorStore>());
  std::vector<Tensor> r = ex.run({{"s0", Tensor::from_vector<float>({2}, {0, 100})},
                                  {"X", Tensor::from_vector<float>({2, 3}, {1, 2, 3, 4, 5, 6})}});
  EXPECT_EQ(r[0].ptr<float>()[0], 6);
  EXPECT_EQ(r[0].ptr<float>()[1], 115);
  ASSERT_EQ(r[1].shape, (std::vector<int64_t>{2, 3}));
  const std::vector<float> want{6, 5, 3, 115, 111, 106};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(r[1].ptr<float>()[i], want[i]) << i;
}

}  // namespace
}  // namespace onnxtrain
