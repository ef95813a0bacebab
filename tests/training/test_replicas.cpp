// ReplicatedSession (training/replicas.h): N single-threaded replicas on parts of each batch take the steps one
// session takes on the whole batch (up to float rounding), keep identical weights, and fail clearly.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <mutex>
#include <random>

#include "common/test_env.h"
#include "training/yield_test_util.h"
#include "executor/finite.h"
#include "training/epoch.h"
#include "graph/model_io.h"
#include "training/replicas.h"

namespace onnxtrain {
namespace {

Tensor random_tensor(std::vector<int64_t> shape, unsigned seed) {
  return test::random_tensor<float>(DType::Float32, std::move(shape), seed);
}

Tensor labels(int64_t n, int64_t classes, unsigned seed) {
  std::mt19937 rng(seed);
  Tensor t = Tensor::empty(DType::Int64, {n});
  for (int64_t& v : t.span<int64_t>()) v = static_cast<int64_t>(rng() % static_cast<unsigned>(classes));
  return t;
}

TrainingConfig config(const std::string& loss, const std::string& reduction = "mean") {
  TrainingConfig cfg;
  cfg.optimizer.kind = "adam";
  cfg.optimizer.learning_rate = 0.01;
  cfg.loss.kind = loss;
  cfg.loss.reduction = reduction;
  return cfg;
}

// |a - b| <= tol * (1 + |b|), element by element, for every trainable weight.
void expect_close_weights(const TrainingSession& a, const TrainingSession& b, double tol) {
  for (const std::string& w : b.trainable()) {
    const Tensor wa = a.get_weight(w);  // host copies: the sessions may run on a device
    const Tensor wb = b.get_weight(w);
    ASSERT_EQ(wa.numel(), wb.numel());
    for (int64_t i = 0; i < wa.numel(); ++i) {
      const double x = wa.ptr<float>()[i], y = wb.ptr<float>()[i];
      ASSERT_LE(std::abs(x - y), tol * (1 + std::abs(y))) << w << "[" << i << "]";
    }
  }
}

struct Case {
  std::string name, loss, reduction;
  int replicas;
  int64_t rows;
};

class ReplicatedStep : public ::testing::TestWithParam<Case> {};

// Each case trains 6 steps on different batches, one session on the whole batch against the replicas.
TEST_P(ReplicatedStep, TakesTheStepsOfOneSessionOnTheWholeBatch) {
  const Case& c = GetParam();
  const bool classes = c.loss == "cross_entropy";
  auto dir = test::temp_dir("replicas_" + c.name);
  const auto model = test::make_mlp(dir, classes ? "6 16 4" : "6 16 1");
  const TrainingConfig cfg = config(c.loss, c.reduction);
  TrainingSession one = TrainingSession::from_file(model, cfg);
  ReplicatedSession many(load_model(model), cfg, c.replicas);
  ASSERT_EQ(many.replicas(), c.replicas);
  const std::string target = one.target_name();
  for (unsigned step = 0; step < 6; ++step) {
    Feeds feeds{{"x", random_tensor({c.rows, 6}, 10 + step)},
                {target, classes ? labels(c.rows, 4, 20 + step) : random_tensor({c.rows, 1}, 20 + step)}};
    const float want = one.train_step(feeds);
    const float got = many.train_step(feeds);
    ASSERT_NEAR(got, want, 1e-5 * (1 + std::abs(want))) << "step " << step;
  }
  expect_close_weights(many.primary(), one, 1e-5);
  // The replicas hold the same bits: they applied the same reduced gradients.
  std::vector<std::map<std::string, Tensor>> held(static_cast<size_t>(c.replicas));
  std::mutex m;
  many.for_each([&](TrainingSession& s) {
    std::lock_guard<std::mutex> lock(m);
    held[static_cast<size_t>(s.communicator()->rank())] = s.weights();
  });
  for (int r = 1; r < c.replicas; ++r)
    for (const auto& [name, t] : held[0])
      for (int64_t i = 0; i < t.numel(); ++i)
        ASSERT_EQ(held[static_cast<size_t>(r)].at(name).ptr<float>()[i], t.ptr<float>()[i]) << name << " replica " << r;
}

INSTANTIATE_TEST_SUITE_P(Cases, ReplicatedStep,
                         ::testing::Values(Case{"mse_even", "mse", "mean", 2, 32},
                                           // 31 rows: parts of 16 and 15, weighted by their row counts
                                           Case{"mse_odd", "mse", "mean", 2, 31},
                                           Case{"mse_three", "mse", "mean", 3, 31},
                                           Case{"mse_sum", "mse", "sum", 3, 31},
                                           Case{"ce_odd", "cross_entropy", "mean", 2, 29},
                                           Case{"one_row_each", "mse", "mean", 2, 2},
                                           // fewer rows than replicas: the third stands in with weight 0
                                           Case{"fewer_rows", "mse", "mean", 3, 2},
                                           Case{"fewer_rows_sum", "mse", "sum", 3, 2},
                                           Case{"one_row_ce", "cross_entropy", "mean", 2, 1}),
                         [](const auto& info) { return info.param.name; });

TEST(ReplicatedSession, EpochOverReplicasIsTheEpochOfOneSession) {
  auto dir = test::temp_dir("replicas_epoch");
  const auto model = test::make_mlp(dir, "6 16 1");
  TrainingConfig cfg = config("mse");
  cfg.loss.sample_weight = true;
  TrainingSession one = TrainingSession::from_file(model, cfg);
  ReplicatedSession many(load_model(model), cfg, 2);
  std::string sw;
  for (const ValueInfo& v : one.training_graph().inputs)
    if (!one.training_graph().is_initializer(v.name) && v.name != "x" && v.name != one.target_name()) sw = v.name;
  ASSERT_FALSE(sw.empty());
  const int64_t n = 101;
  Tensor x = random_tensor({n, 6}, 1), y = random_tensor({n, 1}, 2), raw = random_tensor({n}, 3);
  for (float& v : raw.span<float>()) v = 0.5f + std::abs(v);  // positive sample weights
  EpochSpec spec;
  spec.batch_size = 32;  // the last batch has 5 rows: parts of 3 and 2
  spec.order.resize(n);
  std::iota(spec.order.begin(), spec.order.end(), 0);
  std::shuffle(spec.order.begin(), spec.order.end(), std::mt19937(4));
  spec.sample_weight_feed = sw;
  spec.squares_of = {one.trainable().front()};
  const Feeds data{{"x", x}, {one.target_name(), y}};
  for (int epoch = 0; epoch < 2; ++epoch) {
    const EpochResult a = train_epoch(one, data, &raw, spec);
    const EpochResult b = train_epoch(many, data, &raw, spec);
    ASSERT_EQ(a.losses.size(), b.losses.size());
    for (size_t i = 0; i < a.losses.size(); ++i) {
      EXPECT_NEAR(b.losses[i], a.losses[i], 1e-5 * (1 + std::abs(a.losses[i]))) << "batch " << i;
      EXPECT_EQ(b.rows[i], a.rows[i]);
      EXPECT_NEAR(b.squares[i], a.squares[i], 1e-5 * a.squares[i]);
    }
  }
  expect_close_weights(many.primary(), one, 1e-5);
}

TEST(ReplicatedSession, BadBatchesAreClearErrors) {
  auto dir = test::temp_dir("replicas_bad");
  const auto model = test::make_mlp(dir, "6 8 1");
  ReplicatedSession many(load_model(model), config("mse"), 3);
  const std::string t = many.primary().target_name();
  std::string e = test::error_of([&] { many.train_step({{"x", random_tensor({6, 6}, 1)}, {t, random_tensor({5, 1}, 2)}}); });
  EXPECT_NE(e.find("must be the batch's row count or a multiple of it"), std::string::npos) << e;
  // Nothing was run: the session goes on.
  EXPECT_TRUE(std::isfinite(many.train_step({{"x", random_tensor({6, 6}, 1)}, {t, random_tensor({6, 1}, 2)}})));

  TrainingConfig with_comm = config("mse");
  with_comm.parallel.communicator = single_process_communicator();
  e = test::error_of([&] { ReplicatedSession(load_model(model), with_comm, 2); });
  EXPECT_NE(e.find("leave config.parallel empty"), std::string::npos) << e;
  // A replica that cannot be built: the error is the session's own, not a broken collective's.
  TrainingConfig bad_optimizer = config("mse");
  bad_optimizer.optimizer.kind = "nosuch";
  e = test::error_of([&] { ReplicatedSession(load_model(model), bad_optimizer, 2); });
  EXPECT_NE(e.find("nosuch"), std::string::npos) << e;
  EXPECT_EQ(e.find("replica 1 stopped"), std::string::npos) << e;
  e = test::error_of([&] { ReplicatedSession(load_model(model), config("mse"), 0); });
  EXPECT_NE(e.find("expected 1 to 64 replicas, got 0"), std::string::npos) << e;
  // Replicas run where the CPU kernels run: the CPU and the guarded test device, not CUDA.
  TrainingConfig on_gpu = config("mse");
  on_gpu.device = "cuda:0";
  e = test::error_of([&] { ReplicatedSession(load_model(model), on_gpu, 2); });
  EXPECT_NE(e.find("replicas run on the CPU; the config asks for device 'cuda:0'"), std::string::npos) << e;
  EXPECT_TRUE(replicas_run_on("guarded"));
}

// A NaN in one replica's rows reaches every replica through the averaged gradients: all raise at the same
// point, the update is applied nowhere, and training goes on as one session's would.
TEST(ReplicatedSession, NonFiniteStepRaisedByEveryReplicaLeavesItUsable) {
  auto dir = test::temp_dir("replicas_nan");
  const auto model = test::make_mlp(dir, "6 8 1");
  TrainingSession one = TrainingSession::from_file(model, config("mse"));
  ReplicatedSession many(load_model(model), config("mse"), 2);
  const std::string t = one.target_name();
  Tensor x = random_tensor({8, 6}, 1);
  x.ptr<float>()[7 * 6] = std::nanf("");  // row 7: the second replica's part
  const Feeds bad{{"x", x}, {t, random_tensor({8, 1}, 2)}};
  EXPECT_THROW(one.train_step(bad), NonFiniteError);
  EXPECT_THROW(many.train_step(bad), NonFiniteError);
  const Feeds good{{"x", random_tensor({8, 6}, 3)}, {t, random_tensor({8, 1}, 4)}};
  const float want = one.train_step(good);
  EXPECT_NEAR(many.train_step(good), want, 1e-5 * (1 + std::abs(want)));
  expect_close_weights(many.primary(), one, 1e-5);
}

// A bad label in one part: that replica raises before the allreduce, the other fails there at once (not at the
// timeout), the error names the replica and its rows, and the session refuses further steps.
TEST(ReplicatedSession, ErrorOnOneReplicaNamesItsRowsAndStopsTheSession) {
  auto dir = test::temp_dir("replicas_label");
  const auto model = test::make_mlp(dir, "6 8 4");
  ReplicatedSession many(load_model(model), config("cross_entropy"), 2);
  Tensor y = labels(10, 4, 1);
  y.ptr<int64_t>()[7] = 12;
  std::string e = test::error_of([&] { many.train_step({{"x", random_tensor({10, 6}, 1)}, {many.primary().target_name(), y}}); });
  EXPECT_EQ(e.find("timed out"), std::string::npos) << "the other replica waited for the timeout: " << e;
  EXPECT_NE(e.find("replica 1 (rows 5..9 of the batch)"), std::string::npos) << e;
  EXPECT_NE(e.find("12"), std::string::npos) << e;
  e = test::error_of([&] { many.train_step({{"x", random_tensor({10, 6}, 1)}, {many.primary().target_name(), labels(10, 4, 2)}}); });
  EXPECT_NE(e.find("failed on some replicas only"), std::string::npos) << e;
}

TEST(ReplicatedSession, CheckpointResumesInOneSessionOrInReplicas) {
  auto dir = test::temp_dir("replicas_ckpt");
  const auto model = test::make_mlp(dir, "6 8 1");
  ReplicatedSession many(load_model(model), config("mse"), 2);
  const std::string t = many.primary().target_name();
  auto batch = [&](unsigned s) { return Feeds{{"x", random_tensor({16, 6}, s)}, {t, random_tensor({16, 1}, s + 100)}}; };
  for (unsigned s = 0; s < 3; ++s) many.train_step(batch(s));
  many.set_learning_rate(0.005);
  const auto path = dir / "ckpt.onnx";
  many.save_checkpoint(path);
  TrainingSession one = TrainingSession::from_checkpoint(path);
  EXPECT_EQ(one.step(), 3);
  EXPECT_DOUBLE_EQ(one.learning_rate(), 0.005);
  expect_close_weights(one, many.primary(), 0);
  auto again = ReplicatedSession::from_checkpoint(path, 2);
  const float a = many.train_step(batch(7)), b = again->train_step(batch(7)), c = one.train_step(batch(7));
  EXPECT_EQ(a, b);  // the same replicas on the same parts: the same bits
  EXPECT_NEAR(c, a, 1e-5 * (1 + std::abs(a)));
  expect_close_weights(again->primary(), many.primary(), 0);
}

// A data-parallel session's registry is the built-in one plus AllReduce: its plans fuse as a single session's do
// (before, any registry but the built-in one turned fusion off, and data-parallel steps ran every node apart).
TEST(ReplicatedSession, ReplicasRunTheFusedPlanOfOneSession) {
  KernelRegistry extended = default_kernels();
  EXPECT_TRUE(extended.extends_defaults());
  extended.add({"example", "NewOp", 1, 1 << 30, Device::CPU, {}, nullptr});
  EXPECT_TRUE(extended.extends_defaults());
  extended.add({"", "Relu", 1, 1 << 30, Device::CPU, {}, nullptr});  // another Relu: plans must not assume ours
  EXPECT_FALSE(extended.extends_defaults());

  auto dir = test::temp_dir("replicas_fused");
  const auto model = test::make_mlp(dir, "6 16 16 1");
  TrainingConfig cfg = config("mse");
  cfg.profile = true;
  TrainingSession one = TrainingSession::from_file(model, cfg);
  ReplicatedSession many(load_model(model), cfg, 2);
  const Feeds feeds{{"x", random_tensor({8, 6}, 1)}, {one.target_name(), random_tensor({8, 1}, 2)}};
  one.train_step(feeds);
  many.train_step(feeds);
  size_t fused_one = 0, fused_many = 0, allreduce = 0;
  for (const StepTime& t : one.profile()) fused_one += t.op.find("fused") != std::string::npos;
  for (const StepTime& t : many.primary().profile()) {
    fused_many += t.op.find("fused") != std::string::npos;
    allreduce += t.op.find("AllReduce") != std::string::npos;
  }
  EXPECT_GT(fused_one, 0u);
  EXPECT_EQ(fused_many, fused_one);
  // One bucket: AllReduceStart and AllReduceWait (distributed overlap, the default; between threads the start
  // does nothing and the wait reduces in place, docs/distributed.md).
  EXPECT_EQ(allreduce, 2u);
  EXPECT_EQ(many.primary().profile().size(), one.profile().size() + 2);
}

// The Session interface (training/session_interface.h): one function over Session& drives both kinds, and the calls
// that change state reach every replica through it.
float three_steps_through_the_interface(Session& s, const std::string& target) {
  float loss = 0;
  for (unsigned step = 0; step < 3; ++step)
    loss = s.train_step({{"x", random_tensor({8, 6}, 30 + step)}, {target, random_tensor({8, 1}, 40 + step)}});
  s.set_learning_rate(0.005);
  s.end_epoch(loss);
  s.train_step({{"x", random_tensor({8, 6}, 33)}, {target, random_tensor({8, 1}, 43)}});
  return loss;
}

TEST(ReplicatedSession, IsASessionLikeOneSession) {
  auto dir = test::temp_dir("replicas_interface");
  const auto model = test::make_mlp(dir, "6 16 1");
  const TrainingConfig cfg = config("mse");
  TrainingSession one = TrainingSession::from_file(model, cfg);
  ReplicatedSession many(load_model(model), cfg, 2);
  const std::string target = one.target_name();
  const float want = three_steps_through_the_interface(one, target);
  const float got = three_steps_through_the_interface(many, target);
  EXPECT_NEAR(got, want, 1e-5 * (1 + std::abs(want)));
  expect_close_weights(many.primary(), one, 1e-5);
  EXPECT_EQ(static_cast<Session&>(many).step(), 4);
  EXPECT_EQ(static_cast<Session&>(many).learning_rate(), 0.005);
  // set_learning_rate went to every replica, not only to the one the reads see.
  std::mutex mu;
  std::vector<double> rates;
  many.for_each([&](TrainingSession& r) {
    std::lock_guard<std::mutex> lock(mu);
    rates.push_back(r.learning_rate());
  });
  EXPECT_EQ(rates, std::vector<double>(2, 0.005));
  // Replicas are one process: the run's rank and size are those of one session without a communicator.
  const Session& as_session = many;
  EXPECT_EQ(as_session.replicas(), 2);
  EXPECT_EQ(static_cast<const Session&>(one).replicas(), 1);
  EXPECT_EQ(as_session.communicator(), nullptr);
  EXPECT_EQ(as_session.rank(), 0);
  EXPECT_EQ(as_session.world_size(), 1);
  EXPECT_EQ(as_session.state_names(), one.state_names());
}

}  // namespace
}  // namespace onnxtrain
