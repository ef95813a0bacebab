// TrainingSession::run_forward / run_backward (docs/yield.md): the Yield boundary on a training session's own
// weights. The gradients of a hand-differentiated loss equal gradients() for that loss; the forward and backward
// see what train_step and set_weight did to the weights; a missing output gradient is zeros; inputs requiring
// grad survive a checkpoint; errors name what is wrong.
#include <gtest/gtest.h>

#include "training/session.h"
#include "training/yield_test_util.h"

namespace onnxtrain {
namespace {

using namespace test;

TrainingConfig sgd_config(std::vector<std::string> inputs_requiring_grad = {}) {
  TrainingConfig c;
  c.optimizer.kind = "sgd";
  c.optimizer.learning_rate = 0.1;
  c.inputs_requiring_grad = std::move(inputs_requiring_grad);
  return c;
}

// run_forward + run_backward(d mse / dy) against gradients() with the mse loss, on the session's current weights.
void expect_matches_gradients(TrainingSession& s, const Tensor& x, const Tensor& t) {
  std::vector<Tensor> y = s.run_forward({{"x", x}});
  ASSERT_EQ(y.size(), 1u);
  EXPECT_LT(rel_diff<float>(y[0], s.infer({{"x", x}}).at(0)), 1e-6);
  auto grads = s.run_backward({mse_grad(y[0], t)});
  auto ref = s.gradients({{"x", x}, {s.target_name(), t}});
  for (const std::string& w : s.trainable()) {
    ASSERT_TRUE(grads.count(w)) << w;
    EXPECT_LT(rel_diff<float>(grads.at(w), ref.grads.at(w)), 1e-6) << w;
    EXPECT_GT(max_abs(ref.grads.at(w)), 0) << w;
  }
}

TEST(RunForwardBackward, MatchesGradientsAndFollowsTrainStep) {
  auto dir = temp_dir("rfb_mlp");
  TrainingSession s = TrainingSession::from_file(make_mlp(dir, "5 12 3"), sgd_config());
  Tensor x = random_tensor<float>(DType::Float32, {7, 5}, 1);
  Tensor t = random_tensor<float>(DType::Float32, {7, 3}, 2);
  expect_matches_gradients(s, x, t);
  std::vector<Tensor> before = s.run_forward({{"x", x}});

  // A step changes the weights in the shared store: the next forward and backward use the new ones.
  s.train_step({{"x", x}, {s.target_name(), t}});
  std::vector<Tensor> after = s.run_forward({{"x", x}});
  EXPECT_GT(rel_diff<float>(after[0], before[0]), 1e-4) << "run_forward did not see the updated weights";
  expect_matches_gradients(s, x, t);

  // set_weight likewise.
  const std::string w = s.trainable().front();
  s.set_weight(w, zeros(DType::Float32, s.get_weight(w).shape));
  expect_matches_gradients(s, x, t);
}

TEST(RunForwardBackward, WeightUpdatesThroughGradientsMatchTrainStep) {
  // An outside optimizer (plain SGD here) applied to run_backward's gradients lands on the weights train_step
  // gives: the two paths differentiate the same function of the same weights.
  auto dir = temp_dir("rfb_sgd");
  auto path = make_mlp(dir, "4 8 2");
  TrainingSession a = TrainingSession::from_file(path, sgd_config());
  TrainingSession b = TrainingSession::from_file(path, sgd_config());
  Tensor x = random_tensor<float>(DType::Float32, {6, 4}, 3);
  Tensor t = random_tensor<float>(DType::Float32, {6, 2}, 4);
  for (int step = 0; step < 3; ++step) {
    a.train_step({{"x", x}, {a.target_name(), t}});
    std::vector<Tensor> y = b.run_forward({{"x", x}});
    auto grads = b.run_backward({mse_grad(y[0], t)});
    for (const std::string& w : b.trainable()) {
      Tensor v = b.get_weight(w);
      for (int64_t i = 0; i < v.numel(); ++i) v.ptr<float>()[i] -= 0.1f * grads.at(w).ptr<float>()[i];
      b.set_weight(w, v);
    }
  }
  for (const std::string& w : a.trainable()) EXPECT_LT(rel_diff<float>(b.get_weight(w), a.get_weight(w)), 1e-5) << w;
}

TEST(RunForwardBackward, MissingGradientIsZerosAndInputGradientIsReturned) {
  auto dir = temp_dir("rfb_zero");
  TrainingSession s = TrainingSession::from_file(make_mlp(dir, "3 6 2"), sgd_config({"x"}));
  Tensor x = random_tensor<float>(DType::Float32, {4, 3}, 5);
  s.run_forward({{"x", x}});
  auto grads = s.run_backward({std::nullopt});
  ASSERT_EQ(grads.size(), s.trainable().size() + 1);
  for (const auto& [name, g] : grads) EXPECT_EQ(max_abs(g), 0) << name;

  Tensor dy = random_tensor<float>(DType::Float32, {4, 2}, 6);
  grads = s.run_backward({dy});
  ASSERT_TRUE(grads.count("x"));
  EXPECT_EQ(grads.at("x").shape, x.shape);
  // Linear in the output gradient: doubling it doubles every gradient (x's included).
  Tensor dy2 = dy.clone();
  for (float& v : dy2.span<float>()) v *= 2;
  auto grads2 = s.run_backward({dy2});
  for (const auto& [name, g] : grads) {
    Tensor twice = g.clone();
    for (float& v : twice.span<float>()) v *= 2;
    EXPECT_GT(max_abs(g), 0) << name;
    EXPECT_LT(rel_diff<float>(grads2.at(name), twice), 1e-6) << name;
  }
}

TEST(RunForwardBackward, InputsRequiringGradSurviveACheckpoint) {
  auto dir = temp_dir("rfb_ckpt");
  TrainingSession s = TrainingSession::from_file(make_mlp(dir, "3 5 1"), sgd_config({"x"}));
  Tensor x = random_tensor<float>(DType::Float32, {2, 3}, 7);
  Tensor t = random_tensor<float>(DType::Float32, {2, 1}, 8);
  s.train_step({{"x", x}, {s.target_name(), t}});
  s.save_checkpoint(dir / "ckpt.onnx");
  TrainingSession r = TrainingSession::from_checkpoint(dir / "ckpt.onnx");
  s.run_forward({{"x", x}});
  r.run_forward({{"x", x}});
  Tensor dy = random_tensor<float>(DType::Float32, {2, 1}, 9);
  auto a = s.run_backward({dy});
  auto b = r.run_backward({dy});
  ASSERT_TRUE(b.count("x"));
  for (const auto& [name, g] : a) EXPECT_LT(rel_diff<float>(b.at(name), g), 1e-6) << name;
}

TEST(RunForwardBackward, ErrorsNameTheProblem) {
  auto dir = temp_dir("rfb_err");
  auto path = make_mlp(dir, "3 4 2");
  Tensor x = random_tensor<float>(DType::Float32, {2, 3}, 10);
  {
    TrainingSession s = TrainingSession::from_file(path, sgd_config());
    EXPECT_NE(error_of([&] { s.run_backward({std::nullopt}); }).find("before run_forward"), std::string::npos);
    s.run_forward({{"x", x}});
    std::string e = error_of([&] { s.run_backward({random_tensor<float>(DType::Float32, {2, 3}, 11)}); });
    EXPECT_NE(e.find("expected float32[2,2]"), std::string::npos) << e;
    e = error_of([&] { s.run_backward({std::nullopt, std::nullopt}); });
    EXPECT_NE(e.find("expected 1 output gradients"), std::string::npos) << e;
    e = error_of([&] { s.run_forward({{"y", x}}); });
    EXPECT_NE(e.find("'x'"), std::string::npos) << e;
  }
  TrainingSession s = TrainingSession::from_file(path, sgd_config({"nope"}));
  std::string e = error_of([&] { s.run_forward({{"x", x}}); });
  EXPECT_NE(e.find("input 'nope'"), std::string::npos) << e;
  EXPECT_NE(e.find("requires grad but is not an input"), std::string::npos) << e;
}

}  // namespace
}  // namespace onnxtrain
