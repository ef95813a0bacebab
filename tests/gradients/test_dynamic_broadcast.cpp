// Gradients through broadcasting that only the run time resolves (symbolic dims): the engine emits
// onnxtrain.SumToShape there. Checked in float64 against central differences, for several run-time shapes of
// the same graph, through the native kernel and through the inlined standard-ONNX body. Also the kernels'
// errors on bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "executor/executor.h"
#include "gradients/builder.h"
#include "gradients/fused.h"
#include "graph/error.h"
#include "graph/expr.h"
#include "graph/shape_inference.h"

namespace onnxtrain {
namespace {

Shape dims(std::vector<std::string> syms) {
  Shape s;
  for (const std::string& d : syms)
    s.push_back(std::isdigit(static_cast<unsigned char>(d[0])) ? Dim::of(std::stoll(d)) : Dim::sym(d));
  return s;
}

struct Case {
  std::string op;
  Shape a, b;                                                // declared (symbolic) input shapes
  std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> runs;  // concrete (a, b) shapes
};

// objective = sum(op(a, b)^2); returns the graph with outputs (objective, da, db).
Model build(const Case& c) {
  Model m;
  m.opset_imports = {{"", 17}, {kFusedGradDomain, 1}};
  Graph& g = m.graph;
  g.inputs = {{"a", {DType::Float64, c.a}}, {"b", {DType::Float64, c.b}}};
  Node n;
  n.name = "fwd";
  n.op_type = c.op;
  n.inputs = {"a", "b"};
  n.outputs = {"y"};
  g.nodes.push_back(n);
  infer_shapes(m);
  GraphBuilder gb(g, "obj/");
  Expr y = value(gb, "y");
  Expr obj = reduce_sum_all(y * y);
  Expr seed = scalar(gb, DType::Float64, 1.0);
  GradientRequest req;
  req.wrt = {"a", "b"};
  req.outputs = {obj.name};
  req.output_grads = {seed.name};
  auto grads = build_gradients(g, m.opset_imports, req).grads;
  g.outputs = {{obj.name, obj.type}, {grads.at("a"), {DType::Float64, c.a}}, {grads.at("b"), {DType::Float64, c.b}}};
  return m;
}

Tensor random(std::vector<int64_t> shape, std::mt19937& rng) {
  Tensor t = Tensor::empty(DType::Float64, std::move(shape));
  std::uniform_real_distribution<double> u(-1, 1);
  for (double& v : t.span<double>()) v = u(rng);
  return t;
}

double objective(Executor& ex, const Tensor& a, const Tensor& b) {
  const Tensor* p[2] = {&a, &b};
  return *ex.run(std::span<const Tensor* const>(p, 2))[0]->ptr<double>();
}

TEST(DynamicBroadcast, SumToShapeGradientsMatchCentralDifferencesBothWays) {
  const std::vector<Case> cases = {
      // Either side may turn out to be the broadcast one.
      {"Add", dims({"p", "3"}), dims({"q", "3"}), {{{1, 3}, {4, 3}}, {{4, 3}, {1, 3}}, {{4, 3}, {4, 3}}}},
      // A rank difference plus a symbolic dim of the lower-rank input.
      {"Mul", dims({"s", "t"}), dims({"u"}), {{{2, 3}, {1}}, {{2, 3}, {3}}, {{2, 1}, {5}}}},
      // A known size against a symbolic one (the symbolic one is 1 or that size).
      {"Sub", dims({"2", "4"}), dims({"r", "4"}), {{{2, 4}, {1, 4}}, {{2, 4}, {2, 4}}}},
  };
  std::mt19937 rng(11);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.op);
    Model m = build(c);
    EXPECT_TRUE(std::any_of(m.graph.nodes.begin(), m.graph.nodes.end(),
                            [](const Node& n) { return n.op_type == "SumToShape" && n.domain == kFusedGradDomain; }))
        << "the symbolic broadcast should be summed at run time";
    ExecutorOptions native, body;
    native.functions = body.functions = fused_grad_functions();
    body.prefer_function_bodies = true;
    Executor ex(m.graph, m.opset_imports, std::make_shared<TensorStore>(), native);
    Executor inl(m.graph, m.opset_imports, std::make_shared<TensorStore>(), body);
    ASSERT_FALSE(std::any_of(inl.graph().nodes.begin(), inl.graph().nodes.end(),
                             [](const Node& n) { return n.op_type == "SumToShape"; }));
    for (const auto& [sa, sb] : c.runs) {
      SCOPED_TRACE(::testing::PrintToString(sa) + " " + ::testing::PrintToString(sb));
      Tensor a = random(sa, rng), b = random(sb, rng);
      const Tensor* p[2] = {&a, &b};
      std::vector<Tensor> got, via_body;
      for (const Tensor* t : ex.run(std::span<const Tensor* const>(p, 2)).subspan(1)) got.push_back(t->clone());
      for (const Tensor* t : inl.run(std::span<const Tensor* const>(p, 2)).subspan(1)) via_body.push_back(t->clone());
      ASSERT_EQ(got[0].shape, sa);
      ASSERT_EQ(got[1].shape, sb);
      for (size_t k = 0; k < 2; ++k) {
        Tensor& x = k == 0 ? a : b;
        ASSERT_EQ(via_body[k].shape, got[k].shape);
        for (int64_t e = 0; e < x.numel(); ++e) {
          EXPECT_NEAR(got[k].ptr<double>()[e], via_body[k].ptr<double>()[e], 1e-12) << "input " << k << "[" << e << "]";
          const double keep = x.ptr<double>()[e], eps = 1e-6;
          x.ptr<double>()[e] = keep + eps;
          const double up = objective(ex, a, b);
          x.ptr<double>()[e] = keep - eps;
          const double down = objective(ex, a, b);
          x.ptr<double>()[e] = keep;
          const double numeric = (up - down) / (2 * eps);
          EXPECT_NEAR(got[k].ptr<double>()[e], numeric, 1e-6 + 1e-6 * std::abs(numeric)) << "input " << k << "[" << e << "]";
        }
      }
    }
  }
}

