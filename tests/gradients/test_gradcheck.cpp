// Checks every registered gradient rule numerically: a one-node float64 graph per case in the table
// (rule_cases.cpp), the engine's analytic gradient of sum(Y * R) for a random projection R, against central
// differences. A registered rule without a case fails the suite.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>

#include "executor/executor.h"
#include "gradients/builder.h"
#include "gradients/rule_cases.h"
#include "graph/error.h"
#include "graph/expr.h"
#include "graph/shape_inference.h"

namespace onnxtrain {
namespace {

struct Built {
  Model model;
  std::vector<std::string> wrt;  // the float inputs, fed in this order
  std::string objective;
  std::map<std::string, std::string> grads;
};

// One node, its float inputs as graph inputs, and objective = sum over outputs of sum(Y_k * R_k).
Built build_case(const test::RuleCase& c, std::mt19937& rng) {
  Built b;
  Model& m = b.model;
  m.opset_imports[""] = c.opset;
  m.opset_imports["onnxtrain"] = 1;
  Graph& g = m.graph;
  Node n;
  n.name = "under_test";
  n.op_type = c.op;
  n.domain = c.domain;
  n.attributes = c.attrs;
  for (size_t i = 0; i < c.input_shapes.size(); ++i) {
    std::string name = "x" + std::to_string(i);
    bool is_const = i < c.const_inputs.size() && c.const_inputs[i].has_value();
    if (is_const) {
      g.initializers[name] = *c.const_inputs[i];
    } else if (!c.input_shapes[i].empty() && c.input_shapes[i][0] == -1) {
      name.clear();  // an omitted optional input
    } else {
      Shape s;
      for (int64_t d : c.input_shapes[i]) s.push_back(Dim::of(d));
      g.inputs.push_back({name, {DType::Float64, s}});
      b.wrt.push_back(name);
    }
    n.inputs.push_back(name);
  }
  int n_out = c.num_outputs > 0 ? c.num_outputs : 1;
  for (int k = 0; k < n_out; ++k) n.outputs.push_back("y" + std::to_string(k));
  g.nodes.push_back(n);
  infer_shapes(m);
  // ONNX infers only the rank for some ops (Einsum): take such output shapes from one forward run on zeros.
  for (const std::string& y : n.outputs) {
    const TypeInfo* t = g.type_of(y);
    if (!t || !t->shape || std::all_of(t->shape->begin(), t->shape->end(), [](const Dim& d) { return d.known(); }))
      continue;
    Graph fg = g;
    fg.outputs = {{y, *t}};
    Executor fwd(fg, m.opset_imports, std::make_shared<TensorStore>());
    std::vector<Tensor> zs;
    for (const ValueInfo& in : g.inputs) {
      std::vector<int64_t> dims;
      for (const Dim& d : *in.type.shape) dims.push_back(d.value);
      zs.push_back(Tensor::empty(DType::Float64, dims));
      std::fill(zs.back().span<double>().begin(), zs.back().span<double>().end(), 0.0);
    }
    std::vector<const Tensor*> zp;
    for (const Tensor& z : zs) zp.push_back(&z);
    Shape concrete;
    for (int64_t d : fwd.run(std::span<const Tensor* const>(zp))[0]->shape) concrete.push_back(Dim::of(d));
    g.value_info[y] = TypeInfo{t->dtype, concrete};
  }

  GraphBuilder gb(g, "check/");
  std::vector<Expr> terms;
  std::normal_distribution<double> nd;
  for (const std::string& y : n.outputs) {
    const TypeInfo* t = g.type_of(y);
    if (!t || !t->shape) throw Error("case " + c.label + ": shape inference gave no shape for " + y);
    if (t->dtype != DType::Float64) continue;  // integer outputs (indices) carry no gradient
    TensorData r;
    r.dtype = DType::Float64;
    for (const Dim& d : *t->shape) r.dims.push_back(d.value);
    r.bytes.resize(r.numel() * sizeof(double));
    for (double& v : r.as_mut<double>()) v = nd(rng);
    terms.push_back(reduce_sum_all(value(gb, y) * constant(gb, r)));
  }
  Expr obj = terms.size() == 1 ? terms[0] : sum(terms);
  b.objective = obj.name;
  Expr seed = scalar(gb, DType::Float64, 1.0);
  GradientRequest req;
  req.wrt = b.wrt;
  req.outputs = {obj.name};
  req.output_grads = {seed.name};
  b.grads = build_gradients(g, m.opset_imports, req).grads;
  g.outputs.push_back({obj.name, obj.type});
  for (const std::string& w : b.wrt) g.outputs.push_back({b.grads.at(w), *g.type_of(w)});
  return b;
}

std::vector<Tensor> sample_inputs(const test::RuleCase& c, const Built& b, std::mt19937& rng) {
  std::vector<Tensor> xs;
  size_t k = 0;
  for (size_t i = 0; i < c.input_shapes.size(); ++i) {
    std::string name = "x" + std::to_string(i);
    if (k >= b.wrt.size() || b.wrt[k] != name) continue;
    ++k;
    auto [lo, hi] = i < c.ranges.size() ? c.ranges[i] : std::pair<double, double>{-1.0, 1.0};
    std::uniform_real_distribution<double> u(lo, hi);
    Tensor t = Tensor::empty(DType::Float64, c.input_shapes[i]);
    for (double& v : t.span<double>()) {
      do v = u(rng);
      while (c.avoid_zero && std::abs(v) < 0.1);
      if (c.random_sign && (rng() & 1)) v = -v;
    }
    xs.push_back(std::move(t));
  }
  return xs;
}

double objective(Executor& ex, const std::vector<Tensor>& xs) {
  std::vector<const Tensor*> p;
  for (const Tensor& x : xs) p.push_back(&x);
  return *ex.run(std::span<const Tensor* const>(p))[0]->ptr<double>();
}

TEST(GradCheck, EveryRuleHasACase) {
  std::set<std::pair<std::string, std::string>> covered;
  for (const auto& c : test::rule_cases()) covered.insert({c.domain, c.op});
  // Control flow reads values from the enclosing scope, which a one-node case cannot express: its rules are
  // checked against central differences on whole models in the file named here.
  static const std::map<std::string, std::string> checked_elsewhere = {
      {"If", "tests/gradients/test_control_flow_gradients.cpp"}, {"Scan", "tests/gradients/test_control_flow_gradients.cpp"},
      {"Loop", "tests/gradients/test_control_flow_gradients.cpp"}};
  for (const auto& op : default_rules().ops())
    EXPECT_TRUE(covered.count(op) || (op.first.empty() && checked_elsewhere.count(op.second))) << "gradient rule for '" << (op.first.empty() ? "" : op.first + ".") << op.second
                                   << "' has no case in tests/gradients/rule_cases.cpp";
}

class GradCheckCase : public ::testing::TestWithParam<size_t> {};

TEST_P(GradCheckCase, MatchesCentralDifferences) {
  const test::RuleCase& c = test::rule_cases()[GetParam()];
  SCOPED_TRACE(c.label);
  std::mt19937 rng(1234 + static_cast<unsigned>(GetParam()));
  Built b = build_case(c, rng);
  Executor ex(b.model.graph, b.model.opset_imports, std::make_shared<TensorStore>());
  std::vector<Tensor> xs = sample_inputs(c, b, rng);
  std::vector<const Tensor*> p;
  for (const Tensor& x : xs) p.push_back(&x);
  std::vector<Tensor> analytic;
  for (const Tensor* t : ex.run(std::span<const Tensor* const>(p)).subspan(1)) analytic.push_back(t->clone());

  const double eps = 1e-6;
  for (size_t k = 0; k < xs.size(); ++k) {
    ASSERT_EQ(analytic[k].shape, xs[k].shape) << "gradient of " << b.wrt[k] << " has the wrong shape";
    std::span<double> x = xs[k].span<double>();
    std::span<const double> ga = analytic[k].span<double>();
    if (x.size() <= 256) {
      for (size_t e = 0; e < x.size(); ++e) {
        double keep = x[e];
        x[e] = keep + eps;
        double up = objective(ex, xs);
        x[e] = keep - eps;
        double down = objective(ex, xs);
        x[e] = keep;
        double numeric = (up - down) / (2 * eps);
        EXPECT_NEAR(ga[e], numeric, 1e-6 + 1e-5 * std::abs(numeric)) << b.wrt[k] << "[" << e << "]";
      }
    } else {
      // Random projection: u . grad against the directional derivative along u.
      std::normal_distribution<double> nd;
      for (int trial = 0; trial < 3; ++trial) {
        std::vector<double> u(x.size()), keep(x.begin(), x.end());
        for (double& v : u) v = nd(rng);
        double dot = 0;
        for (size_t e = 0; e < x.size(); ++e) dot += u[e] * ga[e];
        for (size_t e = 0; e < x.size(); ++e) x[e] = keep[e] + eps * u[e];
        double up = objective(ex, xs);
        for (size_t e = 0; e < x.size(); ++e) x[e] = keep[e] - eps * u[e];
        double down = objective(ex, xs);
        std::copy(keep.begin(), keep.end(), x.begin());
        double numeric = (up - down) / (2 * eps);
        EXPECT_NEAR(dot, numeric, 1e-5 + 1e-5 * std::abs(numeric)) << b.wrt[k] << " projection " << trial;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Rules, GradCheckCase, ::testing::Range<size_t>(0, test::rule_cases().size()),
                         [](const ::testing::TestParamInfo<size_t>& i) {
                           std::string s = test::rule_cases()[i.param].label;
                           for (char& ch : s)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return s + "_" + std::to_string(i.param);
                         });

}  // namespace
}  // namespace onnxtrain
