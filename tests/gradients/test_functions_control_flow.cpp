// Graph structures the per-op table cannot express:
// - a call site of a model-local function is differentiated through the function's body (given
//   GradientRequest::functions), and without the functions the error names the node and its op;
// - If, Scan and Loop are differentiated, also where the trainable tensor is only read by a subgraph (the
//   gradient checks against central differences are in test_control_flow_gradients.cpp);
// - a Loop that its condition ends early gets the gradient of the iterations that ran.
#include <gtest/gtest.h>

#include <cmath>

#include "executor/executor.h"
#include "gradients/builder.h"
#include "graph/error.h"
#include "graph/shape_inference.h"

namespace onnxtrain {
namespace {

Node node(std::string name, std::string op, std::vector<std::string> in, std::vector<std::string> out,
          std::string domain = {}) {
  Node n;
  n.name = std::move(name);
  n.op_type = std::move(op);
  n.inputs = std::move(in);
  n.outputs = std::move(out);
  n.domain = std::move(domain);
  return n;
}

TypeInfo f64(std::vector<int64_t> dims) {
  Shape s;
  for (int64_t d : dims) s.push_back(Dim::of(d));
  return {DType::Float64, s};
}

// y = sum(ScaledTanh(X, W)), ScaledTanh(x, w) = tanh(x) * w a function of domain "mylib".
Model scaled_tanh_model() {
  Model m;
  m.opset_imports = {{"", 17}, {"mylib", 1}, {"onnxtrain", 1}};
  Function f;
  f.name = "ScaledTanh";
  f.domain = "mylib";
  f.inputs = {"x", "w"};
  f.outputs = {"y"};
  f.opset_imports = {{"", 17}};
  f.nodes = {node("t", "Tanh", {"x"}, {"t"}), node("y", "Mul", {"t", "w"}, {"y"})};
  m.functions = {f};
  Graph& g = m.graph;
  g.inputs.push_back({"X", f64({2, 3})});
  g.inputs.push_back({"W", f64({3})});
  g.nodes.push_back(node("call", "ScaledTanh", {"X", "W"}, {"Y"}, "mylib"));
  g.nodes.push_back(node("total", "ReduceSum", {"Y"}, {"L"}));
  g.nodes.back().attributes["keepdims"] = int64_t{0};
  g.outputs.push_back({"L", f64({})});
  infer_shapes(m);
  return m;
}

TEST(ModelLocalFunctions, CallSiteIsDifferentiatedThroughTheBody) {
  Model m = scaled_tanh_model();
  Graph& g = m.graph;
  GraphBuilder b(g, "seed/");
  Expr seed = scalar(b, DType::Float64, 1.0);
  GradientRequest req;
  req.wrt = {"X", "W"};
  req.outputs = {"L"};
  req.output_grads = {seed.name};
  req.functions = m.functions;
  GradientResult r = build_gradients(g, m.opset_imports, req);
  for (const Node& n : g.nodes) EXPECT_NE(n.op_type, "ScaledTanh") << "the call site is inlined";
  g.outputs.push_back({r.grads.at("X"), f64({2, 3})});
  g.outputs.push_back({r.grads.at("W"), f64({3})});
  Executor ex(g, m.opset_imports, std::make_shared<TensorStore>());
  Tensor x = Tensor::empty(DType::Float64, {2, 3}), w = Tensor::empty(DType::Float64, {3});
  for (int i = 0; i < 6; ++i) x.ptr<double>()[i] = 0.3 * i - 0.8;
  for (int i = 0; i < 3; ++i) w.ptr<double>()[i] = 1.5 - i;
  std::vector<Tensor> out = ex.run({{"X", x}, {"W", w}});
  ASSERT_EQ(out.size(), 3u);
  // dL/dX = w * (1 - tanh(x)^2); dL/dW = sum over rows of tanh(x).
  for (int i = 0; i < 6; ++i) {
    const double t = std::tanh(x.ptr<double>()[i]);
    EXPECT_NEAR(out[1].ptr<double>()[i], w.ptr<double>()[i % 3] * (1 - t * t), 1e-12) << i;
  }
  for (int j = 0; j < 3; ++j)
    EXPECT_NEAR(out[2].ptr<double>()[j], std::tanh(x.ptr<double>()[j]) + std::tanh(x.ptr<double>()[3 + j]), 1e-12);
}

// The message of the Error build_gradients throws for this request (fails the test when it does not throw).
std::string gradient_error(Graph g, const std::map<std::string, int64_t>& opsets, std::vector<std::string> wrt,
                           const std::string& output) {
  GraphBuilder b(g, "seed/");
  Expr seed = scalar(b, DType::Float64, 1.0);
  GradientRequest req;
  req.wrt = std::move(wrt);
  req.outputs = {output};
  req.output_grads = {seed.name};
  try {
    build_gradients(g, opsets, req);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "build_gradients did not fail";
  return {};
}

TEST(ModelLocalFunctions, WithoutTheFunctionsTheErrorNamesNodeAndOp) {
  Model m = scaled_tanh_model();
  const std::string e = gradient_error(m.graph, m.opset_imports, {"W"}, "L");
  EXPECT_NE(e.find("'call'"), std::string::npos) << e;
  EXPECT_NE(e.find("ScaledTanh"), std::string::npos) << e;
}

// L = ReduceSum(v) as the graph's output.
void add_sum_loss(Graph& g, const std::string& v) {
  g.nodes.push_back(node("total", "ReduceSum", {v}, {"L"}));
  g.nodes.back().attributes["keepdims"] = int64_t{0};
  g.value_info["L"] = f64({});
  g.outputs.push_back({"L", f64({})});
}

std::shared_ptr<Graph> branch(const std::string& out, Node n) {
  auto g = std::make_shared<Graph>();
  g->nodes.push_back(std::move(n));
  g->outputs.push_back({out, f64({3})});
  return g;
}

// If(cond) then -W else W: W is read only by the branches (an outer-scope read), not an input of the If.
Graph if_graph() {
  Graph g;
  g.inputs.push_back({"W", f64({3})});
  g.inputs.push_back({"cond", {DType::Bool, Shape{}}});
  Node n = node("choose", "If", {"cond"}, {"Y"});
  n.attributes["then_branch"] = branch("then_out", node("then_y", "Neg", {"W"}, {"then_out"}));
  n.attributes["else_branch"] = branch("else_out", node("else_y", "Identity", {"W"}, {"else_out"}));
  g.nodes.push_back(n);
  g.value_info["Y"] = f64({3});
  add_sum_loss(g, "Y");
  return g;
}

TEST(ControlFlow, IfReadingATrainableOnlyInItsBranchesGetsItsGradient) {
  // d sum(Y) / dW is -1 through the then branch (-W) and +1 through the else branch (W): never a silent zero.
  for (bool cond : {true, false}) {
    Graph g = if_graph();
    GraphBuilder b(g, "seed/");
    Expr seed = scalar(b, DType::Float64, 1.0);
    GradientRequest req;
    req.wrt = {"W"};
    req.outputs = {"L"};
    req.output_grads = {seed.name};
    GradientResult r = build_gradients(g, {{"", 17}, {"onnxtrain", 1}}, req);
    g.outputs.push_back({r.grads.at("W"), f64({3})});
    Executor ex(g, {{"", 17}, {"onnxtrain", 1}}, std::make_shared<TensorStore>());
    Tensor c = Tensor::empty(DType::Bool, {});
    *c.ptr<bool>() = cond;
    std::vector<Tensor> out = ex.run({{"cond", c}, {"W", Tensor::from_vector<double>({3}, {0.5, -1.0, 2.0})}});
    ASSERT_EQ(out.size(), 2u);
    for (int j = 0; j < 3; ++j) EXPECT_EQ(out[1].ptr<double>()[j], cond ? -1.0 : 1.0) << j;
  }
}

TEST(ControlFlow, LoopEndedEarlyByItsConditionGetsTheGradientOfTheIterationsThatRan) {
  // Loop(M, go, W): body (i, c, w) -> (i < 0, -w): with a cond input the body's condition ends the loop after one
  // of its M = 2 iterations, which is only known at run time. Y = -W, so dsum(Y)/dW is all -1; had the gradient
  // assumed M iterations it would be +1.
  Graph g;
  g.inputs.push_back({"W", f64({3})});
  g.initializers["M"] = TensorData::scalar<int64_t>(2);
  g.initializers["go"] = TensorData::scalar<bool>(true);
  auto body = std::make_shared<Graph>();
  body->inputs = {{"i", {DType::Int64, Shape{}}}, {"c", {DType::Bool, Shape{}}}, {"w", f64({3})}};
  body->initializers["zero"] = TensorData::scalar<int64_t>(0);
  body->nodes = {node("early", "Less", {"i", "zero"}, {"c_out"}), node("step", "Neg", {"w"}, {"w_out"})};
  body->outputs = {{"c_out", {DType::Bool, Shape{}}}, {"w_out", f64({3})}};
  Node loop = node("repeat", "Loop", {"M", "go", "W"}, {"Y"});
  loop.attributes["body"] = body;
  g.nodes.push_back(loop);
  g.value_info["Y"] = f64({3});
  add_sum_loss(g, "Y");
  GraphBuilder sb(g, "seed/");
  Expr seed = scalar(sb, DType::Float64, 1.0);
  GradientRequest req;
  req.wrt = {"W"};
  req.outputs = {"L"};
  req.output_grads = {seed.name};
  GradientResult r = build_gradients(g, {{"", 17}, {"onnxtrain", 1}}, req);
  g.outputs.push_back({r.grads.at("W"), f64({3})});
  Executor ex(g, {{"", 17}, {"onnxtrain", 1}}, std::make_shared<TensorStore>());
  std::vector<Tensor> out = ex.run({{"W", Tensor::from_vector<double>({3}, {0.5, -1.0, 2.0})}});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].ptr<double>()[0], -1.5) << "one iteration ran: L = sum(-W)";
  for (int j = 0; j < 3; ++j) EXPECT_EQ(out[1].ptr<double>()[j], -1.0) << j;
}

TEST(ControlFlow, ScanOverATrainableSequenceGetsItsGradient) {
  // Scan over W's rows: body (s, row) -> (s + row, row); S = S0 + the sum of W's rows, so dsum(S)/dW is all ones.
  Graph g;
  g.inputs.push_back({"W", f64({2, 3})});
  g.inputs.push_back({"S0", f64({3})});
  auto body = std::make_shared<Graph>();
  body->inputs = {{"s", f64({3})}, {"row", f64({3})}};
  body->nodes = {node("acc", "Add", {"s", "row"}, {"s_out"}), node("emit", "Identity", {"row"}, {"row_out"})};
  body->outputs = {{"s_out", f64({3})}, {"row_out", f64({3})}};
  Node scan = node("accumulate", "Scan", {"S0", "W"}, {"S", "rows"});
  scan.attributes["body"] = body;
  scan.attributes["num_scan_inputs"] = int64_t{1};
  g.nodes.push_back(scan);
  g.value_info["S"] = f64({3});
  g.value_info["rows"] = f64({2, 3});
  add_sum_loss(g, "S");
  GraphBuilder b(g, "seed/");
  Expr seed = scalar(b, DType::Float64, 1.0);
  GradientRequest req;
  req.wrt = {"W"};
  req.outputs = {"L"};
  req.output_grads = {seed.name};
  GradientResult r = build_gradients(g, {{"", 17}, {"onnxtrain", 1}}, req);
  g.outputs.push_back({r.grads.at("W"), f64({2, 3})});
  Executor ex(g, {{"", 17}, {"onnxtrain", 1}}, std::make_shared<TensorStore>());
  std::vector<Tensor> out = ex.run({{"W", Tensor::from_vector<double>({2, 3}, {1, 2, 3, 4, 5, 6})},
                                    {"S0", Tensor::from_vector<double>({3}, {0, 0, 0})}});
  ASSERT_EQ(out.size(), 2u);
  for (int j = 0; j < 6; ++j) EXPECT_EQ(out[1].ptr<double>()[j], 1.0) << j;
}

}  // namespace
}  // namespace onnxtrain
