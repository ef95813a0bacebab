// on_non_finite = "skip" (docs/reliability.md): a skipped step changes no weight and no optimizer state, the
// steps after it train exactly as if its batch had never been seen, the count survives checkpoints (and older
// checkpoints without it still load), data-parallel ranks decide on the reduced values, and the Trainer counts
// skipped batches instead of stopping.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "common/test_env.h"
#include "distributed/communicator.h"
#include "graph/error.h"
#include "training/checkpoint.h"
#include "training/trainer.h"

namespace onnxtrain {
namespace {

const float kInf = std::numeric_limits<float>::infinity();

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype == b.dtype && a.shape == b.shape && std::memcmp(a.data, b.data, a.nbytes()) == 0;
}

// Every weight and every optimizer state tensor (Adam's moments, the step counter).
std::map<std::string, Tensor> snapshot(const TrainingSession& s) {
  std::map<std::string, Tensor> all = s.weights();
  for (const std::string& n : s.state_names()) all[n] = s.state(n);
  return all;
}

void expect_same(const std::map<std::string, Tensor>& a, const std::map<std::string, Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) EXPECT_TRUE(same_bytes(t, b.at(name))) << name << " differs";
}

// Deterministic regression rows for examples/make_mlp.py's "3 8 1" network.
struct Rows {
  Tensor x, y;
};
Rows rows(int64_t n) {
  Rows r{Tensor::empty(DType::Float32, {n, 3}), Tensor::empty(DType::Float32, {n, 1})};
  for (int64_t i = 0; i < n; ++i) {
    for (int k = 0; k < 3; ++k) r.x.ptr<float>()[i * 3 + k] = std::sin(0.7f * float(i) + float(k));
    r.y.ptr<float>()[i] = std::cos(0.3f * float(i));
  }
  return r;
}
Rows without_rows(const Rows& r, int64_t begin, int64_t end) {
  const int64_t n = r.x.shape[0] - (end - begin);
  Rows o{Tensor::empty(DType::Float32, {n, 3}), Tensor::empty(DType::Float32, {n, 1})};
  for (int64_t i = 0, j = 0; i < r.x.shape[0]; ++i) {
    if (i >= begin && i < end) continue;
    std::memcpy(o.x.ptr<float>() + j * 3, r.x.ptr<float>() + i * 3, 3 * sizeof(float));
    o.y.ptr<float>()[j++] = r.y.ptr<float>()[i];
  }
  return o;
}

Feeds batch_of(const TrainingSession& s, const Rows& r, int64_t begin, int64_t count) {
  Tensor x = Tensor::empty(DType::Float32, {count, 3}), y = Tensor::empty(DType::Float32, {count, 1});
  std::memcpy(x.data, r.x.ptr<float>() + begin * 3, x.nbytes());
  std::memcpy(y.data, r.y.ptr<float>() + begin, y.nbytes());
  return {{"x", x}, {s.target_name(), y}};
}

Feeds poisoned(const Feeds& f) {
  Feeds bad = f;
  bad["x"] = f.at("x").clone();
  bad["x"].ptr<float>()[1] = kInf;
  return bad;
}

TrainingConfig adam_skip() {
  TrainingConfig c;
  c.optimizer.kind = "adam";
  c.optimizer.learning_rate = 0.01;
  c.on_non_finite = "skip";
  return c;
}

class SkipPolicy : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = test::make_mlp(test::temp_dir(std::string("skip_") + ::testing::UnitTest::GetInstance()->current_test_info()->name()),
                            "3 8 1");
  }
  std::filesystem::path model_;
};

TEST_F(SkipPolicy, SkippedAdamStepChangesNothingAndTheRunEqualsOneWithoutThatBatch) {
  TrainingSession s = TrainingSession::from_file(model_, adam_skip());
  TrainingSession reference = TrainingSession::from_file(model_, adam_skip());
  const Rows r = rows(16);
  ASSERT_NE(std::find(s.state_names().begin(), s.state_names().end(), s.trainable()[0] + ".exp_avg"), s.state_names().end());
  s.train_step(batch_of(s, r, 0, 4));
  s.train_step(batch_of(s, r, 4, 4));
  const auto before = snapshot(s);
  EXPECT_TRUE(std::isnan(s.train_step(poisoned(batch_of(s, r, 8, 4)))));
  expect_same(before, snapshot(s));  // weights, exp_avg, exp_avg_sq and optim.step: bit for bit
  EXPECT_EQ(s.step(), 2);
  EXPECT_EQ(s.skipped_steps(), 1);
  EXPECT_EQ(s.train_step_calls(), 3);
  EXPECT_NE(s.last_skip_reason().find("training step 3 (optimizer step 3): the loss went non-finite"), std::string::npos)
      << s.last_skip_reason();
  s.train_step(batch_of(s, r, 12, 4));
  EXPECT_EQ(s.step(), 3);  // the skipped step did not take an optimizer step number (Adam's bias correction)

  for (int64_t b : {0, 4, 12}) reference.train_step(batch_of(reference, r, b, 4));
  expect_same(snapshot(reference), snapshot(s));
}

