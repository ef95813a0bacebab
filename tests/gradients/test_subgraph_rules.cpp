// Subgraph rules (gradients/subgraphs.h): each case is a small float64 graph y = f(x) written as an exporter
// writes it. The gradient of sum(y * R) must match central differences whether or not the rule fires, and the
// rule must fire exactly when the case says: then the backward pass reads x and none of the interior values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>

#include "common/node.h"
#include "executor/executor.h"
#include "gradients/builder.h"
#include "gradients/subgraphs.h"
#include "graph/expr.h"
#include "graph/shape_inference.h"

namespace onnxtrain {
namespace {

using test::node;

struct SubgraphCase {
  std::string label;
  std::string rule;  // the rule expected to fire, or "" when none may
  std::vector<Node> nodes;  // read "x" (float64 [3, 4]) and the constants below; write "y"
  std::vector<std::string> also_outputs = {};  // interior values made graph outputs
  // Stop-gradient edges: the gradient is then no longer the function's derivative, so with `stop` set the
  // case checks dx = dy * 0.5 * a instead of central differences (a = 1 + erf(x / sqrt(2)) held constant).
  std::set<std::string> stop = {};
};

// GELU's constants, plus one that is not.
const std::map<std::string, double> kConstants = {
    {"sqrt2", std::sqrt(2.0)}, {"rsqrt2", std::sqrt(0.5)}, {"one", 1.0}, {"half", 0.5}, {"not_half", 0.6},
    {"k", std::sqrt(2.0 / 3.14159265358979323846)}, {"kappa", 0.044715}, {"three", 3.0}, {"not_kappa", 0.05}};

const std::vector<SubgraphCase>& cases() {
  static const std::vector<SubgraphCase> v = {
      // torch.onnx's export of nn.GELU() below opset 20 (the transformer benchmark W3 has this form).
      {"gelu_torch_export", "gelu_erf",
       {node("Div", {"x", "sqrt2"}, {"z"}), node("Erf", {"z"}, {"e"}), node("Add", {"e", "one"}, {"a"}),
        node("Mul", {"x", "a"}, {"xa"}), node("Mul", {"xa", "half"}, {"y"})}},
      // x * 0.5 * (1.0 + erf(x / sqrt(2))) as Python code writes it (x * 0.5 first).
      {"gelu_half_first", "gelu_erf",
       {node("Mul", {"x", "half"}, {"h"}), node("Div", {"x", "sqrt2"}, {"z"}), node("Erf", {"z"}, {"e"}),
        node("Add", {"one", "e"}, {"a"}), node("Mul", {"h", "a"}, {"y"})}},
      // The constant factors together, and x scaled by 1/sqrt(2) with the constant on the left.
      {"gelu_constants_together", "gelu_erf",
       {node("Mul", {"rsqrt2", "x"}, {"z"}), node("Erf", {"z"}, {"e"}), node("Add", {"e", "one"}, {"a"}),
        node("Mul", {"a", "half"}, {"ah"}), node("Mul", {"x", "ah"}, {"y"})}},
      // torch.onnx's export of F.gelu(x, approximate="tanh") below opset 20: x * (x * x), constants on the left.
      {"gelu_tanh_torch_export", "gelu_tanh",
       {node("Mul", {"x", "x"}, {"xx"}), node("Mul", {"x", "xx"}, {"x3"}), node("Mul", {"kappa", "x3"}, {"cx3"}),
        node("Add", {"x", "cx3"}, {"inner"}), node("Mul", {"k", "inner"}, {"u"}), node("Tanh", {"u"}, {"t"}),
        node("Add", {"one", "t"}, {"a"}), node("Mul", {"x", "a"}, {"xa"}), node("Mul", {"half", "xa"}, {"y"})}},
      // GPT-2's NewGELU as Python writes it: 0.5 * x * (1 + tanh(k * (x + 0.044715 * pow(x, 3)))).
      {"gelu_tanh_pow", "gelu_tanh",
       {node("Mul", {"x", "half"}, {"h"}), node("Pow", {"x", "three"}, {"x3"}), node("Mul", {"x3", "kappa"}, {"cx3"}),
        node("Add", {"cx3", "x"}, {"inner"}), node("Mul", {"inner", "k"}, {"u"}), node("Tanh", {"u"}, {"t"}),
        node("Add", {"t", "one"}, {"a"}), node("Mul", {"h", "a"}, {"y"})}},
      {"gelu_tanh_other_constant", "",
       {node("Pow", {"x", "three"}, {"x3"}), node("Mul", {"x3", "not_kappa"}, {"cx3"}),
        node("Add", {"cx3", "x"}, {"inner"}), node("Mul", {"inner", "k"}, {"u"}), node("Tanh", {"u"}, {"t"}),
        node("Add", {"t", "one"}, {"a"}), node("Mul", {"x", "a"}, {"xa"}), node("Mul", {"xa", "half"}, {"y"})}},
      // The same formula where the rule must not fire: an interior value read elsewhere, a different
      // constant, a stop-gradient edge inside.
      {"gelu_interior_is_an_output", "",
       {node("Div", {"x", "sqrt2"}, {"z"}), node("Erf", {"z"}, {"e"}), node("Add", {"e", "one"}, {"a"}),
        node("Mul", {"x", "a"}, {"xa"}), node("Mul", {"xa", "half"}, {"y"})},
       {"e"}},
      {"gelu_other_constant", "",
       {node("Div", {"x", "sqrt2"}, {"z"}), node("Erf", {"z"}, {"e"}), node("Add", {"e", "one"}, {"a"}),
        node("Mul", {"x", "a"}, {"xa"}), node("Mul", {"xa", "not_half"}, {"y"})}},
      // A one-element constant of higher rank broadcasts y to [1, 3, 4]: the gradient must be summed back to x.
      {"gelu_constant_raises_rank", "",
       {node("Div", {"x", "sqrt2"}, {"z"}), node("Erf", {"z"}, {"e"}), node("Add", {"e", "one"}, {"a"}),
        node("Mul", {"x", "a"}, {"xa"}), node("Mul", {"xa", "half_rank3"}, {"y"})}},
      {"gelu_stop_inside", "",
       {node("Div", {"x", "sqrt2"}, {"z"}), node("Erf", {"z"}, {"e"}), node("Add", {"e", "one"}, {"a"}),
        node("Mul", {"x", "a"}, {"xa"}), node("Mul", {"xa", "half"}, {"y"})},
       {},
       {"a"}},
  };
  return v;
}

struct Built {
  Model model;
  GradientResult grads;
  size_t forward_nodes = 0;
  TensorData r;  // the projection: objective = sum(y * r)
};

Built build(const SubgraphCase& c, std::mt19937& rng) {
  Built b;
  b.model.opset_imports = {{"", 17}, {"onnxtrain", 1}};
  Graph& g = b.model.graph;
  const Shape s = {Dim::of(3), Dim::of(4)};
  g.inputs.push_back({"x", {DType::Float64, s}});
  for (const auto& [name, v] : kConstants) g.initializers[name] = TensorData::scalar(v);
  const double half = 0.5;
  g.initializers["half_rank3"] = TensorData::from<double>({1, 1, 1}, std::span<const double>(&half, 1));
  g.nodes = c.nodes;
  for (const std::string& o : c.also_outputs) g.outputs.push_back({o, {DType::Float64, s}});
  infer_shapes(b.model);
  b.forward_nodes = g.nodes.size();
  GraphBuilder gb(g, "check/");
  TensorData& r = b.r;
  r.dtype = DType::Float64;
  r.dims = {3, 4};
  r.bytes.resize(12 * sizeof(double));
  std::normal_distribution<double> nd;
  for (double& v : r.as_mut<double>()) v = nd(rng);
  Expr obj = reduce_sum_all(value(gb, "y") * constant(gb, r));
  Expr seed = scalar(gb, DType::Float64, 1.0);
  GradientRequest req;
  req.wrt = {"x"};
  req.outputs = {obj.name};
  req.output_grads = {seed.name};
  req.stop_gradients = c.stop;
  b.grads = build_gradients(g, b.model.opset_imports, req);
  g.outputs.insert(g.outputs.begin(), {obj.name, obj.type});
  g.outputs.push_back({b.grads.grads.at("x"), {DType::Float64, s}});
  return b;
}

double objective(Executor& ex, const Tensor& x) {
  const Tensor* p = &x;
  return *ex.run(std::span<const Tensor* const>(&p, 1))[0]->ptr<double>();
}

class SubgraphRuleCase : public ::testing::TestWithParam<size_t> {};

TEST_P(SubgraphRuleCase, FiresAsExpectedAndMatchesCentralDifferences) {
  const SubgraphCase& c = cases()[GetParam()];
  std::mt19937 rng(77 + static_cast<unsigned>(GetParam()));
  Built b = build(c, rng);
  const Graph& g = b.model.graph;

  std::set<std::string> interior;
  for (const Node& n : c.nodes)
    for (const std::string& o : n.outputs)
      if (o != "y") interior.insert(o);
  const auto fused = std::count_if(g.nodes.begin() + static_cast<std::ptrdiff_t>(b.forward_nodes), g.nodes.end(),
                                   [](const Node& n) { return n.op_type == "GeluGrad" || n.op_type == "GeluTanhGrad"; });
  if (!c.rule.empty()) {
    EXPECT_EQ(fused, 1) << "rule " << c.rule << " did not fire";
    const SubgraphRule& rule = *std::find_if(subgraph_rules().begin(), subgraph_rules().end(),
                                             [&](const SubgraphRule& r) { return r.name == c.rule; });
    EXPECT_TRUE(std::any_of(g.nodes.begin(), g.nodes.end(), [&](const Node& n) { return n.op_type == rule.fused_op; }))
        << "rule " << c.rule << " should emit " << rule.fused_op;
    for (const std::string& v : interior)
      EXPECT_FALSE(b.grads.saved_forward_values.count(v)) << "the backward pass still reads interior value " << v;
  } else {
    EXPECT_EQ(fused, 0) << "a subgraph rule fired where the graph's meaning depends on its interior";
  }

  Executor ex(g, b.model.opset_imports, std::make_shared<TensorStore>());
  Tensor x = Tensor::empty(DType::Float64, {3, 4});
  std::uniform_real_distribution<double> u(-3.0, 3.0);
  for (double& v : x.span<double>()) v = u(rng);
  const Tensor* p = &x;
  auto outs = ex.run(std::span<const Tensor* const>(&p, 1));
  Tensor analytic = outs.back()->clone();
  std::span<double> xs = x.span<double>();
  if (!c.stop.empty()) {
    for (size_t e = 0; e < xs.size(); ++e)
      EXPECT_NEAR(analytic.span<double>()[e], b.r.as<double>()[e] * 0.5 * (1 + std::erf(xs[e] / std::sqrt(2.0))), 1e-12)
          << "x[" << e << "]";
    return;
  }
  const double eps = 1e-6;
  for (size_t e = 0; e < xs.size(); ++e) {
    const double keep = xs[e];
    xs[e] = keep + eps;
    const double up = objective(ex, x);
    xs[e] = keep - eps;
    const double down = objective(ex, x);
    xs[e] = keep;
    const double numeric = (up - down) / (2 * eps);
    EXPECT_NEAR(analytic.span<double>()[e], numeric, 1e-6 + 1e-5 * std::abs(numeric)) << "x[" << e << "]";
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, SubgraphRuleCase, ::testing::Range<size_t>(0, cases().size()),
                         [](const ::testing::TestParamInfo<size_t>& i) { return cases()[i.param].label; });

TEST(SubgraphRules, EveryRuleHasAFiringCase) {
  for (const SubgraphRule& r : subgraph_rules())
    EXPECT_TRUE(std::any_of(cases().begin(), cases().end(), [&](const SubgraphCase& c) { return c.rule == r.name; }))
        << "subgraph rule '" << r.name << "' has no case in tests/gradients/test_subgraph_rules.cpp";
}

}  // namespace
}  // namespace onnxtrain
