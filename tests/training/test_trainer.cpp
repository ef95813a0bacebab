// Trainer: the loop equals a hand-written loop over TrainingSession, resuming continues bit for bit,
// metrics match scikit-learn, early stopping and checkpoint rotation do what they say.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <random>

#include "common/test_env.h"
#include "graph/error.h"
#include "graph/model_io.h"
#include "training/npy.h"
#include "training/trainer.h"

namespace onnxtrain {
namespace {

// 3-class blobs in 4 features: learnable, so accuracy moves.
struct Blobs {
  Tensor x, y;
};
Blobs blobs(int64_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  Blobs b{Tensor::empty(DType::Float32, {n, 4}), Tensor::empty(DType::Int64, {n})};
  for (int64_t i = 0; i < n; ++i) {
    const int64_t c = i % 3;
    b.y.ptr<int64_t>()[i] = c;
    for (int k = 0; k < 4; ++k) b.x.ptr<float>()[i * 4 + k] = nd(rng) + (k == c ? 2.0f : 0.0f);
  }
  return b;
}

TrainingConfig classifier_config() {
  TrainingConfig c;
  c.loss.kind = "cross_entropy";
  c.optimizer.kind = "adam";
  c.optimizer.learning_rate = 0.01;
  c.optimizer.gradient_accumulation = 2;
  c.schedule.kind = "step";
  c.schedule.step_size = 5;
  c.schedule.gamma = 0.5;
  return c;
}

DataLoader loader(const TrainingSession& s, const Blobs& b, int64_t batch, bool shuffle, uint64_t seed) {
  return DataLoader({{"x", b.x}, {s.target_name(), b.y}}, batch, std::make_shared<RandomSampler>(b.x.shape[0], shuffle, seed));
}

void expect_same_weights(const TrainingSession& a, const TrainingSession& b) {
  for (const auto& [name, w] : a.weights()) {
    Tensor o = b.get_weight(name);
    ASSERT_EQ(w.nbytes(), o.nbytes());
    EXPECT_EQ(std::memcmp(w.data, o.data, w.nbytes()), 0) << name;
  }
  EXPECT_EQ(a.step(), b.step());
  EXPECT_EQ(a.learning_rate(), b.learning_rate());
}

TEST(Trainer, EqualsAHandWrittenLoop) {
  auto dir = test::temp_dir("trainer_loop");
  auto model = test::make_mlp(dir, "4 16 3");
  Blobs b = blobs(70, 1);
  TrainingSession s1 = TrainingSession::from_file(model, classifier_config());
  TrainingSession s2 = TrainingSession::from_file(model, classifier_config());
  DataLoader l1 = loader(s1, b, 16, true, 5);
  TrainerOptions o;
  o.epochs = 3;
  Trainer t(s1, l1, o);
  int steps = 0;
  t.on_step([&](const StepInfo&) { ++steps; });
  TrainResult r = t.fit();
  EXPECT_EQ(r.reason, "finished");
  EXPECT_EQ(steps, 15);  // 5 batches (the last has 6 rows) x 3 epochs
  EXPECT_EQ(r.steps, 7);  // accumulation 2: 15 micro-batches make 7 updates

  // The same batches by hand: the sampler's documented order.
  RandomSampler order(70, true, 5);
  for (int e = 0; e < 3; ++e) {
    auto idx = order.indices(e);
    for (int64_t start = 0; start < 70; start += 16) {
      const int64_t n = std::min<int64_t>(16, 70 - start);
      Tensor x = Tensor::empty(DType::Float32, {n, 4});
      Tensor y = Tensor::empty(DType::Int64, {n});
      gather_rows(b.x, std::span<const int64_t>(idx.data() + start, n), x);
      gather_rows(b.y, std::span<const int64_t>(idx.data() + start, n), y);
      s2.train_step({{"x", x}, {s2.target_name(), y}});
    }
    s2.end_epoch(0);
  }
  expect_same_weights(s1, s2);
}

// Interrupt in the middle of an epoch (and of an accumulation), resume from the checkpoint, finish: the same
// weights, optimizer step and learning rate as one uninterrupted run, and the same early-stopping state.
TEST(Trainer, ResumeContinuesBitForBit) {
  auto dir = test::temp_dir("trainer_resume");
  auto model = test::make_mlp(dir, "4 16 3");
  Blobs b = blobs(70, 2);
  Blobs v = blobs(30, 3);
  TrainerOptions o;
  o.epochs = 4;
  o.metrics = {"loss", "accuracy"};

  TrainingSession full = TrainingSession::from_file(model, classifier_config());
  DataLoader lf = loader(full, b, 16, true, 11), vf = loader(full, v, 8, false, 0);
  Trainer tf(full, lf, o);
  tf.set_validation(&vf);
  auto es_full = std::make_shared<EarlyStopping>("val_loss", 100);
  tf.add_callback(es_full);
  TrainResult rf = tf.fit();
  ASSERT_EQ(rf.reason, "finished");

  std::atomic<bool> stop{false};
  TrainerOptions oi = o;
  oi.interrupt = &stop;
  TrainingSession part = TrainingSession::from_file(model, classifier_config());
  DataLoader lp = loader(part, b, 16, true, 11), vp = loader(part, v, 8, false, 0);
  Trainer tp(part, lp, oi);
  tp.set_validation(&vp);
  tp.add_callback(std::make_shared<EarlyStopping>("val_loss", 100));
  auto ck = std::make_shared<CheckpointEvery>(dir / "ck", 0, 2);
  tp.add_callback(ck);
  tp.on_step([&](const StepInfo& s) {
    if (s.epoch == 1 && s.batch == 1) stop = true;  // micro-batch 7 of 20: mid-epoch, mid-accumulation
  });
  TrainResult rp = tp.fit();
  ASSERT_EQ(rp.reason, "interrupted");
  ASSERT_EQ(rp.checkpoint, dir / "ck" / "step-3.onnx");
  EXPECT_EQ(tp.epoch(), 1);
  EXPECT_EQ(tp.batch(), 2);

  Model m = load_model(rp.checkpoint);
  TrainingSession res = TrainingSession::from_checkpoint(m, rp.checkpoint.string());
  DataLoader lr = loader(res, b, 16, true, 11), vr = loader(res, v, 8, false, 0);
  Trainer tr(res, lr, o);
  tr.set_validation(&vr);
  auto es_res = std::make_shared<EarlyStopping>("val_loss", 100);
  tr.add_callback(es_res);
  tr.restore(m, rp.checkpoint.string());
  TrainResult rr = tr.fit();
  EXPECT_EQ(rr.reason, "finished");
  expect_same_weights(full, res);
  EXPECT_EQ(rr.metrics, rf.metrics);
  EXPECT_EQ(es_res->best(), es_full->best());

  // A different seed cannot resume this run.
  DataLoader other = loader(res, b, 16, true, 12);
  Trainer bad(res, other, o);
  const std::string err = test::error_of([&] { bad.restore(m, "ck.onnx"); });
  EXPECT_NE(err.find("ck.onnx: the checkpoint was trained with seed 11, this run has 12"), std::string::npos) << err;
}

TEST(Trainer, MetricsMatchScikitLearn) {
  auto dir = test::temp_dir("trainer_metrics");
  // Classification: accuracy and loss.
  Blobs v = blobs(45, 4);
  TrainingConfig cc;
  cc.loss.kind = "cross_entropy";
  TrainingSession c = TrainingSession::from_file(test::make_mlp(dir, "4 16 3"), cc);
  DataLoader vl = loader(c, v, 8, true, 3);  // order and a partial batch must not matter
  Evaluator ev(c);
  auto m = ev.evaluate(c, vl, {"loss", "accuracy"});
  EXPECT_NEAR(m.at("loss"), c.gradients({{"x", v.x}, {c.target_name(), v.y}}).loss, 1e-6);
  write_npy(dir / "pred.npy", c.infer({{"x", v.x}}).at(0));
  write_npy(dir / "y.npy", v.y);

  // Regression with two outputs: mse, mae, r2.
  std::filesystem::create_directories(dir / "r");
  TrainingSession r = TrainingSession::from_file(test::make_mlp(dir / "r", "4 8 2"), {});
  Tensor rx = v.x;
  Tensor ry = Tensor::empty(DType::Float32, {45, 2});
  for (int i = 0; i < 45; ++i) ry.ptr<float>()[2 * i] = rx.ptr<float>()[4 * i], ry.ptr<float>()[2 * i + 1] = 0.1f * i;
  DataLoader rl({{"x", rx}, {r.target_name(), ry}}, 10);
  auto mr = Evaluator(r).evaluate(r, rl, {"mse", "mae", "r2", "loss"});
  write_npy(dir / "rpred.npy", r.infer({{"x", rx}}).at(0));
  write_npy(dir / "ry.npy", ry);
  const std::string out = (dir / "ref.txt").string();
  std::string cmd = test::python() + " -c 'import numpy as np, os; from sklearn import metrics as M\n"
                    "os.chdir(\"" + dir.string() + "\")\n"
                    "p, y = np.load(\"pred.npy\"), np.load(\"y.npy\"); rp, ry = np.load(\"rpred.npy\").astype(np.float64), np.load(\"ry.npy\")\n"
                    "print(M.accuracy_score(y, p.argmax(1)), M.mean_squared_error(ry, rp), M.mean_absolute_error(ry, rp), M.r2_score(ry, rp))' > " + out;
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  double acc, mse, mae, r2;
  std::ifstream(out) >> acc >> mse >> mae >> r2;
  EXPECT_DOUBLE_EQ(m.at("accuracy"), acc);
  EXPECT_NEAR(mr.at("mse"), mse, 1e-6 * mse);
  EXPECT_NEAR(mr.at("mae"), mae, 1e-6 * mae);
  EXPECT_NEAR(mr.at("r2"), r2, 1e-6);
  EXPECT_NEAR(mr.at("loss"), mse, 1e-5 * mse);  // mse loss = the mse metric
}

TEST(Trainer, EarlyStoppingWaitsPatienceEpochs) {
  auto dir = test::temp_dir("trainer_es");
  Blobs b = blobs(32, 5);
  TrainingConfig cfg = classifier_config();
  cfg.optimizer.kind = "sgd";
  cfg.optimizer.learning_rate = 1e-30;  // updates vanish in float32: nothing improves after epoch 1
  cfg.schedule = {};
  TrainingSession s = TrainingSession::from_file(test::make_mlp(dir, "4 8 3"), cfg);
  DataLoader l = loader(s, b, 8, false, 0), v = loader(s, b, 8, false, 0);
  TrainerOptions o;
  o.epochs = 20;
  Trainer t(s, l, o);
  t.set_validation(&v);
  t.add_callback(std::make_shared<EarlyStopping>("val_loss", 3));
  TrainResult r = t.fit();
  EXPECT_EQ(r.reason, "early_stopping");
  EXPECT_EQ(r.epochs, 4);  // best at epoch 1, then 3 epochs without improvement
  const std::string err = test::error_of([&] {
    Trainer t2(s, l, o);
    t2.add_callback(std::make_shared<EarlyStopping>("val_accuracy", 3));
    t2.fit();
  });
  EXPECT_NE(err.find("early_stopping.metric: 'val_accuracy' is not computed; available: train_loss"), std::string::npos) << err;
}

TEST(Trainer, CheckpointRotationAndMetricsLog) {
  auto dir = test::temp_dir("trainer_ck");
  Blobs b = blobs(40, 6);
  TrainingConfig cfg;
  cfg.loss.kind = "cross_entropy";
  TrainingSession s = TrainingSession::from_file(test::make_mlp(dir, "4 8 3"), cfg);
  DataLoader l = loader(s, b, 8, true, 1);
  TrainerOptions o;
  o.epochs = 3;
  o.max_steps = 13;
  Trainer t(s, l, o);
  t.add_callback(std::make_shared<CheckpointEvery>(dir / "ck", 4, 2));
  t.add_callback(std::make_shared<MetricsLog>(dir / "m.csv", std::vector<std::string>{}));
  t.add_callback(std::make_shared<MetricsLog>(dir / "m.jsonl", std::vector<std::string>{}));
  TrainResult r = t.fit();
  EXPECT_EQ(r.reason, "max_steps");
  EXPECT_EQ(r.steps, 13);
  std::set<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir / "ck")) files.insert(e.path().filename().string());
  EXPECT_EQ(files, (std::set<std::string>{"step-12.onnx", "step-13.onnx"}));  // 4, 8 rotated out
  std::ifstream csv(dir / "m.csv");
  std::string line;
  std::getline(csv, line);
  EXPECT_EQ(line, "event,epoch,step,loss,lr,samples_per_s");
  int steps = 0, epochs = 0;
  while (std::getline(csv, line)) (line.rfind("step,", 0) == 0 ? steps : epochs)++;
  EXPECT_EQ(steps, 13);
  EXPECT_EQ(epochs, 2);
  std::ifstream js(dir / "m.jsonl");
  int rows = 0;
  while (std::getline(js, line)) rows += line.front() == '{' && line.back() == '}';
  EXPECT_EQ(rows, 15);
}

}  // namespace
}  // namespace onnxtrain
