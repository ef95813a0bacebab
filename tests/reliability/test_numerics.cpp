// Numerical guards: a NaN/Inf in the loss or a gradient is caught on the step it appears, the step's update is
// not applied, and the report names the step and the tensor (docs/reliability.md).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "executor/finite.h"
#include "graph/graph_test_util.h"
#include "reliability/models.h"
#include "training/checkpoint.h"
#include "training/session.h"

namespace onnxtrain {
namespace {

using test::expect_error;

const float kNaN = std::numeric_limits<float>::quiet_NaN();

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype == b.dtype && a.shape == b.shape && std::memcmp(a.data, b.data, a.nbytes()) == 0;
}

// Every weight and every optimizer state tensor, to show that a rejected step changed nothing.
std::map<std::string, Tensor> snapshot(const TrainingSession& s) {
  std::map<std::string, Tensor> all = s.weights();
  for (const std::string& n : s.state_names()) all[n] = s.state(n);
  return all;
}

void expect_unchanged(const std::map<std::string, Tensor>& before, const TrainingSession& s) {
  std::map<std::string, Tensor> now = snapshot(s);
  ASSERT_EQ(before.size(), now.size());
  for (const auto& [name, t] : before) EXPECT_TRUE(same_bytes(t, now.at(name))) << name << " changed";
}

Feeds linear_batch(const TrainingSession& s, float start = 0.1f) {
  return {{"x", test::filled({4, 3}, start, 0.2f)}, {s.target_name(), test::filled({4, 1}, 0.5f, -0.1f)}};
}

TEST(NonFinite, NaNLossRaisesNamingTheStepAndAppliesNothing) {
  TrainingConfig c;
  c.optimizer.kind = "adam";
  TrainingSession s(test::linear_model(3, 1), c);
  Feeds good = linear_batch(s);
  s.train_step(good);
  s.train_step(good);
  Feeds bad = good;
  bad["x"] = good.at("x").clone();
  bad["x"].ptr<float>()[5] = kNaN;
  const auto before = snapshot(s);
  expect_error([&] { s.train_step(bad); },
               {"training step 3", "optimizer step 3", "the loss", "went non-finite", "not applied", "1 of 1"});
  EXPECT_EQ(s.step(), 2);
  expect_unchanged(before, s);
  // The session is still usable, and the next good step is the third update.
  EXPECT_TRUE(std::isfinite(s.train_step(good)));
  EXPECT_EQ(s.step(), 3);
}

TEST(NonFinite, ErrorTypeCarriesTheTensorName) {
  TrainingSession s(test::sqrt_model(), {});
  Feeds f{{"x", test::filled({3, 2}, 1.0f, 0.5f)}, {s.target_name(), test::filled({3, 2}, 0.0f, 0.1f)}};
  try {
    s.train_step(f);
    FAIL() << "no error";
  } catch (const NonFiniteError& e) {
    EXPECT_EQ(e.value(), "w_grad") << e.what();
  }
}

TEST(NonFinite, InfGradientWithFiniteLossNamesTheWeight) {
  // sqrt(0) = 0 keeps the loss finite, but d sqrt(w)/dw = 1 / (2 sqrt(w)) is Inf at w = 0.
  TrainingSession s(test::sqrt_model(), {});
  Feeds f{{"x", test::filled({3, 2}, 1.0f, 0.5f)}, {s.target_name(), test::filled({3, 2}, 0.0f, 0.1f)}};
  EXPECT_TRUE(std::isfinite(s.gradients(f).loss));
  const auto before = snapshot(s);
  expect_error([&] { s.train_step(f); },
               {"training step 1", "the gradient of 'w'", "'w_grad' float32[2]", "1 of 2 elements", "flat index 0"});
  EXPECT_EQ(s.step(), 0);
  expect_unchanged(before, s);
}

TEST(NonFinite, SkipPolicyCountsAndContinues) {
  TrainingConfig c;
  c.on_non_finite = "skip";
  TrainingSession s(test::sqrt_model(), c);
  Feeds f{{"x", test::filled({3, 2}, 1.0f, 0.5f)}, {s.target_name(), test::filled({3, 2}, 0.0f, 0.1f)}};
  const auto before = snapshot(s);
  EXPECT_TRUE(std::isnan(s.train_step(f)));
  EXPECT_TRUE(std::isnan(s.train_step(f)));
  EXPECT_EQ(s.skipped_steps(), 2);
  EXPECT_EQ(s.step(), 0);
  expect_unchanged(before, s);
  EXPECT_NE(s.last_skip_reason().find("training step 2"), std::string::npos) << s.last_skip_reason();
  EXPECT_NE(s.last_skip_reason().find("the gradient of 'w'"), std::string::npos) << s.last_skip_reason();
  // Away from the singularity the same session trains.
  s.set_weight("w", Tensor::from_vector<float>({2}, {1.0f, 1.0f}));
  EXPECT_TRUE(std::isfinite(s.train_step(f)));
  EXPECT_EQ(s.step(), 1);
  EXPECT_EQ(s.skipped_steps(), 2);
}

TEST(NonFinite, SkippedMicroBatchDoesNotPolluteGradientAccumulation) {
  TrainingConfig c;
  c.on_non_finite = "skip";
  c.optimizer.gradient_accumulation = 2;
  c.optimizer.momentum = 0.9;
  TrainingSession guarded(test::linear_model(3, 1), c);
  TrainingSession reference(test::linear_model(3, 1), c);
  Feeds a = linear_batch(guarded, 0.1f), b = linear_batch(guarded, -0.4f);
  Feeds bad = a;
  bad["x"] = a.at("x").clone();
  bad["x"].ptr<float>()[0] = std::numeric_limits<float>::infinity();
  guarded.train_step(a);
  EXPECT_TRUE(std::isnan(guarded.train_step(bad)));  // the N-th micro-batch: the update is dropped
  guarded.train_step(b);
  reference.train_step(a);
  reference.train_step(b);
  EXPECT_EQ(guarded.step(), 1);
  EXPECT_EQ(guarded.skipped_steps(), 1);
  for (const auto& [name, t] : reference.weights()) EXPECT_TRUE(same_bytes(t, guarded.get_weight(name))) << name;
}

TEST(NonFinite, CheckEveryValueNamesTheFirstNode) {
  TrainingConfig c;
  c.check_every_value = true;
  TrainingSession s(test::sqrt_model(), c);
  Feeds f{{"x", test::filled({3, 2}, 1.0f, 0.5f)}, {s.target_name(), test::filled({3, 2}, 0.0f, 0.1f)}};
  // The Inf first appears inside the backward pass, in the node differentiating Sqrt, long before 'w_grad'.
  std::string msg = expect_error([&] { s.train_step(f); }, {"training step 1", "node '", "first non-finite value"});
  EXPECT_EQ(msg.find("the gradient of 'w'"), std::string::npos) << msg;
  // A NaN fed in is reported at the first node reading it: the forward Mul.
  Feeds bad = f;
  bad["x"] = f.at("x").clone();
  bad["x"].ptr<float>()[1] = kNaN;
  s.set_weight("w", Tensor::from_vector<float>({2}, {1.0f, 1.0f}));
  expect_error([&] { s.train_step(bad); }, {"training step 2", "(Mul)", "output 'y'", "1 of 6"});
  EXPECT_EQ(s.step(), 0);
}

TEST(NonFinite, PolicyIsValidatedAndSurvivesCheckpoints) {
  TrainingConfig c;
  c.on_non_finite = "ignore";
  expect_error([&] { TrainingSession(test::linear_model(3, 1), c); }, {"on_non_finite", "'raise' or 'skip'", "'ignore'"});
  c.on_non_finite = "skip";
  c.check_every_value = true;
  TrainingSession s(test::linear_model(3, 1), c);
  s.train_step(linear_batch(s));
  TrainingSession back = TrainingSession::from_checkpoint(s.checkpoint(), "ckpt");
  TrainingConfig read = config_from_metadata(config_to_metadata(c), "meta");
  EXPECT_EQ(read.on_non_finite, "skip");
  EXPECT_TRUE(read.check_every_value);
  EXPECT_EQ(back.step(), 1);
}

TEST(CountNonFinite, EveryFloatingDtype) {
  Tensor f32 = Tensor::from_vector<float>({4}, {1.0f, kNaN, 2.0f, -std::numeric_limits<float>::infinity()});
  NonFiniteCount c = count_non_finite(f32);
  EXPECT_EQ(c.count, 2);
  EXPECT_EQ(c.first, 1);
  EXPECT_NE(describe_non_finite(f32, c).find("2 of 4 elements are NaN or Inf (the first at flat index 1 is nan)"),
            std::string::npos);
  Tensor f64 = Tensor::from_vector<double>({3}, {0.0, 1.0, std::numeric_limits<double>::infinity()});
  EXPECT_EQ(count_non_finite(f64).count, 1);
  EXPECT_NE(describe_non_finite(f64, count_non_finite(f64)).find("is inf"), std::string::npos);
  // float16: 0x3C00 = 1, 0x7C00 = +Inf, 0xFE00 = NaN; bfloat16: 0x3F80 = 1, 0xFF80 = -Inf.
  auto half = [](DType t, std::vector<uint16_t> bits) {
    Tensor h = Tensor::empty(t, {static_cast<int64_t>(bits.size())});
    std::copy(bits.begin(), bits.end(), h.ptr<uint16_t>());
    return h;
  };
  Tensor f16 = half(DType::Float16, {0x3C00, 0x7C00, 0xFE00});
  EXPECT_EQ(count_non_finite(f16).count, 2);
  Tensor bf16 = half(DType::BFloat16, {0x3F80, 0xFF80});
  EXPECT_EQ(count_non_finite(bf16).count, 1);
  EXPECT_NE(describe_non_finite(bf16, count_non_finite(bf16)).find("is -inf"), std::string::npos);
  Tensor ints = Tensor::from_vector<int64_t>({2}, {1, 2});
  EXPECT_EQ(count_non_finite(ints).count, 0);
}

}  // namespace
}  // namespace onnxtrain
