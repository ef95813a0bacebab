// Data parallelism for real: `mpirun -np N dist_worker ...` on this machine, CPU, against single-process
// references computed here. Every launch runs under `timeout -s KILL`, so a hang fails the test instead of
// blocking the suite.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>

#include "common/test_env.h"
#include "distributed/mpi.h"
#include "dp_common.h"
#include "launch.h"
#include "graph/model_io.h"

namespace onnxtrain {
namespace {

using test::Launch;
using test::max_relative;
using test::mpirun;

bool has(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

class Mpirun : public ::testing::Test {
 public:
  void SetUp() override {
    if (!mpi_available()) GTEST_SKIP() << "built without MPI: the mpirun tests need libopenmpi-dev";
    if (std::string(ONNXTRAIN_MPIEXEC).empty()) GTEST_SKIP() << "no mpirun found at configure time";
  }
  std::filesystem::path model(const std::string& name) {
    dir_ = test::temp_dir(name);
    const auto path = dir_ / "mlp.onnx";
    const std::string cmd = test::python() + " " + (test::source_dir() / "examples/make_mlp.py").string() +
                            " " + path.string() + " --sizes 16 32 8 1 > /dev/null";
    EXPECT_EQ(std::system(cmd.c_str()), 0);
    return path;
  }
  std::filesystem::path dir_;
};

TEST_F(Mpirun, CollectivesOnTwoAndThreeRanks) {
  for (int np : {2, 3}) {
    Launch l = mpirun(np, "collectives");
    EXPECT_EQ(l.status, 0) << l.output;
    for (int r = 0; r < np; ++r) EXPECT_TRUE(has(l.output, "rank " + std::to_string(r) + ": collectives ok")) << l.output;
  }
}

std::vector<float> read_floats(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::vector<float> v;
  for (float x; in >> x;) v.push_back(x);
  return v;
}

constexpr double kTolerance = 1e-5;  // issue 9: relative, float32, after 20 steps

// Adam sits at float32's noise floor: both runs sum the same 16 per-sample gradients in a different order
// (8 + 8 across ranks, 16 in one GEMM), and Adam divides each element by sqrt(v), so an element whose gradient is
// near zero turns a last-bit difference into a visible one. adam_sum measured 9.6e-6 on one CPU and 1.8e-5 on
// another (a different GEMM kernel), with the same binary logic; plain adam measured 9.6e-6 with dnnl_sgemm and
// 1.25e-5 with our own GEMM (executor/cpu/gemm.h, which sums in another order). 3e-5 bounds that noise while a
// missing or wrong reduction still fails by orders of magnitude (~1, checked by removing AllReduce). The
// sanitizer build (clang 14 at -O1 instead of gcc at -O3) rounds differently again: sgd_momentum measured 1.16e-5
// there, so it gets the same 3e-5 bound. The other optimizers hold 1e-5 (issue 9's bound).
double tolerance(const std::string& config) {
  return config == "adam_sum" || config == "adam" || test::kUnderAsan ? 3e-5 : kTolerance;
}

class Equivalence : public Mpirun, public ::testing::WithParamInterface<std::tuple<const char*, const char*>> {};

// Two ranks with batch 8 each against one process with batch 16 on the same samples (the sampler's shards),
// with the reductions overlapped with the backward pass and blocking (test::kDpModes).
TEST_P(Equivalence, TwoRanksEqualOneProcessWithTwiceTheBatch) {
  const std::string config = std::get<0>(GetParam()), mode = std::get<1>(GetParam());
  const auto path = model("dp_equiv_" + config + "_" + mode);
  Launch l = mpirun(2, "train " + path.string() + " " + config + " " + dir_.string() + " 8 20 " + mode);
  ASSERT_EQ(l.status, 0) << l.output;

  const test::Dataset data = test::make_dataset(1024, 16, 3);  // as dist_worker
  TrainingSession ref = TrainingSession::from_file(path, test::dp_config(config));
  const std::vector<float> ref_losses = test::train_shard(ref, data, 0, 1, 20, 16);

  const Model m0 = load_model(dir_ / "final_rank0.onnx"), m1 = load_model(dir_ / "final_rank1.onnx");
  double worst = 0;
  for (const std::string& w : ref.trainable()) {
    const Tensor want = ref.get_weight(w);
    const TensorData& r0 = m0.graph.initializers.at(w);
    EXPECT_EQ(r0.bytes, m1.graph.initializers.at(w).bytes) << w << ": the ranks' weights must be identical";
    const double rel = max_relative(r0.as<float>(), want.span<float>());
    worst = std::max(worst, rel);
    EXPECT_LE(rel, tolerance(config)) << w;
  }
  const std::vector<float> losses = read_floats(dir_ / "losses_rank0.txt");
  ASSERT_EQ(losses.size(), ref_losses.size());
  EXPECT_LE(max_relative(losses, ref_losses), kTolerance) << "rank 0 reports the loss of both ranks' batches";
  EXPECT_EQ(read_floats(dir_ / "losses_rank1.txt"), losses) << "every rank reports the same (reduced) loss";
  std::printf("[ %s %s ] max relative weight difference after 20 steps: %.3g\n", config.c_str(), mode.c_str(), worst);

  // Only rank 0 wrote its checkpoint. It resumes in one process with exactly the ranks' weights and step, and
  // training continues on the reference's trajectory (which the ranks' already matches to 1e-5; a few more
  // Adam steps may widen that a little, hence 1e-4 here).
  EXPECT_TRUE(std::filesystem::exists(dir_ / "checkpoint_rank0.onnx"));
  EXPECT_FALSE(std::filesystem::exists(dir_ / "checkpoint_rank1.onnx"));
  TrainingSession resumed = TrainingSession::from_checkpoint(dir_ / "checkpoint_rank0.onnx");
  EXPECT_EQ(resumed.step(), ref.step());
  for (const std::string& w : ref.trainable()) {
    const Tensor t = resumed.get_weight(w);
    const TensorData& r0 = m0.graph.initializers.at(w);
    EXPECT_EQ(0, std::memcmp(t.data, r0.bytes.data(), r0.bytes.size())) << w;
  }
  SamplerOptions so;
  so.seed = 7;
  const std::vector<int64_t> idx = DistributedSampler(1024, 0, 1, so).indices();
  for (int k = 20; k < 25; ++k) {
    const float a = resumed.train_step(test::gather_batch(data, idx, k * 16, 16, resumed));
    const float b = ref.train_step(test::gather_batch(data, idx, k * 16, 16, ref));
    EXPECT_LE(std::fabs(a - b), 1e-4 * std::fabs(b)) << "step " << k;
  }
  for (const std::string& w : ref.trainable())
    EXPECT_LE(max_relative(resumed.get_weight(w).span<float>(), ref.get_weight(w).span<float>()), 1e-4) << w;
}

// The example of docs/distributed.md: trains under mpirun, and rank 0's checkpoint resumes in one process.
TEST_F(Mpirun, ExampleTrainsAndItsCheckpointResumes) {
  const auto path = model("dp_example");
  const auto ckpt = dir_ / "ckpt.onnx";
  Launch l = mpirun(2, path.string() + " --epochs 3 --samples 2048 --checkpoint " + ckpt.string(), "", TRAIN_MLP_MPI);
  ASSERT_EQ(l.status, 0) << l.output;
  EXPECT_TRUE(has(l.output, "2 rank(s) (mpi), 32 steps per epoch of 2 x 32 samples")) << l.output;
  std::vector<double> losses;
  for (size_t at = 0; (at = l.output.find("loss ", at)) != std::string::npos; at += 5)
    losses.push_back(std::stod(l.output.substr(at + 5)));
  ASSERT_EQ(losses.size(), 3u) << "only rank 0 prints\n" << l.output;
  EXPECT_LT(losses.back(), 0.5 * losses.front()) << l.output;
  TrainingSession resumed = TrainingSession::from_checkpoint(ckpt);
  EXPECT_EQ(resumed.step(), 3 * 32);
  const test::Dataset d = test::make_dataset(64, 16, 9);
  EXPECT_TRUE(std::isfinite(resumed.train_step(test::gather_batch(d, {0, 1, 2, 3}, 0, 4, resumed))));
}

INSTANTIATE_TEST_SUITE_P(Optimizers, Equivalence,
                         ::testing::Combine(::testing::Values("sgd_momentum", "adam", "adam_sum", "sgd_accumulate"),
                                            ::testing::ValuesIn(test::kDpModes)),
                         [](const auto& i) { return std::string(std::get<0>(i.param)) + "_" + std::get<1>(i.param); });

// Failures: rank 1 fails at step 5; everything must end, with a clear error. Whether it ended is an event, not
// a stopwatch: a job that hangs is killed by the launch's own time limit (Launch::hung()), and the message says
// which way it ended (the other rank's error, or the communicator's timeout).
constexpr const char* kShortTimeout = "-x ONNXTRAIN_COMM_TIMEOUT=3";

// Launches the worker with rank 1 failing by `how` at step 5; checks the job ended by itself, with a non-zero
// status unless mpirun runs with --enable-recovery, and with `message` in the output.
void expect_job_ends(Mpirun& t, const std::string& how, const std::string& options, const std::string& message) {
  const auto path = t.model("dp_fail_" + how);
  Launch l = mpirun(2, "fail " + path.string() + " " + how + " 5", options);
  EXPECT_FALSE(l.hung()) << l.output;
  if (!has(options, "--enable-recovery")) {  // that mode reports 0 (OpenMPI 4.1)
    EXPECT_NE(l.status, 0) << l.output;
  }
  EXPECT_TRUE(has(l.output, message)) << l.output;
  EXPECT_FALSE(has(l.output, "finished all steps")) << l.output;
}

const std::string kTimedOut = "mpi rank 0 of 2: allreduce of 818 float32 values timed out after 3 s waiting for the other ranks";

TEST_F(Mpirun, KilledRankEndsTheJob) { expect_job_ends(*this, "kill", kShortTimeout, "exited on signal 9"); }

// --enable-recovery keeps mpirun from killing the job, so rank 0's own timeout has to end it.
TEST_F(Mpirun, KilledRankWithoutLauncherHelpTimesOutOnTheSurvivor) {
  expect_job_ends(*this, "kill", std::string(kShortTimeout) + " --enable-recovery", kTimedOut);
}

TEST_F(Mpirun, StoppedRankTimesOut) { expect_job_ends(*this, "stop", kShortTimeout, kTimedOut); }

// Communicator::abort must not wait for the communicator's timeout: with one of an hour, waiting would run into
// the launch's time limit, and the survivor's message would be the timeout's.
TEST_F(Mpirun, RaisingRankThatAbortsEndsTheJobAtOnce) {
  expect_job_ends(*this, "raise_abort", "-x ONNXTRAIN_COMM_TIMEOUT=3600", "rank 1: a deliberate error at step 5");
}

TEST_F(Mpirun, RaisingRankThatReturnsEndsTheJob) {
  expect_job_ends(*this, "raise", kShortTimeout, "rank 1: a deliberate error at step 5");
}

}  // namespace
}  // namespace onnxtrain
