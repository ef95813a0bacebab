// train_epoch (training/epoch.h) is the train_step loop it replaces: the same batches (in order as views, or
// gathered in a given order), the same scaled sample weights, the same updates bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>

#include "common/test_env.h"
#include "training/epoch.h"
#include "training/session.h"

namespace onnxtrain {
namespace {

Tensor random_tensor(std::vector<int64_t> shape, unsigned seed, float lo = -1, float hi = 1) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  Tensor t = Tensor::empty(DType::Float32, std::move(shape));
  for (float& v : t.span<float>()) v = u(rng);
  return t;
}

// Rows `idx` of a [n, k] float tensor, as an owning [idx.size(), k] tensor.
Tensor rows_of(const Tensor& t, const std::vector<int64_t>& idx) {
  const int64_t k = t.numel() / t.shape[0];
  std::vector<int64_t> shape = t.shape;
  shape[0] = static_cast<int64_t>(idx.size());
  Tensor r = Tensor::empty(DType::Float32, shape);
  for (size_t i = 0; i < idx.size(); ++i)
    std::copy_n(t.ptr<float>() + idx[i] * k, k, r.ptr<float>() + static_cast<int64_t>(i) * k);
  return r;
}

TrainingConfig adam_config(bool sample_weight) {
  TrainingConfig cfg;
  cfg.optimizer.kind = "adam";
  cfg.optimizer.learning_rate = 0.01;
  cfg.loss.sample_weight = sample_weight;
  return cfg;
}

std::string sample_weight_feed(const TrainingSession& s) {
  for (const ValueInfo& v : s.training_graph().inputs)
    if (!s.training_graph().is_initializer(v.name) && v.name != "x" && v.name != s.target_name()) return v.name;
  return "";
}

void expect_same_weights(const TrainingSession& a, const TrainingSession& b) {
  for (const std::string& w : a.trainable()) {
    Tensor wa = a.get_weight(w), wb = b.get_weight(w);
    ASSERT_EQ(wa.numel(), wb.numel());
    for (int64_t i = 0; i < wa.numel(); ++i) ASSERT_EQ(wa.ptr<float>()[i], wb.ptr<float>()[i]) << w << "[" << i << "]";
  }
}

TEST(TrainEpoch, ShuffledWeightedEpochIsTheStepLoop) {
  auto dir = test::temp_dir("epoch_shuffled");
  auto model = test::make_mlp(dir, "6 16 1");
  TrainingSession a = TrainingSession::from_file(model, adam_config(true));
  TrainingSession b = TrainingSession::from_file(model, adam_config(true));
  const int64_t n = 70, bs = 32;
  Tensor x = random_tensor({n, 6}, 1), y = random_tensor({n, 1}, 2), raw = random_tensor({n}, 3, 0.5f, 2.0f);
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(4));
  const std::string sw = sample_weight_feed(a);
  ASSERT_FALSE(sw.empty());

  EpochSpec spec;
  spec.batch_size = bs;
  spec.order = order;
  spec.sample_weight_feed = sw;
  spec.squares_of = {a.trainable().front()};
  EpochResult r = train_epoch(a, {{"x", x}, {a.target_name(), y}}, &raw, spec);

  std::vector<float> losses;
  for (int64_t start = 0; start < n; start += bs) {
    std::vector<int64_t> idx(order.begin() + start, order.begin() + std::min(n, start + bs));
    const auto m = static_cast<int64_t>(idx.size());
    double total = 0;
    for (int64_t i : idx) total += raw.ptr<float>()[i];
    Tensor w = Tensor::empty(DType::Float32, {m});
    for (int64_t i = 0; i < m; ++i) w.ptr<float>()[i] = raw.ptr<float>()[idx[i]] * static_cast<float>(m / total);
    Tensor first = b.get_weight(b.trainable().front());
    double squares = 0;
    for (float v : first.span<float>()) squares += double(v) * v;
    EXPECT_DOUBLE_EQ(r.squares.at(losses.size()), squares);
    EXPECT_DOUBLE_EQ(r.weight_sums.at(losses.size()), total);
    losses.push_back(b.train_step({{"x", rows_of(x, idx)}, {b.target_name(), rows_of(y, idx)}, {sw, w}}));
  }
  EXPECT_EQ(r.rows, (std::vector<int64_t>{32, 32, 6}));
  EXPECT_EQ(r.losses, losses);
  expect_same_weights(a, b);
}

