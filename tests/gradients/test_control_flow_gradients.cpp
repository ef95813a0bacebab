// Gradients through control flow against central differences in float64, on hand-built ONNX models: the
// engine's analytic gradient (build_gradients, run by an Executor) of a scalar objective L, with respect to
// values the control-flow node takes as inputs or that only its subgraphs read from the enclosing scope.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <tuple>

#include "common/node.h"
#include "executor/executor.h"
#include "gradients/builder.h"
#include "graph/error.h"
#include "graph/expr.h"
#include "graph/shape_inference.h"

namespace onnxtrain {
namespace {

using test::named_node;

TypeInfo f64(const std::vector<int64_t>& dims) { return test::static_type(DType::Float64, dims); }

Tensor f64_tensor(std::vector<int64_t> shape, double start, double step) {
  Tensor t = Tensor::empty(DType::Float64, shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.ptr<double>()[i] = start + step * static_cast<double>(i);
  return t;
}

// L = ReduceSum(v * R) for a fixed R of v's shape, so that every element of v weighs differently.
void add_weighted_loss(Graph& g, const std::string& v, std::vector<int64_t> shape) {
  g.initializers["R"] = f64_tensor(shape, 0.7, -0.35).to_data();
  g.nodes.push_back(named_node("weigh", "Mul", {v, "R"}, {"weighted"}));
  g.nodes.push_back(named_node("total", "ReduceSum", {"weighted"}, {"L"}));
  g.nodes.back().attributes["keepdims"] = int64_t{0};
  g.outputs.push_back({"L", f64({})});
}

// L = sum(H * H) + sum(Ys * R) for a fixed R of Ys' shape: both a control-flow node's final state H and its
// stacked scan output Ys carry gradient.
void add_state_and_sequence_loss(Graph& g, const std::vector<int64_t>& ys_shape) {
  g.nodes.push_back(named_node("hh", "Mul", {"H", "H"}, {"HH"}));
  g.nodes.push_back(named_node("hsum", "ReduceSum", {"HH"}, {"Lh"}));
  g.nodes.back().attributes["keepdims"] = int64_t{0};
  g.initializers["R"] = f64_tensor(ys_shape, 0.7, -0.15).to_data();
  g.nodes.push_back(named_node("weigh", "Mul", {"Ys", "R"}, {"weighted"}));
  g.nodes.push_back(named_node("ysum", "ReduceSum", {"weighted"}, {"Ly"}));
  g.nodes.back().attributes["keepdims"] = int64_t{0};
  g.nodes.push_back(named_node("total", "Add", {"Lh", "Ly"}, {"L"}));
  g.outputs.push_back({"L", f64({})});
}

double loss(Executor& ex, const std::map<std::string, Tensor>& feeds) { return ex.run(feeds).at(0).ptr<double>()[0]; }

// The analytic gradients of L with respect to `wrt` (graph inputs among `feeds`), each compared element by
// element with (L(x + h) - L(x - h)) / 2h. Returns the built training graph for structural checks.
Graph expect_gradients_match(Model m, const std::vector<std::string>& wrt, const std::map<std::string, Tensor>& feeds) {
  m.opset_imports.emplace("onnxtrain", 1);
  infer_shapes(m);
  Graph g = m.graph;
  GraphBuilder b(g, "seed/");
  Expr seed = scalar(b, DType::Float64, 1.0);
  GradientRequest req;
  req.wrt = wrt;
  req.outputs = {"L"};
  req.output_grads = {seed.name};
  GradientResult r = build_gradients(g, m.opset_imports, req);
  for (const std::string& w : wrt) g.outputs.push_back({r.grads.at(w), *m.graph.type_of(w)});
  Executor train(g, m.opset_imports, std::make_shared<TensorStore>());
  std::vector<Tensor> got = train.run(feeds);
  Executor forward(m.graph, m.opset_imports, std::make_shared<TensorStore>());
  const double h = 1e-6;
  for (size_t k = 0; k < wrt.size(); ++k) {
    const Tensor& analytic = got.at(1 + k);
    EXPECT_EQ(analytic.numel(), feeds.at(wrt[k]).numel()) << wrt[k];
    if (analytic.numel() != feeds.at(wrt[k]).numel()) continue;
    for (int64_t i = 0; i < analytic.numel(); ++i) {
      std::map<std::string, Tensor> plus = feeds, minus = feeds;
      plus[wrt[k]] = feeds.at(wrt[k]).clone();
      minus[wrt[k]] = feeds.at(wrt[k]).clone();
      plus[wrt[k]].ptr<double>()[i] += h;
      minus[wrt[k]].ptr<double>()[i] -= h;
      const double numeric = (loss(forward, plus) - loss(forward, minus)) / (2 * h);
      EXPECT_NEAR(analytic.ptr<double>()[i], numeric, 1e-6 * (1 + std::abs(numeric))) << wrt[k] << "[" << i << "]";
    }
  }
  return g;
}

Tensor bool_scalar(bool v) {
  Tensor t = Tensor::empty(DType::Bool, {});
  *t.ptr<bool>() = v;
  return t;
}

// Y = If(cond) then tanh(X * W) else sin(W) * X + W, then Z = Y * W outside: W reaches L through both branches
// (read from the enclosing scope, not an input of the If) and directly.
Model if_model() {
  Model m;
  m.opset_imports = {{"", 17}};
  Graph& g = m.graph;
  g.inputs = {{"cond", {DType::Bool, Shape{}}}, {"X", f64({2, 3})}, {"W", f64({3})}};
  auto then_b = std::make_shared<Graph>();
  then_b->name = "then";
  then_b->nodes = {named_node("t_mul", "Mul", {"X", "W"}, {"t_xw"}), named_node("t_tanh", "Tanh", {"t_xw"}, {"t_y"})};
  then_b->outputs = {{"t_y", f64({2, 3})}};
  auto else_b = std::make_shared<Graph>();
  else_b->name = "else";
  else_b->nodes = {named_node("e_sin", "Sin", {"W"}, {"e_s"}), named_node("e_mul", "Mul", {"e_s", "X"}, {"e_sx"}),
                   named_node("e_add", "Add", {"e_sx", "W"}, {"e_y"})};
  else_b->outputs = {{"e_y", f64({2, 3})}};
  Node n = named_node("choose", "If", {"cond"}, {"Y"});
  n.attributes["then_branch"] = then_b;
  n.attributes["else_branch"] = else_b;
  g.nodes.push_back(n);
  g.nodes.push_back(named_node("scale", "Mul", {"Y", "W"}, {"Z"}));
  add_weighted_loss(g, "Z", {2, 3});
  return m;
}

TEST(ControlFlowGradients, IfBothBranchesMatchCentralDifferences) {
  for (bool cond : {true, false}) {
    SCOPED_TRACE(cond ? "then" : "else");
    std::map<std::string, Tensor> feeds{
        {"cond", bool_scalar(cond)}, {"X", f64_tensor({2, 3}, -0.9, 0.31)}, {"W", f64_tensor({3}, 0.4, -0.55)}};
    Graph g = expect_gradients_match(if_model(), {"X", "W"}, feeds);
    // The backward is an If of its own, with the standard single input: the training graph stays ONNX.
    int ifs = 0;
    for (const Node& n : g.nodes)
      if (n.op_type == "If") {
        ++ifs;
        EXPECT_EQ(n.inputs.size(), 1u) << n.describe();
      }
    EXPECT_EQ(ifs, 2);
  }
}

// A branch that returns an enclosing value unchanged (else: W itself) and one that never reads X: the gradient
// of X is zero on the else side, and W's is the seed itself.
TEST(ControlFlowGradients, IfBranchPassingAnOuterValueThrough) {
  Model m;
  m.opset_imports = {{"", 17}};
  Graph& g = m.graph;
  g.inputs = {{"cond", {DType::Bool, Shape{}}}, {"X", f64({3})}, {"W", f64({3})}};
  auto then_b = std::make_shared<Graph>();
  then_b->nodes = {named_node("t_mul", "Mul", {"X", "W"}, {"t_y"})};
  then_b->outputs = {{"t_y", f64({3})}};
  auto else_b = std::make_shared<Graph>();
  else_b->outputs = {{"W", f64({3})}};
  Node n = named_node("choose", "If", {"cond"}, {"Y"});
  n.attributes["then_branch"] = then_b;
  n.attributes["else_branch"] = else_b;
  g.nodes.push_back(n);
  add_weighted_loss(g, "Y", {3});
  for (bool cond : {true, false}) {
    SCOPED_TRACE(cond ? "then" : "else");
    expect_gradients_match(m, {"X", "W"},
                           {{"cond", bool_scalar(cond)}, {"X", f64_tensor({3}, 1.0, 0.5)}, {"W", f64_tensor({3}, -0.2, 0.3)}});
  }
}

// An RNN cell as a Scan: h' = tanh(x_t W + h U + c), y_t = h' * h (so the output reads the incoming state too).
// W, U, c are read by the body from the enclosing scope; h0 is the carried state, X the sequence.
Model rnn_scan_model(int64_t in_axis, int64_t in_dir, int64_t out_axis, int64_t out_dir) {
  Model m;
  m.opset_imports = {{"", 17}};
  Graph& g = m.graph;
  const std::vector<int64_t> x_shape = in_axis == 0 ? std::vector<int64_t>{4, 2} : std::vector<int64_t>{2, 4};
  g.inputs = {{"h0", f64({3})}, {"X", f64(x_shape)}, {"W", f64({2, 3})}, {"U", f64({3, 3})}, {"c", f64({3})}};
  auto body = std::make_shared<Graph>();
  body->name = "cell";
  body->inputs = {{"h", f64({3})}, {"x", f64({2})}};
  body->nodes = {named_node("xw", "MatMul", {"x", "W"}, {"xw"}), named_node("hu", "MatMul", {"h", "U"}, {"hu"}),
                 named_node("pre1", "Add", {"xw", "hu"}, {"pre1"}), named_node("pre", "Add", {"pre1", "c"}, {"pre"}),
                 named_node("act", "Tanh", {"pre"}, {"h_next"}), named_node("emit", "Mul", {"h_next", "h"}, {"y"})};
  body->outputs = {{"h_next", f64({3})}, {"y", f64({3})}};
  Node n = named_node("rnn", "Scan", {"h0", "X"}, {"H", "Ys"});
  n.attributes["body"] = body;
  n.attributes["num_scan_inputs"] = int64_t{1};
  n.attributes["scan_input_axes"] = std::vector<int64_t>{in_axis};
  n.attributes["scan_input_directions"] = std::vector<int64_t>{in_dir};
  n.attributes["scan_output_axes"] = std::vector<int64_t>{out_axis};
  n.attributes["scan_output_directions"] = std::vector<int64_t>{out_dir};
  g.nodes.push_back(n);
  add_state_and_sequence_loss(g, out_axis == 0 ? std::vector<int64_t>{4, 3} : std::vector<int64_t>{3, 4});
  return m;
}

std::map<std::string, Tensor> rnn_feeds(bool x_axis1) {
  return {{"h0", f64_tensor({3}, 0.1, 0.2)},
          {"X", f64_tensor(x_axis1 ? std::vector<int64_t>{2, 4} : std::vector<int64_t>{4, 2}, -0.8, 0.23)},
          {"W", f64_tensor({2, 3}, 0.5, -0.17)},
          {"U", f64_tensor({3, 3}, -0.4, 0.11)},
          {"c", f64_tensor({3}, 0.05, 0.1)}};
}

TEST(ControlFlowGradients, ScanRnnCellMatchesCentralDifferences) {
  Graph g = expect_gradients_match(rnn_scan_model(0, 0, 0, 0), {"h0", "X", "W", "U", "c"}, rnn_feeds(false));
  // The backward is Scan of its own (a recomputing Scan and the reverse one): the training graph stays ONNX.
  int scans = 0;
  for (const Node& n : g.nodes) scans += n.op_type == "Scan";
  EXPECT_EQ(scans, 3);
}

TEST(ControlFlowGradients, ScanReversedDirectionsAndOtherAxesMatchCentralDifferences) {
  expect_gradients_match(rnn_scan_model(1, 1, 1, 0), {"h0", "X", "W", "U", "c"}, rnn_feeds(true));
  expect_gradients_match(rnn_scan_model(0, 0, 1, 1), {"h0", "X", "W", "U", "c"}, rnn_feeds(false));
}

// Loop with a constant trip count, no cond, a carried value and a scan output:
//   h' = tanh(h * W + X),  y_i = h' * i + c  (i the iteration number, cast to float64),
// W, X, c read from the enclosing scope. L = sum(H * H) + sum(Ys * R).
TEST(ControlFlowGradients, LoopWithTripCountCarriedValueAndScanOutputMatchesCentralDifferences) {
  Model m;
  m.opset_imports = {{"", 17}};
  Graph& g = m.graph;
  g.inputs = {{"h0", f64({3})}, {"X", f64({3})}, {"W", f64({3})}, {"c", f64({3})}};
  g.initializers["M"] = TensorData::scalar<int64_t>(3);
  auto body = std::make_shared<Graph>();
  body->inputs = {{"i", {DType::Int64, Shape{}}}, {"cond_in", {DType::Bool, Shape{}}}, {"h", f64({3})}};
  Node cast = named_node("fi", "Cast", {"i"}, {"fi"});
  cast.attributes["to"] = int64_t{11};  // DOUBLE
  body->nodes = {named_node("keep", "Identity", {"cond_in"}, {"cond_out"}), named_node("hw", "Mul", {"h", "W"}, {"hw"}),
                 named_node("pre", "Add", {"hw", "X"}, {"pre"}), named_node("act", "Tanh", {"pre"}, {"h_next"}), cast,
                 named_node("scale", "Mul", {"h_next", "fi"}, {"scaled"}), named_node("shift", "Add", {"scaled", "c"}, {"y"})};
  body->outputs = {{"cond_out", {DType::Bool, Shape{}}}, {"h_next", f64({3})}, {"y", f64({3})}};
  Node n = named_node("repeat", "Loop", {"M", "", "h0"}, {"H", "Ys"});
  n.attributes["body"] = body;
  g.nodes.push_back(n);
  add_state_and_sequence_loss(g, {3, 3});
  Graph built = expect_gradients_match(m, {"h0", "X", "W", "c"},
                                       {{"h0", f64_tensor({3}, 0.1, 0.2)}, {"X", f64_tensor({3}, -0.5, 0.4)},
                                        {"W", f64_tensor({3}, 0.9, -0.3)}, {"c", f64_tensor({3}, 0.2, 0.1)}});
  // The backward is control flow of its own (a recomputing Scan and the reverse one over the 3 iterations).
  int scans = 0;
  for (const Node& k : built.nodes) scans += k.op_type == "Scan";
  EXPECT_EQ(scans, 2);
}

// A Loop's trip count computed from a shape (torch's `for _ in range(x.size(0))` with a dynamic axis): the plan
// folds it, so the gradient takes the Scan path over Range(0, M): the states of every step are recomputed and
// stacked, and the reverse Scan runs over them.
TEST(ControlFlowGradients, LoopWithTripCountFromAShapeTakesTheScanPathAndMatchesCentralDifferences) {
  Model m;
  m.opset_imports = {{"", 17}};
  Graph& g = m.graph;
  g.inputs = {{"h0", f64({3})}, {"X", f64({3})}, {"W", f64({3})}, {"S", f64({4, 2})}};
  g.nodes.push_back(named_node("shape", "Shape", {"S"}, {"s_shape"}));
  g.initializers["zero"] = TensorData::scalar<int64_t>(0);
  g.nodes.push_back(named_node("rows", "Gather", {"s_shape", "zero"}, {"M"}));
  auto body = std::make_shared<Graph>();
  body->inputs = {{"i", {DType::Int64, Shape{}}}, {"cond_in", {DType::Bool, Shape{}}}, {"h", f64({3})}};
  body->nodes = {named_node("keep", "Identity", {"cond_in"}, {"cond_out"}), named_node("hw", "Mul", {"h", "W"}, {"hw"}),
                 named_node("pre", "Add", {"hw", "X"}, {"pre"}), named_node("act", "Tanh", {"pre"}, {"h_next"}),
                 named_node("emit", "Mul", {"h_next", "h"}, {"y"})};
  body->outputs = {{"cond_out", {DType::Bool, Shape{}}}, {"h_next", f64({3})}, {"y", f64({3})}};
  Node n = named_node("repeat", "Loop", {"M", "", "h0"}, {"H", "Ys"});
  n.attributes["body"] = body;
  g.nodes.push_back(n);
  add_state_and_sequence_loss(g, {4, 3});
  Graph built = expect_gradients_match(m, {"h0", "X", "W"},
                                       {{"h0", f64_tensor({3}, 0.1, 0.2)}, {"X", f64_tensor({3}, -0.5, 0.4)},
                                        {"W", f64_tensor({3}, 0.9, -0.3)}, {"S", f64_tensor({4, 2}, 0.0, 1.0)}});
  int scans = 0, ranges = 0;
  for (const Node& k : built.nodes) {
    scans += k.op_type == "Scan";
    ranges += k.op_type == "Range";
  }
  EXPECT_EQ(scans, 2);
  EXPECT_EQ(ranges, 1);
}

// The Scan path with values that take no gradient: an int64 counter carried beside h and stacked as a second
// scan output, which the step also reads (as a float scale):
//   h' = tanh(h * W + X) * (1 + 0.5 * n), n' = n + 1, scan outputs (h', n').  L = sum(H * H) + sum(Ys * R).
TEST(ControlFlowGradients, LoopWithAnIntCounterOnTheScanPathMatchesCentralDifferences) {
  Model m;
  m.opset_imports = {{"", 17}};
  Graph& g = m.graph;
  g.inputs = {{"h0", f64({3})}, {"X", f64({3})}, {"W", f64({3})}};
  g.initializers["M"] = TensorData::scalar<int64_t>(3);
  g.initializers["n0"] = TensorData::scalar<int64_t>(0);
  auto body = std::make_shared<Graph>();
  body->inputs = {{"i", {DType::Int64, Shape{}}}, {"cond_in", {DType::Bool, Shape{}}}, {"h", f64({3})},
                  {"n", {DType::Int64, Shape{}}}};
  body->initializers["one"] = TensorData::scalar<int64_t>(1);
  body->initializers["half"] = TensorData::scalar<double>(0.5);
  body->initializers["unit"] = TensorData::scalar<double>(1.0);
  Node cast = named_node("fn", "Cast", {"n"}, {"fn"});
  cast.attributes["to"] = int64_t{11};  // DOUBLE
  body->nodes = {named_node("keep", "Identity", {"cond_in"}, {"cond_out"}), named_node("hw", "Mul", {"h", "W"}, {"hw"}),
                 named_node("pre", "Add", {"hw", "X"}, {"pre"}), named_node("act", "Tanh", {"pre"}, {"t"}), cast,
                 named_node("hn", "Mul", {"fn", "half"}, {"hn"}), named_node("sc", "Add", {"hn", "unit"}, {"scale"}),
                 named_node("out", "Mul", {"t", "scale"}, {"h_next"}), named_node("count", "Add", {"n", "one"}, {"n_next"}),
                 named_node("emit", "Identity", {"h_next"}, {"y"}), named_node("emit_n", "Identity", {"n_next"}, {"yn"})};
  body->outputs = {{"cond_out", {DType::Bool, Shape{}}}, {"h_next", f64({3})}, {"n_next", {DType::Int64, Shape{}}},
                   {"y", f64({3})}, {"yn", {DType::Int64, Shape{}}}};
  Node n = named_node("repeat", "Loop", {"M", "", "h0", "n0"}, {"H", "N", "Ys", "Ns"});
  n.attributes["body"] = body;
  g.nodes.push_back(n);
  add_state_and_sequence_loss(g, {3, 3});
  Graph built = expect_gradients_match(m, {"h0", "X", "W"},
                                       {{"h0", f64_tensor({3}, 0.1, 0.2)}, {"X", f64_tensor({3}, -0.5, 0.4)},
                                        {"W", f64_tensor({3}, 0.9, -0.3)}});
  int scans = 0;
  for (const Node& k : built.nodes) scans += k.op_type == "Scan";
  EXPECT_EQ(scans, 2) << "the Scan path, not the recomputing Loop";
}

// A loop that runs while a condition on its data holds (a `while` loop), at most M times:
//   h' = h * W + X, n' = n + 1 (an int64 counter, which takes no gradient), cond' = sum(h' * h') < 12,
// cond given from outside (false runs no iteration at all), W and X read from the enclosing scope. The number of
// iterations is only known when the loop runs, so the gradient recomputes (loop_by_recomputation).
// L = sum(H * R): with the feeds below the loop runs 4 times, and the sums of squares after each iteration
// (1.3, 3.7, 9.0, 20.3) stay far from 12, so central differences never change the count.
Model while_model() {
  Model m;
  m.opset_imports = {{"", 17}};
  Graph& g = m.graph;
  g.inputs = {{"go", {DType::Bool, Shape{}}}, {"M", {DType::Int64, Shape{}}}, {"h0", f64({3})}, {"X", f64({3})},
              {"W", f64({3})}};
  g.initializers["n0"] = TensorData::scalar<int64_t>(0);
  auto body = std::make_shared<Graph>();
  body->inputs = {{"i", {DType::Int64, Shape{}}}, {"cond_in", {DType::Bool, Shape{}}}, {"h", f64({3})}, {"n", {DType::Int64, Shape{}}}};
  Node total = named_node("sq_sum", "ReduceSum", {"sq"}, {"energy"});
  total.attributes["keepdims"] = int64_t{0};
  body->initializers["limit"] = TensorData::scalar<double>(12.0);
  body->initializers["one"] = TensorData::scalar<int64_t>(1);
  body->nodes = {named_node("hw", "Mul", {"h", "W"}, {"hw"}), named_node("pre", "Add", {"hw", "X"}, {"h_next"}),
                 named_node("count", "Add", {"n", "one"}, {"n_next"}), named_node("sq", "Mul", {"h_next", "h_next"}, {"sq"}),
                 total, named_node("test", "Less", {"energy", "limit"}, {"cond_out"})};
  body->outputs = {{"cond_out", {DType::Bool, Shape{}}}, {"h_next", f64({3})}, {"n_next", {DType::Int64, Shape{}}}};
  Node n = named_node("until", "Loop", {"M", "go", "h0", "n0"}, {"H", "N"});
  n.attributes["body"] = body;
  g.nodes.push_back(n);
  g.initializers["R"] = f64_tensor({3}, 0.7, -0.35).to_data();
  g.nodes.push_back(named_node("weigh", "Mul", {"H", "R"}, {"weighted"}));
  g.nodes.push_back(named_node("hsum", "ReduceSum", {"weighted"}, {"L"}));
  g.nodes.back().attributes["keepdims"] = int64_t{0};
  g.outputs.push_back({"L", f64({})});
  g.outputs.push_back({"N", {DType::Int64, Shape{}}});
  return m;
}

Tensor int64_scalar(int64_t v) {
  Tensor t = Tensor::empty(DType::Int64, {});
  *t.ptr<int64_t>() = v;
  return t;
}

TEST(ControlFlowGradients, LoopEndedByADataDependentConditionMatchesCentralDifferences) {
  const Model m = while_model();
  for (auto [go, trips, runs] : {std::tuple{true, int64_t{10}, int64_t{4}},
                                 std::tuple{true, int64_t{2}, int64_t{2}}, std::tuple{false, int64_t{10}, int64_t{0}}}) {
    SCOPED_TRACE("go " + std::to_string(go) + ", M " + std::to_string(trips));
    const std::map<std::string, Tensor> feeds{{"go", bool_scalar(go)},
                                              {"M", int64_scalar(trips)},
                                              {"h0", Tensor::from_vector<double>({3}, {0.1, 0.3, 0.5})},
                                              {"X", Tensor::from_vector<double>({3}, {0.2, 0.1, 0.3})},
                                              {"W", Tensor::from_vector<double>({3}, {1.3, 1.2, 1.4})}};
    Executor forward(m.graph, m.opset_imports, std::make_shared<TensorStore>());
    EXPECT_EQ(forward.run(feeds).at(1).ptr<int64_t>()[0], runs) << "iterations the loop ran";
    Model only_loss = m;
    only_loss.graph.outputs.resize(1);
    Graph built = expect_gradients_match(only_loss, {"h0", "X", "W"}, feeds);
    // The backward is ONNX control flow of its own: the counting replay and the backward Loop, no stack of states.
    int loops = 0, scans = 0;
    for (const Node& k : built.nodes) {
      loops += k.op_type == "Loop";
      scans += k.op_type == "Scan";
    }
    EXPECT_EQ(loops, 3);
    EXPECT_EQ(scans, 0);
  }
}

// Through the Yield boundary (ForwardBackwardSession's split): the backward If reads, inside its branches, a
// value the forward part computes (P = sin(X)); the split must save it although no backward node lists it as an
// input. The gradients must equal those of the graph built without the Yield.
TEST(ControlFlowGradients, IfGradientSplitAtTheYieldSavesWhatTheBranchesRead) {
  Model m;
  m.opset_imports = {{"", 17}, {"onnxtrain", 1}};
  Graph& g0 = m.graph;
  g0.inputs = {{"cond", {DType::Bool, Shape{}}}, {"X", f64({3})}, {"W", f64({3})}};
  g0.nodes.push_back(named_node("pre", "Sin", {"X"}, {"P"}));
  auto then_b = std::make_shared<Graph>();
  then_b->nodes = {named_node("t_mul", "Mul", {"P", "W"}, {"t_pw"}), named_node("t_tanh", "Tanh", {"t_pw"}, {"t_y"})};
  then_b->outputs = {{"t_y", f64({3})}};
  auto else_b = std::make_shared<Graph>();
  else_b->nodes = {named_node("e_add", "Add", {"P", "W"}, {"e_y"})};
  else_b->outputs = {{"e_y", f64({3})}};
  Node n = named_node("choose", "If", {"cond"}, {"Y"});
  n.attributes["then_branch"] = then_b;
  n.attributes["else_branch"] = else_b;
  g0.nodes.push_back(n);
  add_weighted_loss(g0, "Y", {3});
  infer_shapes(m);
  for (bool cond : {true, false}) {
    SCOPED_TRACE(cond ? "then" : "else");
    const std::map<std::string, Tensor> feeds{
        {"cond", bool_scalar(cond)}, {"X", f64_tensor({3}, -0.4, 0.5)}, {"W", f64_tensor({3}, 0.3, 0.2)}};
    // Without the Yield: one graph.
    Graph whole = m.graph;
    GraphBuilder sb(whole, "seed/");
    Expr seed = scalar(sb, DType::Float64, 1.0);
    GradientRequest req;
    req.wrt = {"X", "W"};
    req.outputs = {"L"};
    req.output_grads = {seed.name};
    GradientResult r = build_gradients(whole, m.opset_imports, req);
    whole.outputs = {{r.grads.at("X"), f64({3})}, {r.grads.at("W"), f64({3})}};
    std::vector<Tensor> want = Executor(whole, m.opset_imports, std::make_shared<TensorStore>()).run(feeds);
    // With the Yield: forward and backward halves.
    Graph y = m.graph;
    GradientRequest yreq;
    yreq.wrt = {"X", "W"};
    yreq.outputs = {"L"};
    yreq.emit_yield = true;
    GradientResult yr = build_gradients(y, m.opset_imports, yreq);
    y.outputs.push_back({yr.grads.at("X"), f64({3})});
    y.outputs.push_back({yr.grads.at("W"), f64({3})});
    YieldSplit split = split_at_yield(y);
    EXPECT_NE(std::find(split.saved.begin(), split.saved.end(), "P"), split.saved.end())
        << "the value the backward branches recompute from is saved";
    auto store = std::make_shared<TensorStore>();
    Executor fwd(split.forward, m.opset_imports, store);
    std::vector<Tensor> fo = fwd.run(feeds);
    std::map<std::string, Tensor> known = feeds;
    for (size_t i = 0; i < fo.size(); ++i) known[split.forward.outputs[i].name] = fo[i];
    known[split.yield_outputs.at(0)] = Tensor::from_vector<double>({}, {1.0});
    Executor bwd(split.backward, m.opset_imports, store);
    std::map<std::string, Tensor> bfeeds;
    for (const std::string& name : bwd.feed_names()) bfeeds[name] = known.at(name);
    std::vector<Tensor> got = bwd.run(bfeeds);
    ASSERT_EQ(got.size(), 2u);
    for (size_t k = 0; k < 2; ++k)
      for (int64_t i = 0; i < 3; ++i) EXPECT_NEAR(got[k].ptr<double>()[i], want[k].ptr<double>()[i], 1e-12) << k << "," << i;
  }
}

}  // namespace
}  // namespace onnxtrain
