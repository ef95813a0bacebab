// TrainingConfig::profile: train_step's plan times every step, session.profile() reports them most expensive
// first, and profiling leaves the training itself unchanged (bit for bit). Adam's per-weight updates show up as
// their own op, onnxtrain.AdamUpdate, one step per weight.
#include <gtest/gtest.h>

#include <random>

#include "common/mlp_model.h"
#include "training/session.h"

namespace onnxtrain {
namespace {

Feeds batch(std::mt19937& rng, const std::string& target) {
  std::normal_distribution<float> nd;
  std::vector<float> x(16 * 5), y(16);
  for (float& v : x) v = nd(rng);
  for (float& v : y) v = nd(rng);
  return {{"x", Tensor::from_vector<float>({16, 5}, x)}, {target, Tensor::from_vector<float>({16, 1}, y)}};
}

TEST(SessionProfile, TrainStepTimesEveryStepAndTrainsTheSame) {
  TrainingConfig plain;
  plain.optimizer.kind = "adam";
  TrainingConfig profiled = plain;
  profiled.profile = true;
  const Model m = test::relu_mlp<float>("mlp", 5, 12, 7, 0.3f, test::Fc2::Gemm);
  TrainingSession a(m, plain), b(m, profiled);
  std::mt19937 ra(1), rb(1);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(a.train_step(batch(ra, a.target_name())), b.train_step(batch(rb, b.target_name())));
  EXPECT_TRUE(a.profile().empty());
  const std::vector<StepTime> p = b.profile();
  ASSERT_FALSE(p.empty());
  bool saw_gemm = false;
  for (size_t i = 0; i < p.size(); ++i) {
    EXPECT_EQ(p[i].calls, 6) << p[i].step;
    if (i) {
      EXPECT_GE(p[i - 1].seconds, p[i].seconds);
    }
    saw_gemm = saw_gemm || p[i].op == "Gemm";
  }
  EXPECT_TRUE(saw_gemm);
  // Each weight's Adam update is one AdamUpdate node run by one native loop (executor/cpu/fused_update.h): fc1/fc2
  // weight and bias.
  int adam_updates = 0;
  for (const StepTime& t : p) adam_updates += t.op == "AdamUpdate" ? 1 : 0;
  EXPECT_EQ(adam_updates, 4) << format_profile(p, 100);
  for (const std::string& w : a.trainable()) {
    const Tensor wa = a.get_weight(w), wb = b.get_weight(w);
    for (int64_t i = 0; i < wa.numel(); ++i) ASSERT_EQ(wa.ptr<float>()[i], wb.ptr<float>()[i]) << w << "[" << i << "]";
  }
}

}  // namespace
}  // namespace onnxtrain
