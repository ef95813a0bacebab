// The Yield boundary (docs/yield.md): run_forward + run_backward with hand-computed output gradients must give
// the gradients TrainingSession computes for the same loss; missing gradients are zeros; input gradients
// agree with central differences in float64; the Yield graph and its two halves are valid graphs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>

#include "common/test_env.h"
#include "graph/error.h"
#include "graph/shape_inference.h"
#include "graph/validate.h"
#include "training/forward_backward.h"
#include "training/session.h"
#include "training/yield_test_util.h"

namespace onnxtrain {
namespace {

using namespace test;

// x[batch,3] -> a = Tanh(Gemm(x, W1, b1)) -> out1 = a W2 [batch,2], out2 = Sigmoid(a W3) * x0 [batch,1],
// where x0 = x[:, 0:1] through Slice so x reaches out2 both through the network and directly.
template <class T>
Model two_output_model(DType dt) {
  std::mt19937 rng(3);
  std::normal_distribution<double> nd;
  auto init = [&](std::vector<int64_t> dims) {
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    std::vector<T> v(static_cast<size_t>(n));
    for (T& e : v) e = T(0.6 * nd(rng));
    return TensorData::from<T>(dims, std::span<const T>(v));
  };
  Model m;
  m.opset_imports[""] = 18;
  Graph& g = m.graph;
  g.name = "two_outputs";
  Shape batch3{Dim::sym("batch"), Dim::of(3)};
  g.inputs.push_back({"x", TypeInfo{dt, batch3}});
  g.initializers["W1"] = init({3, 4});
  g.initializers["b1"] = init({4});
  g.initializers["W2"] = init({4, 2});
  g.initializers["W3"] = init({4, 1});
  const std::vector<int64_t> s0{0}, e1{1}, ax{1};
  g.initializers["starts"] = TensorData::from<int64_t>({1}, std::span<const int64_t>(s0));
  g.initializers["ends"] = TensorData::from<int64_t>({1}, std::span<const int64_t>(e1));
  g.initializers["axes"] = TensorData::from<int64_t>({1}, std::span<const int64_t>(ax));
  auto node = [&](std::string op, std::vector<std::string> in, std::string out) {
    Node n;
    n.name = out + "_node";
    n.op_type = std::move(op);
    n.inputs = std::move(in);
    n.outputs = {std::move(out)};
    g.nodes.push_back(std::move(n));
  };
  node("Gemm", {"x", "W1", "b1"}, "h");
  node("Tanh", {"h"}, "a");
  node("MatMul", {"a", "W2"}, "out1");
  node("MatMul", {"a", "W3"}, "s");
  node("Sigmoid", {"s"}, "sig");
  node("Slice", {"x", "starts", "ends", "axes"}, "x0");
  node("Mul", {"sig", "x0"}, "out2");
  g.outputs.push_back({"out1", TypeInfo{dt, Shape{Dim::sym("batch"), Dim::of(2)}}});
  g.outputs.push_back({"out2", TypeInfo{dt, Shape{Dim::sym("batch"), Dim::of(1)}}});
  infer_shapes(m);  // TrainingSession expects the types that load_model fills in
  return m;
}

const std::vector<std::string> kTwoOutputWeights{"W1", "b1", "W2", "W3"};

TEST(ForwardBackward, MlpMatchesTrainingSessionGradients) {
  auto dir = test::temp_dir("fb_mlp");
  auto path = make_mlp(dir, "6 16 16 2");
  TrainingSession ts = TrainingSession::from_file(path, {});
  ForwardBackwardSession fb = ForwardBackwardSession::from_file(path);
  Tensor x = random_tensor<float>(DType::Float32, {10, 6}, 1);
  Tensor t = random_tensor<float>(DType::Float32, {10, 2}, 2);
  auto ref = ts.gradients({{"x", x}, {ts.target_name(), t}});

  std::vector<Tensor> y = fb.run_forward({{"x", x}});
  ASSERT_EQ(y.size(), 1u);
  ASSERT_EQ(y[0].shape, (std::vector<int64_t>{10, 2}));
  auto grads = fb.run_backward({mse_grad(y[0], t)});
  ASSERT_EQ(grads.size(), ref.grads.size());
  for (const auto& [w, g] : ref.grads) {
    ASSERT_TRUE(grads.count(w)) << w;
    EXPECT_GT(max_abs(g), 0) << w;  // a meaningful comparison
    EXPECT_LE(rel_diff<float>(grads.at(w), g), 1e-6) << w;
  }
  // Backward may run again on the same forward pass.
  auto again = fb.run_backward({mse_grad(y[0], t)});
  for (const auto& [w, g] : grads) EXPECT_EQ(rel_diff<float>(again.at(w), g), 0) << w;
}

TEST(ForwardBackward, MlpMissingGradientIsZeros) {
  auto dir = test::temp_dir("fb_mlp_zero");
  ForwardBackwardSession fb = ForwardBackwardSession::from_file(make_mlp(dir, "6 16 16 2"));
  Tensor x = random_tensor<float>(DType::Float32, {4, 6}, 5);
  auto y = fb.run_forward({{"x", x}});
  auto missing = fb.run_backward({std::nullopt});
  auto zero = fb.run_backward({zeros(DType::Float32, y[0].shape)});
  ASSERT_EQ(missing.size(), 6u);
  for (const auto& [w, g] : zero) {
    EXPECT_EQ(max_abs(missing.at(w)), 0) << w;
    EXPECT_EQ(max_abs(g), 0) << w;
  }
}

TEST(ForwardBackward, TwoOutputsMatchTrainingSessionPerOutputAndAddUp) {
  const Model m = two_output_model<float>(DType::Float32);
  ForwardBackwardSession fb(m, kTwoOutputWeights);
  Tensor x = random_tensor<float>(DType::Float32, {7, 3}, 11);
  Tensor t1 = random_tensor<float>(DType::Float32, {7, 2}, 12);
  Tensor t2 = random_tensor<float>(DType::Float32, {7, 1}, 13);
  auto y = fb.run_forward({{"x", x}});
  ASSERT_EQ(y.size(), 2u);
  Tensor g1 = mse_grad(y[0], t1), g2 = mse_grad(y[1], t2);

  std::map<std::string, Tensor> only[2];
  for (int k = 0; k < 2; ++k) {
    TrainingConfig cfg;
    cfg.trainable = kTwoOutputWeights;
    cfg.prediction = k == 0 ? "out1" : "out2";
    TrainingSession ts(m, cfg);
    auto ref = ts.gradients({{"x", x}, {ts.target_name(), k == 0 ? t1 : t2}});
    only[k] = k == 0 ? fb.run_backward({g1, std::nullopt}) : fb.run_backward({std::nullopt, g2});
    for (const std::string& w : kTwoOutputWeights) {
      if ((k == 0 && w == "W3") || (k == 1 && w == "W2")) {  // out1 does not read W3, nor out2 W2
        EXPECT_EQ(max_abs(only[k].at(w)), 0);
        EXPECT_EQ(max_abs(ref.grads.at(w)), 0);
        continue;
      }
      EXPECT_GT(max_abs(ref.grads.at(w)), 0) << cfg.prediction << " " << w;
      EXPECT_LE(rel_diff<float>(only[k].at(w), ref.grads.at(w)), 1e-6) << cfg.prediction << " " << w;
    }
  }
  // nullopt is zeros, and the gradient of a sum of losses is the sum.
  auto zero_for_2 = fb.run_backward({g1, zeros(DType::Float32, {7, 1})});
  auto both = fb.run_backward({g1, g2});
  for (const std::string& w : kTwoOutputWeights) {
    EXPECT_EQ(rel_diff<float>(zero_for_2.at(w), only[0].at(w)), 0) << w;
    Tensor sum = only[0].at(w).clone();
    for (int64_t i = 0; i < sum.numel(); ++i) sum.ptr<float>()[i] += only[1].at(w).ptr<float>()[i];
    EXPECT_LE(rel_diff<float>(both.at(w), sum), 1e-6) << w;
  }
}

// L = sum(c1 * out1) + sum(c2 * out2), so dL/dout_k = c_k; compared with central differences of L.
TEST(ForwardBackward, InputAndWeightGradientsMatchCentralDifferencesFloat64) {
  ForwardBackwardSession fb(two_output_model<double>(DType::Float64), kTwoOutputWeights, {"x"});
  Tensor x = random_tensor<double>(DType::Float64, {5, 3}, 21);
  Tensor c1 = random_tensor<double>(DType::Float64, {5, 2}, 22);
  Tensor c2 = random_tensor<double>(DType::Float64, {5, 1}, 23);
  auto loss = [&](const Tensor& xv) {
    auto y = fb.run_forward({{"x", xv}});
    double l = 0;
    for (int64_t i = 0; i < c1.numel(); ++i) l += c1.ptr<double>()[i] * y[0].ptr<double>()[i];
    for (int64_t i = 0; i < c2.numel(); ++i) l += c2.ptr<double>()[i] * y[1].ptr<double>()[i];
    return l;
  };
  loss(x);
  auto grads = fb.run_backward({c1, c2});
  ASSERT_EQ(grads.size(), 5u);
  ASSERT_TRUE(grads.count("x"));
  const double eps = 1e-6;
  Tensor num = Tensor::empty(DType::Float64, x.shape);
  for (int64_t i = 0; i < x.numel(); ++i) {
    Tensor xp = x.clone(), xm = x.clone();
    xp.ptr<double>()[i] += eps;
    xm.ptr<double>()[i] -= eps;
    num.ptr<double>()[i] = (loss(xp) - loss(xm)) / (2 * eps);
  }
  EXPECT_LE(rel_diff<double>(grads.at("x"), num), 1e-6);

  for (const std::string& w : kTwoOutputWeights) {
    const Tensor w0 = fb.get_weight(w);
    Tensor numw = Tensor::empty(DType::Float64, w0.shape);
    for (int64_t i = 0; i < w0.numel(); ++i) {
      Tensor p = w0.clone(), q = w0.clone();
      p.ptr<double>()[i] += eps;
      q.ptr<double>()[i] -= eps;
      fb.set_weight(w, p);
      const double lp = loss(x);
      fb.set_weight(w, q);
      numw.ptr<double>()[i] = (lp - loss(x)) / (2 * eps);
    }
    fb.set_weight(w, w0);
    EXPECT_LE(rel_diff<double>(grads.at(w), numw), 1e-6) << w;
  }
}

TEST(ForwardBackward, YieldGraphAndItsHalvesAreValid) {
  ForwardBackwardSession fb(two_output_model<float>(DType::Float32), kTwoOutputWeights, {"x"});
  const Graph& g = fb.yield_graph();
  EXPECT_NO_THROW(check_graph(g, "yield graph"));
  EXPECT_NO_THROW(check_graph(fb.forward_graph(), "forward graph"));
  EXPECT_NO_THROW(check_graph(fb.backward_graph(), "backward graph"));
  int yields = 0;
  for (const Node& n : g.nodes)
    if (n.op_type == "Yield") {
      ++yields;
      EXPECT_EQ(n.domain, "onnxtrain");
      EXPECT_EQ(n.inputs, (std::vector<std::string>{"out1", "out2"}));
      EXPECT_EQ(n.outputs, (std::vector<std::string>{"out1_grad_in", "out2_grad_in"}));
    }
  EXPECT_EQ(yields, 1);
  for (const Graph* half : {&fb.forward_graph(), &fb.backward_graph()})
    for (const Node& n : half->nodes) EXPECT_NE(n.op_type, "Yield");
  // The backward half reads its activations only through its inputs: the saved values and the seeds.
  std::vector<std::string> bin;
  for (const ValueInfo& v : fb.backward_graph().inputs) bin.push_back(v.name);
  EXPECT_EQ(bin.size(), fb.saved_names().size() + 2);
  EXPECT_NE(std::find(bin.begin(), bin.end(), "out1_grad_in"), bin.end());
  EXPECT_FALSE(fb.saved_names().empty());
  for (const std::string& s : fb.saved_names()) EXPECT_TRUE(fb.yield_graph().type_of(s)) << s;
  // No weight is a backward input: weights come from the shared store.
  for (const std::string& w : kTwoOutputWeights) EXPECT_EQ(std::find(bin.begin(), bin.end(), w), bin.end()) << w;
}

TEST(ForwardBackward, ErrorsNameTheOutputAndWhatWasExpected) {
  ForwardBackwardSession fb(two_output_model<float>(DType::Float32), kTwoOutputWeights);
  EXPECT_NE(error_of([&] { fb.run_backward({std::nullopt, std::nullopt}); }).find("before run_forward"), std::string::npos);
  Tensor x = random_tensor<float>(DType::Float32, {4, 3}, 31);
  fb.run_forward({{"x", x}});
  std::string e = error_of([&] { fb.run_backward({std::nullopt}); });
  EXPECT_NE(e.find("expected 2 output gradients"), std::string::npos) << e;
  EXPECT_NE(e.find("out2"), std::string::npos) << e;
  e = error_of([&] { fb.run_backward({std::nullopt, zeros(DType::Float32, {4, 2})}); });
  EXPECT_NE(e.find("output 'out2'"), std::string::npos) << e;
  EXPECT_NE(e.find("float32[4,1]"), std::string::npos) << e;
  e = error_of([&] { fb.run_backward({zeros(DType::Float64, {4, 2}), std::nullopt}); });
  EXPECT_NE(e.find("output 'out1'"), std::string::npos) << e;
  EXPECT_NE(e.find("float32[4,2]"), std::string::npos) << e;
  e = error_of([&] { ForwardBackwardSession bad(two_output_model<float>(DType::Float32), {}, {"W1"}); });
  EXPECT_NE(e.find("input 'W1'"), std::string::npos) << e;
}

TEST(ForwardBackward, WeightsSetFromOutsideAreUsed) {
  ForwardBackwardSession fb(two_output_model<float>(DType::Float32), kTwoOutputWeights);
  Tensor x = random_tensor<float>(DType::Float32, {4, 3}, 41);
  auto before = fb.run_forward({{"x", x}});
  EXPECT_GT(max_abs(before[0]), 0);
  fb.set_weight("W2", zeros(DType::Float32, {4, 2}));
  auto after = fb.run_forward({{"x", x}});
  EXPECT_EQ(max_abs(after[0]), 0);
  EXPECT_EQ(rel_diff<float>(after[1], before[1]), 0);  // out2 does not read W2
  EXPECT_EQ(max_abs(fb.get_weight("W2")), 0);
  EXPECT_THROW(fb.set_weight("W2", zeros(DType::Float32, {2, 4})), Error);
  EXPECT_THROW(fb.get_weight("starts"), Error);
}

}  // namespace
}  // namespace onnxtrain