TEST(DynamicBroadcast, StaticShapesNeedNoRunTimeSum) {
  Model m = build({"Add", dims({"n", "3"}), dims({"3"}), {}});
  EXPECT_FALSE(std::any_of(m.graph.nodes.begin(), m.graph.nodes.end(),
                           [](const Node& n) { return n.op_type == "SumToShape"; }));
}

// One fused node: dY fed, the target shape an initializer; GatherGrad's indices an initializer when given,
// else fed as int64 [m].
Graph fused_graph(const std::string& op, DType t, const std::vector<int64_t>& dy_shape, const std::vector<int64_t>& shape,
                  std::map<std::string, Attribute> attrs, const std::vector<int64_t>* const_indices, int64_t m = 0) {
  auto i64 = [](const std::vector<int64_t>& v) {
    return TensorData::from<int64_t>({static_cast<int64_t>(v.size())}, std::span<const int64_t>(v));
  };
  auto known = [](const std::vector<int64_t>& v) {
    Shape s;
    for (int64_t d : v) s.push_back(Dim::of(d));
    return s;
  };
  Graph g;
  g.nodes.emplace_back();
  Node& n = g.nodes.back();
  n.name = "fused";
  n.op_type = op;
  n.domain = kFusedGradDomain;
  n.attributes = std::move(attrs);
  n.inputs = {"dY"};
  g.inputs.push_back({"dY", {t, known(dy_shape)}});
  if (op == "GatherGrad") {
    n.inputs.push_back("indices");
    if (const_indices) g.initializers["indices"] = i64(*const_indices);
    else g.inputs.push_back({"indices", {DType::Int64, known({m})}});
  }
  n.inputs.push_back("shape");
  g.initializers["shape"] = i64(shape);
  n.outputs = {"dX"};
  g.outputs.push_back({"dX", {t, std::nullopt}});
  return g;
}

// The error message of planning and running one fused node on a dY of ones ("" when it succeeds).
std::string fused_error(const std::string& op, std::vector<int64_t> dy_shape, std::vector<int64_t> shape,
                        std::vector<int64_t> indices = {}, std::map<std::string, Attribute> attrs = {}) {
  try {
    Executor ex(fused_graph(op, DType::Float32, dy_shape, shape, std::move(attrs), &indices),
                {{"", 17}, {kFusedGradDomain, 1}}, std::make_shared<TensorStore>());
    std::map<std::string, Tensor> feeds;
    feeds["dY"] = Tensor::empty(DType::Float32, dy_shape);
    std::fill(feeds["dY"].span<float>().begin(), feeds["dY"].span<float>().end(), 1.0f);
    ex.run(feeds);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(DynamicBroadcast, KernelsRejectBadInputWithClearErrors) {
  EXPECT_NE(fused_error("SumToShape", {2, 3}, {2, 4}).find("does not broadcast to dY's shape [2, 3]"), std::string::npos);
  EXPECT_NE(fused_error("SumToShape", {3}, {1, 3}).find("does not broadcast"), std::string::npos);
  const std::map<std::string, Attribute> axis0{{"axis", int64_t{0}}};
  EXPECT_NE(fused_error("GatherGrad", {2, 3}, {4, 3}, {0, 4}, axis0).find("index 4 (at position 1) is out of range"),
            std::string::npos);
  EXPECT_NE(fused_error("GatherGrad", {2, 3}, {4, 3}, {0, 1}).find("attribute 'axis'"), std::string::npos);
  EXPECT_NE(fused_error("GatherGrad", {2, 5}, {4, 3}, {0, 1}, axis0).find("dY has shape [2, 5]"), std::string::npos);
  EXPECT_EQ(fused_error("GatherGrad", {2, 3}, {4, 3}, {0, -4}, axis0), "");
}

// GatherGrad against a plain serial scatter-add, on a shape big enough for the parallel path, with heavily
// repeated indices (the deterministic result must not depend on the thread count).
TEST(DynamicBroadcast, GatherGradMatchesSerialScatterAdd) {
  const int64_t outer = 3, n = 50, m = 700, inner = 33;
  std::mt19937 rng(3);
  std::uniform_int_distribution<int64_t> pick(-n, n - 1);
  std::vector<int64_t> idx(m);
  for (int64_t& v : idx) v = pick(rng) / 7;  // few distinct rows, both signs
  Graph g = fused_graph("GatherGrad", DType::Float64, {outer, m, inner}, {outer, n, inner}, {{"axis", int64_t{1}}},
                        nullptr, m);
  Executor ex(g, {{"", 17}, {kFusedGradDomain, 1}}, std::make_shared<TensorStore>());
  std::map<std::string, Tensor> feeds{{"dY", random({outer, m, inner}, rng)},
                                      {"indices", Tensor::from_vector<int64_t>({m}, idx)}};
  std::vector<double> expect(outer * n * inner, 0.0);
  const double* dy = feeds["dY"].ptr<double>();
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < m; ++j)
      for (int64_t c = 0; c < inner; ++c) expect[(o * n + (idx[j] + n) % n) * inner + c] += dy[(o * m + j) * inner + c];
  Tensor got = ex.run(feeds)[0];
  ASSERT_EQ(got.shape, (std::vector<int64_t>{outer, n, inner}));
  for (size_t i = 0; i < expect.size(); ++i) ASSERT_EQ(got.ptr<double>()[i], expect[i]) << i;  // same order: exact
}

}  // namespace
}  // namespace onnxtrain
