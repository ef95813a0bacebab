// GraphBuilder: fresh names that never collide with anything already in the graph.
#include <gtest/gtest.h>

#include <set>

#include "graph/builder.h"
#include "graph/error.h"
#include "graph/graph_test_util.h"
#include "graph/model_io.h"
#include "graph/validate.h"

namespace onnxtrain {
namespace {

Graph seeded_graph() {
  Graph g;
  g.name = "g";
  g.inputs.push_back({"x", {DType::Float32, Shape{Dim::sym("batch"), Dim::of(3)}}});
  g.initializers["const"] = TensorData::scalar<float>(1.0f);
  Node a;
  a.name = "Add_2";  // a node name that looks like a generated value name
  a.op_type = "Add";
  a.inputs = {"x", "const"};
  a.outputs = {"Add"};
  g.nodes.push_back(a);
  Node b;
  b.name = "relu";
  b.op_type = "Relu";
  b.inputs = {"Add"};
  b.outputs = {"Add_1"};
  g.nodes.push_back(b);
  g.outputs.push_back({"y_declared_only", {}});
  return g;
}

// Node names and value names together: the builder keeps them in one namespace.
std::vector<std::string> all_names(const Graph& g) {
  std::vector<std::string> names;
  for (const auto& n : g.nodes) {
    names.push_back(n.name);
    for (const auto& o : n.outputs) names.push_back(o);
  }
  return names;
}

TEST(GraphBuilder, UniqueNameSkipsEveryExistingName) {
  Graph g = seeded_graph();
  GraphBuilder b(g);
  EXPECT_EQ(b.unique_name("Add"), "Add_3");  // Add, Add_1 are values, Add_2 a node name
  EXPECT_EQ(b.unique_name("Add"), "Add_4");
  EXPECT_EQ(b.unique_name("x"), "x_1");
  EXPECT_EQ(b.unique_name("const"), "const_1");
  EXPECT_EQ(b.unique_name("y_declared_only"), "y_declared_only_1");
  EXPECT_EQ(b.unique_name("relu"), "relu_1");
  EXPECT_EQ(b.unique_name("fresh"), "fresh");
}

TEST(GraphBuilder, PrefixGoesBeforeEveryGeneratedName) {
  Graph g = seeded_graph();
  GraphBuilder b(g, "grad/");
  EXPECT_EQ(b.unique_name("Add"), "grad/Add");
  EXPECT_EQ(b.unique_name("Add"), "grad/Add_1");
  auto outs = b.add_node("Mul", {"x", "x"});
  ASSERT_EQ(outs.size(), 1u);
  EXPECT_EQ(outs[0].rfind("grad/", 0), 0u);
  EXPECT_EQ(g.nodes.back().name.rfind("grad/", 0), 0u);
}

TEST(GraphBuilder, ManyNodesNeverCollide) {
  Graph g = seeded_graph();
  const std::set<std::string> before = [&] {
    auto v = all_names(g);
    return std::set<std::string>(v.begin(), v.end());
  }();
  {
    GraphBuilder b(g);
    std::string prev = "Add_1";
    for (int i = 0; i < 150; ++i) {
      const char* op = (i % 3 == 0) ? "Add" : (i % 3 == 1) ? "Relu" : "Split";
      if (i % 3 == 2) {
        auto outs = b.add_node(op, {prev}, 2, {{"axis", int64_t{0}}});
        ASSERT_EQ(outs.size(), 2u);
        prev = outs[1];
      } else {
        prev = b.add(op, {prev, "x"});
      }
      if (i % 10 == 0) prev = b.add("Add", {prev, b.constant(TensorData::scalar<float>(2.0f))});
    }
    b.add_output(prev, {DType::Float32, std::nullopt});
  }
  {
    // A second builder over the same graph must see the first one's names.
    GraphBuilder b2(g);
    for (int i = 0; i < 20; ++i) b2.add("Add", {"x", "x"});
  }
  const auto names = all_names(g);
  std::set<std::string> unique;
  for (const auto& n : names) {
    EXPECT_FALSE(n.empty());
    EXPECT_TRUE(unique.insert(n).second) << "name used twice: " << n;
  }
  // The builder added names only; every pre-existing one is still there exactly once.
  for (const auto& n : before) EXPECT_EQ(std::count(names.begin(), names.end(), n), 1) << n;
  g.outputs.erase(g.outputs.begin());  // declared only to reserve its name
  EXPECT_NO_THROW(check_graph(g, "built"));
}

TEST(GraphBuilder, SubgraphNamesAreReserved) {
  Graph g = seeded_graph();
  auto body = std::make_shared<Graph>();
  Node inner;
  inner.name = "Relu";
  inner.op_type = "Relu";
  inner.inputs = {"x"};
  inner.outputs = {"Relu_out"};
  body->nodes.push_back(inner);
  Node iff;
  iff.name = "if";
  iff.op_type = "If";
  iff.inputs = {"x"};
  iff.outputs = {"z"};
  iff.attributes["then_branch"] = body;
  g.nodes.push_back(iff);
  GraphBuilder b(g);
  const std::string out = b.add("Relu", {"x"});
  EXPECT_NE(g.nodes.back().name, "Relu");
  EXPECT_NE(out, "Relu_out");
}

TEST(GraphBuilder, ConstantEmitsATypedConstantNode) {
  Graph g = seeded_graph();
  GraphBuilder b(g);
  const std::string c = b.constant(TensorData::from<int64_t>({2}, std::vector<int64_t>{4, 5}), "shape");
  EXPECT_EQ(c, "shape");
  const Node& n = g.nodes.back();
  EXPECT_EQ(n.op_type, "Constant");
  EXPECT_EQ(n.inputs.size(), 0u);
  EXPECT_EQ(n.outputs, (std::vector<std::string>{"shape"}));
  ASSERT_NE(n.attr_tensor("value"), nullptr);
  EXPECT_EQ(n.attr_tensor("value")->as<int64_t>()[1], 5);
  ASSERT_NE(g.type_of("shape"), nullptr);
  EXPECT_EQ(g.type_of("shape")->dtype, DType::Int64);
  EXPECT_EQ(*g.type_of("shape")->shape, (Shape{Dim::of(2)}));
  EXPECT_EQ(b.constant(TensorData::scalar<float>(1.0f), "shape"), "shape_1");
}

TEST(GraphBuilder, GivenOutputsAndInputsOutputsAreRecorded) {
  Graph g;
  g.name = "empty";
  GraphBuilder b(g);
  b.add_input("in", {DType::Float32, Shape{Dim::of(4)}});
  auto outs = b.add_node("TopK", {"in", b.constant(TensorData::from<int64_t>({1}, std::vector<int64_t>{2}), "k")}, 2,
                         {}, {}, {"vals", "idx"});
  EXPECT_EQ(outs, (std::vector<std::string>{"vals", "idx"}));
  b.add_output("vals", {DType::Float32, Shape{Dim::of(2)}});
  EXPECT_EQ(g.inputs.size(), 1u);
  EXPECT_EQ(g.outputs.size(), 1u);
  EXPECT_EQ(b.unique_name("vals"), "vals_1");
  EXPECT_EQ(b.unique_name("in"), "in_1");
  // The built graph is a valid ONNX model.
  Model m;
  m.opset_imports[""] = 17;
  m.graph = g;
  EXPECT_NO_THROW(validate_model(m, "built"));
}

}  // namespace
}  // namespace onnxtrain
