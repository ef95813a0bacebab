// Structural checks and topological ordering on graphs built in memory.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

#include "graph/error.h"
#include "graph/graph_test_util.h"
#include "graph/validate.h"

namespace onnxtrain {
namespace {

using test::expect_error;

Node node(std::string name, std::string op, std::vector<std::string> in, std::vector<std::string> out) {
  Node n;
  n.name = std::move(name);
  n.op_type = std::move(op);
  n.inputs = std::move(in);
  n.outputs = std::move(out);
  return n;
}

Graph base_graph() {
  Graph g;
  g.name = "g";
  g.inputs.push_back({"x", {DType::Float32, Shape{Dim::of(2)}}});
  g.initializers["w"] = TensorData::from<float>({2}, std::vector<float>{1, 2});
  return g;
}

// Every input is a graph input, initializer or output of an earlier node.
bool is_topological(const Graph& g) {
  std::set<std::string> have{"x", "w"};
  for (const auto& n : g.nodes) {
    for (const auto& i : n.inputs)
      if (!i.empty() && !have.count(i)) return false;
    for (const auto& o : n.outputs) have.insert(o);
  }
  return true;
}

TEST(CheckGraph, AcceptsAValidGraphWithOptionalInputs) {
  Graph g = base_graph();
  g.nodes.push_back(node("a", "Add", {"x", "w"}, {"a"}));
  g.nodes.push_back(node("clip", "Clip", {"a", "", "w"}, {"y"}));
  g.outputs.push_back({"y", {}});
  EXPECT_NO_THROW(check_graph(g, "src"));
}

TEST(CheckGraph, CycleNamesTheNodesAndValues) {
  Graph g = base_graph();
  g.nodes.push_back(node("first", "Add", {"x", "v2"}, {"v1"}));
  g.nodes.push_back(node("second", "Relu", {"v1"}, {"v2"}));
  g.outputs.push_back({"v2", {}});
  expect_error([&] { check_graph(g, "cyclic.onnx"); },
               {"cyclic.onnx", "cycle", "node 'first' (Add)", "node 'second' (Relu)", "'v1'", "'v2'"});
  expect_error([&] { topological_order(g); }, {"cycle", "'first'", "'second'"});
}

TEST(CheckGraph, SelfLoopIsACycle) {
  Graph g = base_graph();
  g.nodes.push_back(node("loop", "Add", {"x", "s"}, {"s"}));
  expect_error([&] { check_graph(g, "src"); }, {"cycle", "node 'loop' (Add) reads 's'"});
}

TEST(CheckGraph, UndefinedInputNamesNodeAndValue) {
  Graph g = base_graph();
  g.nodes.push_back(node("mul", "Mul", {"x", "ghost"}, {"y"}));
  g.outputs.push_back({"y", {}});
  expect_error([&] { check_graph(g, "src"); }, {"src", "node 'mul' (Mul)", "input 'ghost'", "not produced"});
  expect_error([&] { topological_order(g); }, {"node 'mul' (Mul)", "'ghost'"});
  // Visible from an enclosing graph: fine.
  EXPECT_NO_THROW(topological_order(g, {"ghost"}));
}

TEST(CheckGraph, UnnamedNodeWithoutOutputsIsNamedByPosition) {
  Graph g = base_graph();
  g.nodes.push_back(node("", "Print", {"nowhere"}, {}));
  expect_error([&] { check_graph(g, "src"); }, {"node #0 (Print)", "'nowhere'"});
}

TEST(CheckGraph, TwoProducersAndShadowedInputs) {
  Graph g = base_graph();
  g.nodes.push_back(node("p1", "Relu", {"x"}, {"v"}));
  g.nodes.push_back(node("p2", "Neg", {"x"}, {"v"}));
  expect_error([&] { check_graph(g, "src"); }, {"src", "'v'", "node 'p1' (Relu)", "node 'p2' (Neg)"});
  Graph h = base_graph();
  h.nodes.push_back(node("over", "Relu", {"x"}, {"w"}));
  expect_error([&] { check_graph(h, "src"); }, {"node 'over' (Relu)", "'w'", "initializer"});
}

TEST(CheckGraph, OutputNotProducedAndOutOfOrder) {
  Graph g = base_graph();
  g.nodes.push_back(node("a", "Relu", {"x"}, {"a"}));
  g.outputs.push_back({"missing", {}});
  expect_error([&] { check_graph(g, "src"); }, {"graph output 'missing'"});

  Graph u = base_graph();
  u.nodes.push_back(node("late", "Relu", {"a"}, {"y"}));
  u.nodes.push_back(node("early", "Neg", {"x"}, {"a"}));
  expect_error([&] { check_graph(u, "src"); }, {"node 'late' (Relu)", "'a'", "topological order"});
}

TEST(CheckGraph, SubgraphMayReadOuterValuesDefinedEarlier) {
  Graph g = base_graph();
  auto body = std::make_shared<Graph>();
  body->name = "body";
  body->nodes.push_back(node("inner", "Add", {"a", "w"}, {"t"}));
  body->outputs.push_back({"t", {}});
  g.nodes.push_back(node("a", "Relu", {"x"}, {"a"}));
  Node iff = node("if", "If", {"x"}, {"y"});
  iff.attributes["then_branch"] = body;
  g.nodes.push_back(iff);
  EXPECT_NO_THROW(check_graph(g, "src"));

  auto bad = std::make_shared<Graph>(*body);
  bad->nodes[0].inputs[0] = "phantom";
  g.nodes[1].attributes["then_branch"] = bad;
  expect_error([&] { check_graph(g, "src"); }, {"graph 'body'", "node 'if' (If)", "node 'inner' (Add)", "'phantom'"});
}

TEST(TopologicalOrder, SortedGraphKeepsItsOrder) {
  Graph g = base_graph();
  // Two independent chains interleaved: any valid order would do, but stability keeps this one.
  g.nodes.push_back(node("a1", "Relu", {"x"}, {"a1"}));
  g.nodes.push_back(node("b1", "Neg", {"w"}, {"b1"}));
  g.nodes.push_back(node("a2", "Relu", {"a1"}, {"a2"}));
  g.nodes.push_back(node("b2", "Neg", {"b1"}, {"b2"}));
  g.nodes.push_back(node("j", "Add", {"a2", "b2"}, {"y"}));
  EXPECT_EQ(topological_order(g), (std::vector<size_t>{0, 1, 2, 3, 4}));
}

TEST(TopologicalOrder, ShuffledGraphIsSorted) {
  Graph g = base_graph();
  // A layered DAG: node k reads the outputs of nodes k-1 and k/2 (plus the inputs for the first ones).
  const int n = 40;
  auto name = [](char c, int k) {
    std::string s(1, c);
    s += std::to_string(k);
    return s;
  };
  for (int k = 0; k < n; ++k) {
    std::vector<std::string> in;
    in.push_back(k == 0 ? std::string("x") : name('v', k - 1));
    in.push_back(k < 2 ? std::string("w") : name('v', k / 2));
    g.nodes.push_back(node(name('n', k), "Add", in, {name('v', k)}));
  }
  g.outputs.push_back({name('v', n - 1), {}});
  std::mt19937 rng(7);
  std::shuffle(g.nodes.begin(), g.nodes.end(), rng);
  ASSERT_FALSE(is_topological(g));
  sort_topologically(g);
  ASSERT_EQ(g.nodes.size(), static_cast<size_t>(n));
  EXPECT_TRUE(is_topological(g));
  // This DAG has exactly one topological order (each node needs its predecessor in the chain).
  for (int k = 0; k < n; ++k) EXPECT_EQ(g.nodes[k].name, name('n', k));
  EXPECT_NO_THROW(check_graph(g, "sorted"));
}

}  // namespace
}  // namespace onnxtrain
