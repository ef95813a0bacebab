// Normalization gradients the table-driven checker (test_gradcheck.cpp) cannot cover:
// - GroupNormalization on 4-D inputs against central differences, declaring its output type by hand so
//   the check does not depend on graph/shape_inference.cpp's fallback for it (ONNX 1.16 has no inference
//   for GroupNormalization, a function-only schema).
// - LayerNormalization in float32, whose rule takes a different path (statistics from a second
//   LayerNormalization node feeding onnxtrain.LayerNormalizationGrad) than in float64 (statistics from
//   standard ops): the float32 gradients must match the float64 ones, which the checker verifies.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "executor/executor.h"
#include "gradients/builder.h"
#include "graph/expr.h"
#include "graph/shape_inference.h"

namespace onnxtrain {
namespace {

// Gradients of sum(Y * R), Y the node's first output, with respect to every input, against central
// differences in float64; `fused_op`, when given, must appear in the gradient graph.
void check_numeric(Node n, int64_t opset, const std::vector<std::vector<int64_t>>& shapes, size_t outputs,
                   const std::string& fused_op = {}) {
  const std::vector<int64_t> xshape = shapes[0];
  std::mt19937 rng(77 + opset);
  Model m;
  m.opset_imports[""] = opset;
  m.opset_imports["onnxtrain"] = 1;
  Graph& g = m.graph;
  std::vector<std::string> wrt;
  n.name = "under_test";
  for (size_t i = 0; i < shapes.size(); ++i) {
    Shape s;
    for (int64_t d : shapes[i]) s.push_back(Dim::of(d));
    std::string name = "x" + std::to_string(i);
    g.inputs.push_back({name, {DType::Float64, s}});
    n.inputs.push_back(name);
    wrt.push_back(name);
  }
  for (size_t o = 0; o < outputs; ++o) n.outputs.push_back("y" + std::to_string(o));
  g.nodes.push_back(n);
  infer_shapes(m);
  g.value_info["y0"] = g.inputs[0].type;  // what ONNX's inference does not provide for GroupNormalization

  GraphBuilder gb(g, "check/");
  TensorData r;
  r.dtype = DType::Float64;
  r.dims = xshape;
  r.bytes.resize(r.numel() * sizeof(double));
  std::normal_distribution<double> nd;
  for (double& v : r.as_mut<double>()) v = nd(rng);
  Expr obj = reduce_sum_all(value(gb, "y0") * constant(gb, r));
  Expr seed = scalar(gb, DType::Float64, 1.0);
  GradientRequest req;
  req.wrt = wrt;
  req.outputs = {obj.name};
  req.output_grads = {seed.name};
  auto grads = build_gradients(g, m.opset_imports, req).grads;
  if (!fused_op.empty()) {
    EXPECT_TRUE(std::any_of(g.nodes.begin(), g.nodes.end(), [&](const Node& x) { return x.op_type == fused_op; }))
        << fused_op << " not in the gradient graph";
  }
  g.outputs.push_back({obj.name, obj.type});
  for (const std::string& w : wrt) g.outputs.push_back({grads.at(w), *g.type_of(w)});

  Executor ex(g, m.opset_imports, std::make_shared<TensorStore>());
  std::vector<Tensor> xs;
  for (const auto& s : shapes) {
    Tensor t = Tensor::empty(DType::Float64, s);
    std::uniform_real_distribution<double> u(-1, 1);
    for (double& v : t.span<double>()) v = u(rng);
    xs.push_back(std::move(t));
  }
  auto run = [&]() {
    std::vector<const Tensor*> p;
    for (const Tensor& x : xs) p.push_back(&x);
    return ex.run(std::span<const Tensor* const>(p));
  };
  std::vector<Tensor> analytic;
  for (const Tensor* t : run().subspan(1)) analytic.push_back(t->clone());
  const double eps = 1e-6;
  for (size_t k = 0; k < xs.size(); ++k) {
    ASSERT_EQ(analytic[k].shape, xs[k].shape) << wrt[k];
    std::span<double> x = xs[k].span<double>();
    for (size_t e = 0; e < x.size(); ++e) {
      const double keep = x[e];
      x[e] = keep + eps;
      const double up = *run()[0]->ptr<double>();
      x[e] = keep - eps;
      const double down = *run()[0]->ptr<double>();
      x[e] = keep;
      const double numeric = (up - down) / (2 * eps);
      EXPECT_NEAR(analytic[k].ptr<double>()[e], numeric, 1e-6 + 1e-5 * std::abs(numeric)) << wrt[k] << "[" << e << "]";
    }
  }
}

// Gradients of sum(LayerNormalization(X, Scale, B) * R) w.r.t. X, Scale, B with inputs of type t, and whether
// the backward graph used the fused op.
std::vector<std::vector<double>> layer_norm_grads(DType t, bool& fused, int64_t axis = -1) {
  const std::vector<int64_t> xs{4, 3, 8};
  const std::vector<int64_t> ps(xs.begin() + (axis < 0 ? axis + 3 : axis), xs.end());
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<std::vector<double>> vals;
  for (const auto* s : {&xs, &ps, &ps, &xs}) {
    int64_t n = 1;
    for (int64_t d : *s) n *= d;
    std::vector<double> v(n);
    for (double& e : v) e = u(rng);
    vals.push_back(v);
  }
  auto tensor = [&](const std::vector<double>& v, const std::vector<int64_t>& shape) {
    Tensor x = Tensor::empty(t, shape);
    for (size_t i = 0; i < v.size(); ++i) {
      if (t == DType::Float32)
        x.ptr<float>()[i] = static_cast<float>(v[i]);
      else
        x.ptr<double>()[i] = v[i];
    }
    return x;
  };
  Model m;
  m.opset_imports[""] = 17;
  m.opset_imports["onnxtrain"] = 1;
  Graph& g = m.graph;
  auto shape_of = [](const std::vector<int64_t>& d) {
    Shape s;
    for (int64_t v : d) s.push_back(Dim::of(v));
    return s;
  };
  g.inputs = {{"X", {t, shape_of(xs)}}, {"S", {t, shape_of(ps)}}, {"B", {t, shape_of(ps)}}};
  Node n;
  n.name = "ln";
  n.op_type = "LayerNormalization";
  n.inputs = {"X", "S", "B"};
  n.outputs = {"Y"};
  n.attributes = {{"epsilon", 1e-3f}, {"axis", axis}};
  g.nodes.push_back(n);
  Tensor r = tensor(vals[3], xs);
  g.initializers["R"] = r.to_data();
  infer_shapes(m);
  GraphBuilder gb(g, "check/");
  Expr obj = reduce_sum_all(value(gb, "Y") * value(gb, "R"));
  GradientRequest req;
  req.wrt = {"X", "S", "B"};
  req.outputs = {obj.name};
  req.output_grads = {scalar(gb, t, 1.0).name};
  auto grads = build_gradients(g, m.opset_imports, req).grads;
  fused = false;
  for (const Node& node : g.nodes) fused = fused || node.op_type == "LayerNormalizationGrad";
  for (const std::string& w : req.wrt) g.outputs.push_back({grads.at(w), *g.type_of(w)});
  Executor ex(g, m.opset_imports, std::make_shared<TensorStore>());
  std::vector<Tensor> out = ex.run({{"X", tensor(vals[0], xs)}, {"S", tensor(vals[1], ps)}, {"B", tensor(vals[2], ps)}});
  std::vector<std::vector<double>> res;
  for (const Tensor& o : out) {
    std::vector<double> v;
    for (int64_t i = 0; i < o.numel(); ++i)
      v.push_back(t == DType::Float32 ? o.ptr<float>()[i] : o.ptr<double>()[i]);
    res.push_back(v);
  }
  return res;
}

void expect_float32_matches_float64(int64_t axis) {
  bool fused32 = false, fused64 = false;
  auto g32 = layer_norm_grads(DType::Float32, fused32, axis);
  auto g64 = layer_norm_grads(DType::Float64, fused64, axis);
  EXPECT_TRUE(fused32);
  EXPECT_TRUE(fused64);
  ASSERT_EQ(g32.size(), 3u);
  ASSERT_EQ(g64.size(), 3u);
  for (size_t k = 0; k < 3; ++k) {
    ASSERT_EQ(g32[k].size(), g64[k].size());
    for (size_t i = 0; i < g32[k].size(); ++i) EXPECT_NEAR(g32[k][i], g64[k][i], 1e-4 * (1 + std::abs(g64[k][i]))) << k << "[" << i << "]";
  }
}

TEST(LayerNormGrad, Float32FusedPathMatchesFloat64) { expect_float32_matches_float64(-1); }
// An inner axis: the statistics node and the fused op normalise the last two dims ([3, 8] rows).
TEST(LayerNormGrad, Float32FusedPathMatchesFloat64InnerAxis) { expect_float32_matches_float64(1); }

void check_group_norm(int64_t opset, std::vector<int64_t> xshape, int64_t groups, int64_t nparams) {
  Node n;
  n.op_type = "GroupNormalization";
  n.attributes = {{"num_groups", groups}, {"epsilon", 1e-3f}};
  check_numeric(n, opset, {xshape, {nparams}, {nparams}}, 1);
}

// Training-mode BatchNormalization whose running statistics reach no loss (as in exported models): the rule
// leaves out their terms and uses onnxtrain.BatchNormalizationGrad alone.
TEST(BatchNormGrad, TrainingFusedWithoutRunningStatGradients) {
  Node n;
  n.op_type = "BatchNormalization";
  n.attributes = {{"training_mode", int64_t{1}}, {"epsilon", 1e-2f}};
  check_numeric(n, 15, {{3, 2, 3, 2}, {2}, {2}, {2}, {2}}, 3, "BatchNormalizationGrad");
}

TEST(GroupNormGrad, Opset21PerChannel) { check_group_norm(21, {2, 4, 3}, 2, 4); }
TEST(GroupNormGrad, Opset21Spatial2D) { check_group_norm(21, {2, 6, 2, 2}, 3, 6); }
TEST(GroupNormGrad, Opset18PerGroup) { check_group_norm(18, {2, 6, 2, 2}, 3, 3); }

}  // namespace
}  // namespace onnxtrain
