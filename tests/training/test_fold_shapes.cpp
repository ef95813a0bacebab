// fold_static_shapes (training/fold_shapes.h): the shape arithmetic torch.onnx.export emits for `x.chunk(2, -1)`
// becomes constants, so the Slice gradient rule (which needs constant bounds) applies; dims the model leaves
// symbolic stay at run time; floating-point values computed from constants fold too (torch's Resize scales), up
// to a size bound, but never from a floating-point initializer (a weight); the folded model computes the same thing.
#include <gtest/gtest.h>

#include "graph/shape_inference.h"
#include "training/fold_shapes.h"
#include "training/session.h"
#include "training/yield_test_util.h"

namespace onnxtrain {
namespace {

using namespace test;

TensorData ints(std::vector<int64_t> v) {
  return TensorData::from<int64_t>({static_cast<int64_t>(v.size())}, std::span<const int64_t>(v));
}

// y = first half of x along the last axis, times W, with the bound computed as exporters do:
// half = Unsqueeze(Div(Gather(Shape(x), 1), 2)); y = Slice(x, [0], half, [1]) * W. Also a float value derived
// from the shape (scale = Cast(Gather(Shape(x), 1)) to float), which folds where the dim is known.
Model half_model(Dim batch) {
  Model m;
  m.opset_imports[""] = 17;
  Graph& g = m.graph;
  g.name = "half";
  g.inputs.push_back({"x", TypeInfo{DType::Float32, Shape{batch, Dim::of(6)}}});
  const std::vector<float> w{0.5f, -1.0f, 2.0f};
  g.initializers["W"] = TensorData::from<float>({3}, std::span<const float>(w));
  auto node = [&](std::string op, std::vector<std::string> in, std::string out, std::map<std::string, Attribute> a = {}) {
    Node n;
    n.name = out + "_node";
    n.op_type = std::move(op);
    n.inputs = std::move(in);
    n.outputs = {std::move(out)};
    n.attributes = std::move(a);
    g.nodes.push_back(std::move(n));
  };
  node("Constant", {}, "one", {{"value", TensorData::scalar<int64_t>(1)}});
  node("Constant", {}, "zero", {{"value", TensorData::scalar<int64_t>(0)}});
  node("Constant", {}, "two", {{"value", TensorData::scalar<int64_t>(2)}});
  node("Constant", {}, "axes", {{"value", ints({0})}});
  node("Constant", {}, "starts", {{"value", ints({0})}});
  node("Constant", {}, "slice_axes", {{"value", ints({1})}});
  node("Shape", {"x"}, "shape");
  node("Gather", {"shape", "one"}, "width", {{"axis", int64_t{0}}});
  node("Gather", {"shape", "zero"}, "rows", {{"axis", int64_t{0}}});
  node("Div", {"width", "two"}, "half_scalar");
  node("Unsqueeze", {"half_scalar", "axes"}, "half");
  node("Slice", {"x", "starts", "half", "slice_axes"}, "left");
  node("Mul", {"left", "W"}, "y");
  node("Cast", {"width"}, "scale", {{"to", static_cast<int64_t>(DType::Float32)}});
  node("Cast", {"rows"}, "rows_f", {{"to", static_cast<int64_t>(DType::Float32)}});
  node("Mul", {"y", "scale"}, "y_scaled");
  node("Add", {"y_scaled", "rows_f"}, "out");
  g.outputs.push_back({"out", TypeInfo{DType::Float32, std::nullopt}});
  infer_shapes(m);
  return m;
}

const Node* producer(const Graph& g, const std::string& value) {
  for (const Node& n : g.nodes)
    for (const std::string& o : n.outputs)
      if (o == value) return &n;
  return nullptr;
}

TEST(FoldStaticShapes, ExportedSliceBoundsBecomeConstantsAndTheGradientBuilds) {
  Model m = half_model(Dim::of(4));
  Model folded = m;
  // width, rows, half_scalar, half, the float casts scale and rows_f; plus the Shape itself, whose dims are all known.
  EXPECT_EQ(fold_static_shapes(folded), 7u);
  EXPECT_EQ(producer(folded.graph, "half")->op_type, "Constant");
  EXPECT_EQ(producer(folded.graph, "half")->attr_tensor("value")->as<int64_t>()[0], 3);
  EXPECT_EQ(producer(folded.graph, "scale")->op_type, "Constant");
  EXPECT_EQ(producer(folded.graph, "scale")->attr_tensor("value")->as<float>()[0], 6.0f);
  EXPECT_EQ(producer(folded.graph, "left")->op_type, "Slice");
  const TypeInfo* left = folded.graph.type_of("left");
  ASSERT_TRUE(left && left->shape);
  EXPECT_TRUE((*left->shape)[1].known() && (*left->shape)[1].value == 3) << "shapes were not inferred again";

  // TrainingSession folds too: the Slice rule now sees constant bounds. Same outputs as the unfolded model.
  TrainingSession s(m, {});
  Tensor x = random_tensor<float>(DType::Float32, {4, 6}, 1);
  Executor plain(m.graph, m.opset_imports, std::make_shared<TensorStore>());
  EXPECT_LT(rel_diff<float>(s.infer({{"x", x}}).at(0), plain.run({{"x", x}}).at(0)), 1e-7);
  auto r = s.gradients({{"x", x}, {s.target_name(), random_tensor<float>(DType::Float32, {4, 3}, 2)}});
  EXPECT_GT(max_abs(r.grads.at("W")), 0);
}

TEST(FoldStaticShapes, SymbolicDimsStayRunTimeValues) {
  Model m = half_model(Dim::sym("batch"));
  // width and what follows from it fold (dim 1 is known: half, scale); Shape itself and rows (dim 0) do not.
  EXPECT_EQ(fold_static_shapes(m), 4u);
  EXPECT_EQ(producer(m.graph, "shape")->op_type, "Shape");
  EXPECT_EQ(producer(m.graph, "rows")->op_type, "Gather");
  EXPECT_EQ(producer(m.graph, "rows_f")->op_type, "Cast");
  EXPECT_EQ(producer(m.graph, "half")->op_type, "Constant");
  // Still runs for any batch size.
  TrainingSession s(m, {});
  for (int64_t batch : {2, 5}) {
    Tensor x = random_tensor<float>(DType::Float32, {batch, 6}, 3);
    Tensor y = s.infer({{"x", x}}).at(0);
    ASSERT_EQ(y.shape, (std::vector<int64_t>{batch, 3}));
    EXPECT_FLOAT_EQ(y.ptr<float>()[1], x.ptr<float>()[1] * -1.0f * 6 + float(batch));
  }
}

// torch.onnx.export (opset 17) writes nn.Upsample(scale_factor=2)'s scales as Concat(Constant, Constant) of
// floats. They fold, and shape inference then knows Resize's output dims. A float Concat of more than 4096
// elements stays a run-time value, and so does anything computed from a floating-point initializer.
TEST(FoldStaticShapes, FloatConstantsFoldSoResizeScalesAreKnown) {
  Model m;
  m.opset_imports[""] = 17;
  Graph& g = m.graph;
  g.name = "upsample";
  g.inputs.push_back({"x", TypeInfo{DType::Float32, Shape{Dim::of(1), Dim::of(2), Dim::of(3), Dim::of(4)}}});
  const std::vector<float> w(2, 0.5f);
  g.initializers["W"] = TensorData::from<float>({2}, std::span<const float>(w));
  auto node = [&](std::string op, std::vector<std::string> in, std::string out, std::map<std::string, Attribute> a = {}) {
    Node n;
    n.name = out + "_node";
    n.op_type = std::move(op);
    n.inputs = std::move(in);
    n.outputs = {std::move(out)};
    n.attributes = std::move(a);
    g.nodes.push_back(std::move(n));
  };
  const std::vector<float> ones{1.0f, 1.0f}, twos{2.0f, 2.0f}, big(4100, 1.0f);
  node("Constant", {}, "keep", {{"value", TensorData::from<float>({2}, std::span<const float>(ones))}});
  node("Constant", {}, "double", {{"value", TensorData::from<float>({2}, std::span<const float>(twos))}});
  node("Concat", {"keep", "double"}, "scales", {{"axis", int64_t{0}}});
  node("Resize", {"x", "", "scales"}, "up", {{"mode", std::string("nearest")}});
  node("Constant", {}, "big", {{"value", TensorData::from<float>({4100}, std::span<const float>(big))}});
  node("Concat", {"big", "keep"}, "bigger", {{"axis", int64_t{0}}});
  node("Concat", {"W", "keep"}, "weighted", {{"axis", int64_t{0}}});
  g.outputs.push_back({"up", TypeInfo{DType::Float32, std::nullopt}});
  g.outputs.push_back({"bigger", TypeInfo{DType::Float32, std::nullopt}});
  g.outputs.push_back({"weighted", TypeInfo{DType::Float32, std::nullopt}});
  infer_shapes(m);
  EXPECT_EQ(fold_static_shapes(m), 1u);
  EXPECT_EQ(producer(g, "scales")->op_type, "Constant");
  EXPECT_EQ(producer(g, "bigger")->op_type, "Concat") << "a large float value was folded";
  EXPECT_EQ(producer(g, "weighted")->op_type, "Concat") << "a value computed from a weight was folded";
  const TypeInfo* up = g.type_of("up");
  ASSERT_TRUE(up && up->shape && up->shape->size() == 4);
  for (size_t i = 0; i < 4; ++i) EXPECT_TRUE((*up->shape)[i].known()) << "dim " << i << " of Resize's output";
  EXPECT_EQ((*up->shape)[2].value, 6);
  EXPECT_EQ((*up->shape)[3].value, 8);
}

}  // namespace
}  // namespace onnxtrain