TEST(TrainEpoch, InOrderEpochWithoutWeightsIsTheStepLoop) {
  auto dir = test::temp_dir("epoch_in_order");
  auto model = test::make_mlp(dir, "6 16 1");
  TrainingSession a = TrainingSession::from_file(model, adam_config(true));
  TrainingSession b = TrainingSession::from_file(model, adam_config(true));
  const int64_t n = 45, bs = 20;
  Tensor x = random_tensor({n, 6}, 5), y = random_tensor({n, 1}, 6);
  EpochSpec spec;
  spec.batch_size = bs;
  spec.sample_weight_feed = sample_weight_feed(a);
  spec.weights_sum_to_one = true;  // a "sum" loss's weights: 1/m each
  EpochResult r = train_epoch(a, {{"x", x}, {a.target_name(), y}}, nullptr, spec);
  std::vector<float> losses;
  for (int64_t start = 0; start < n; start += bs) {
    const int64_t m = std::min(bs, n - start);
    Tensor w = Tensor::empty(DType::Float32, {m});
    for (float& v : w.span<float>()) v = static_cast<float>(1.0 / m);
    losses.push_back(b.train_step({{"x", Tensor::view(DType::Float32, {m, 6}, x.ptr<float>() + start * 6)},
                                   {b.target_name(), Tensor::view(DType::Float32, {m, 1}, y.ptr<float>() + start)},
                                   {spec.sample_weight_feed, w}}));
  }
  EXPECT_EQ(r.losses, losses);
  EXPECT_EQ(r.weight_sums, (std::vector<double>{20, 20, 5}));
  EXPECT_TRUE(r.squares.empty());
  expect_same_weights(a, b);
}

TEST(TrainEpoch, BadInputIsRefusedBeforeAnyStep) {
  auto dir = test::temp_dir("epoch_errors");
  TrainingSession s = TrainingSession::from_file(test::make_mlp(dir, "6 4 1"), adam_config(false));
  Tensor x = random_tensor({10, 6}, 7), y = random_tensor({10, 1}, 8), y9 = random_tensor({9, 1}, 8);
  auto run = [&](const Feeds& data, EpochSpec spec, const Tensor* sw = nullptr) {
    return test::error_of([&] { train_epoch(s, data, sw, spec); });
  };
  EpochSpec ok;
  ok.batch_size = 4;
  const Feeds data{{"x", x}, {s.target_name(), y}};
  EXPECT_NE(run({{"x", x}, {s.target_name(), y9}}, ok).find("row counts differ: '" + s.target_name() + "' 9, 'x' 10"), std::string::npos);
  EpochSpec zero = ok;
  zero.batch_size = 0;
  EXPECT_NE(run(data, zero).find("batch_size"), std::string::npos);
  EpochSpec bad_order = ok;
  bad_order.order = {0, -1};
  EXPECT_NE(run(data, bad_order).find("order[1]"), std::string::npos);
  Tensor w = random_tensor({10}, 9);
  EXPECT_NE(run(data, ok, &w).find("no sample_weight_feed"), std::string::npos);
  EpochSpec unknown = ok;
  unknown.sample_weight_feed = "weights";
  EXPECT_NE(run(data, unknown).find("sample_weight_feed 'weights'"), std::string::npos);
  EpochSpec squares = ok;
  squares.squares_of = {"x"};
  EXPECT_NE(run(data, squares).find("weight 'x'"), std::string::npos);
  EXPECT_EQ(s.step(), 0);
}

}  // namespace
}  // namespace onnxtrain