TEST_F(SkipPolicy, CountersSurviveACheckpointAndOlderCheckpointsLoad) {
  TrainingSession s = TrainingSession::from_file(model_, adam_skip());
  const Rows r = rows(8);
  const Feeds good = batch_of(s, r, 0, 4), bad = poisoned(batch_of(s, r, 4, 4));
  s.train_step(bad);
  s.train_step(good);
  s.train_step(bad);
  const Model ckpt = s.checkpoint();
  TrainingSession back = TrainingSession::from_checkpoint(ckpt, "ckpt.onnx");
  EXPECT_EQ(back.skipped_steps(), 2);
  EXPECT_EQ(back.train_step_calls(), 3);
  EXPECT_EQ(back.step(), 1);
  back.train_step(bad);
  EXPECT_EQ(back.skipped_steps(), 3);
  EXPECT_NE(back.last_skip_reason().find("training step 4 (optimizer step 2)"), std::string::npos) << back.last_skip_reason();

  // A checkpoint written before the counters existed: nothing skipped, every call was an update.
  Model old = ckpt;
  std::erase_if(old.metadata, [](const auto& kv) { return kv.first == "onnxtrain.skipped_steps" || kv.first == "onnxtrain.train_step_calls"; });
  ASSERT_EQ(old.metadata.size() + 2, ckpt.metadata.size());
  TrainingSession from_old = TrainingSession::from_checkpoint(old, "old.onnx");
  EXPECT_EQ(from_old.skipped_steps(), 0);
  EXPECT_EQ(from_old.train_step_calls(), 1);

  Model broken = ckpt;
  for (auto& [k, v] : broken.metadata)
    if (k == "onnxtrain.skipped_steps") v = "-4";
  const std::string msg = test::error_of([&] { TrainingSession::from_checkpoint(broken, "broken.onnx"); });
  EXPECT_NE(msg.find("broken.onnx"), std::string::npos) << msg;
  EXPECT_NE(msg.find("onnxtrain.skipped_steps': expected an integer >= 0, got -4"), std::string::npos) << msg;
}

// Two ranks where the peer's gradients hold a NaN this rank's do not: every reduced value carries it. Checking
// only the local gradients would apply a NaN update here while the peer skips, and the ranks would part ways.
class PeerWithNaN final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  Device device() const override { return Device::CPU; }
  std::string backend() const override { return "peer_with_nan"; }
  bool poison = false;

 protected:
  void do_broadcast(void*, size_t, int) override {}
  void do_allreduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp) override {
    if (send != recv) std::memcpy(recv, send, count * dtype_size(dtype));
    if (!poison || count == 0) return;
    if (dtype == DType::Float32) static_cast<float*>(recv)[0] = std::numeric_limits<float>::quiet_NaN();
    else static_cast<double*>(recv)[0] = std::numeric_limits<double>::quiet_NaN();
  }
  void do_barrier() override {}
};

TEST_F(SkipPolicy, DataParallelRanksDecideOnTheReducedValues) {
  auto peer = std::make_shared<PeerWithNaN>();
  TrainingConfig c = adam_skip();
  c.parallel.communicator = peer;
  TrainingSession s = TrainingSession::from_file(model_, c);
  const Rows r = rows(4);
  const Feeds f = batch_of(s, r, 0, 4);
  s.train_step(f);
  const auto before = snapshot(s);
  peer->poison = true;
  EXPECT_TRUE(std::isnan(s.train_step(f)));
  expect_same(before, snapshot(s));
  EXPECT_EQ(s.skipped_steps(), 1);
  EXPECT_NE(s.last_skip_reason().find("reduced over the data-parallel ranks"), std::string::npos) << s.last_skip_reason();
  c.on_non_finite = "raise";
  peer->poison = false;
  TrainingSession raising = TrainingSession::from_file(model_, c);
  peer->poison = true;
  const std::string msg = test::error_of([&] { raising.train_step(f); });
  EXPECT_NE(msg.find("training step 1"), std::string::npos) << msg;
  EXPECT_EQ(raising.step(), 0);
  // Checking every value stops a rank before the collective: with skip, the ranks would fall out of step.
  c.on_non_finite = "skip";
  c.check_every_value = true;
  peer->poison = false;
  const std::string refused = test::error_of([&] { TrainingSession::from_file(model_, c); });
  EXPECT_NE(refused.find("check_every_value: cannot be combined with on_non_finite 'skip' in data-parallel training"),
            std::string::npos)
      << refused;
}

DataLoader in_order(const TrainingSession& s, const Rows& r, int64_t batch) {
  return DataLoader({{"x", r.x}, {s.target_name(), r.y}}, batch, std::make_shared<RandomSampler>(r.x.shape[0], false, 0));
}

TEST_F(SkipPolicy, TrainerCountsSkippedBatchesAndTrainsAsWithoutThem) {
  Rows r = rows(20);
  r.x.ptr<float>()[9 * 3 + 2] = kInf;  // row 9: batch 2 of 5 (rows 8-11) in every epoch
  TrainingSession s = TrainingSession::from_file(model_, adam_skip());
  DataLoader data = in_order(s, r, 4);
  TrainerOptions o;
  o.epochs = 2;
  Trainer t(s, data, o);
  std::vector<std::pair<int64_t, int64_t>> skipped;  // (epoch, batch)
  std::vector<double> epoch_loss(2, 0.0), train_loss;
  std::vector<int64_t> epoch_skipped;
  t.on_step([&](const StepInfo& i) {
    if (i.skipped) {
      skipped.emplace_back(i.epoch, i.batch);
      EXPECT_TRUE(std::isnan(i.loss));
      EXPECT_FALSE(i.updated);
    } else {
      epoch_loss[i.epoch] += i.loss;
    }
  });
  t.on_epoch_end([&](const EpochInfo& e) {
    train_loss.push_back(e.train_loss);
    epoch_skipped.push_back(e.skipped);
  });
  const TrainResult res = t.fit();
  EXPECT_EQ(res.reason, "finished");
  EXPECT_EQ(res.skipped_steps, 2);
  EXPECT_EQ(res.steps, 8);
  EXPECT_EQ(skipped, (std::vector<std::pair<int64_t, int64_t>>{{0, 2}, {1, 2}}));
  ASSERT_EQ(train_loss.size(), 2u);
  EXPECT_EQ(epoch_skipped, (std::vector<int64_t>{1, 1}));
  for (int e = 0; e < 2; ++e) EXPECT_DOUBLE_EQ(train_loss[e], epoch_loss[e] / 4) << "the mean of the 4 applied batches";

  // The same Trainer on the data without rows 8-11 takes the same 8 updates.
  const Rows kept = without_rows(r, 8, 12);
  TrainingSession ref = TrainingSession::from_file(model_, adam_skip());
  DataLoader ref_data = in_order(ref, kept, 4);
  Trainer rt(ref, ref_data, o);
  EXPECT_EQ(rt.fit().skipped_steps, 0);
  expect_same(snapshot(ref), snapshot(s));
}

TEST_F(SkipPolicy, TrainerStopsPastMaxSkippedStepsAndResumesTheEpochMean) {
  Rows r = rows(20);
  r.x.ptr<float>()[9 * 3] = kInf;
  TrainerOptions o;
  o.epochs = 3;
  o.max_skipped_steps = 1;
  {
    TrainingSession s = TrainingSession::from_file(model_, adam_skip());
    DataLoader data = in_order(s, r, 4);
    const TrainResult res = Trainer(s, data, o).fit();
    EXPECT_EQ(res.reason, "max_skipped_steps");
    EXPECT_EQ(res.skipped_steps, 2);
    EXPECT_EQ(res.epochs, 1);  // stopped right after the second skip, in epoch 2
    o.max_skipped_steps = -1;
    EXPECT_NE(test::error_of([&] { (void)Trainer(s, data, o); }).find("max_skipped_steps"), std::string::npos);
  }
  // Stopped inside an epoch after its skipped batch, checkpointed and resumed: the epoch's mean is the one an
  // uninterrupted run reports.
  o.max_skipped_steps = 0;
  o.epochs = 1;
  TrainingSession whole = TrainingSession::from_file(model_, adam_skip());
  DataLoader whole_data = in_order(whole, r, 4);
  Trainer wt(whole, whole_data, o);
  double whole_mean = 0;
  wt.on_epoch_end([&](const EpochInfo& e) { whole_mean = e.train_loss; });
  wt.fit();

  TrainingSession first = TrainingSession::from_file(model_, adam_skip());
  DataLoader first_data = in_order(first, r, 4);
  TrainerOptions part = o;
  part.max_steps = 3;  // batches 0, 1, (2 skipped), 3
  Trainer ft(first, first_data, part);
  EXPECT_EQ(ft.fit().reason, "max_steps");
  const Model ckpt = ft.checkpoint();
  bool found = false;
  for (const auto& [k, v] : ckpt.metadata)
    if (k == "onnxtrain.trainer.epoch_skipped") found = v == "1";
  EXPECT_TRUE(found) << "the epoch's skipped batches are part of the trainer position";
  TrainingSession second = TrainingSession::from_checkpoint(ckpt, "ckpt");
  DataLoader second_data = in_order(second, r, 4);
  Trainer st(second, second_data, o);
  st.restore(ckpt, "ckpt");
  double resumed_mean = 0;
  st.on_epoch_end([&](const EpochInfo& e) { resumed_mean = e.train_loss; });
  st.fit();
  EXPECT_EQ(resumed_mean, whole_mean);
  EXPECT_EQ(second.skipped_steps(), 1);
  expect_same(snapshot(whole), snapshot(second));
}

}  // namespace
}  // namespace onnxtrain
