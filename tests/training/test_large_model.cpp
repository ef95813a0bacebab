// Models over 2 GB (docs/checkpoint.md, "Large models"), at a small scale: ONNXTRAIN_EXTERNAL_DATA_BYTES lowers
// the 2 GB switch so that a model of a few hundred kilobytes takes the same paths as a 2.5 GB one: the session
// keeps one copy of each weight (its graphs hold hollow tensors), the external data file is streamed from the
// session's store, load -> train -> checkpoint -> resume is bit for bit, the export uses external data too, the
// checksums cover the external tensors, and a save killed while writing the data file leaves the last good
// checkpoint loadable. benchmarks/bench_large_model.py runs the real size.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>

#include "common/test_env.h"
#include "graph/error.h"
#include "graph/model_io.h"
#include "training/checkpoint.h"
#include "training/session.h"

namespace onnxtrain {
namespace {

namespace fs = std::filesystem;

// Sets the threshold for the test's duration (the default, 2 GB minus headroom, afterwards).
struct ExternalDataThreshold {
  explicit ExternalDataThreshold(const char* bytes) { setenv("ONNXTRAIN_EXTERNAL_DATA_BYTES", bytes, 1); }
  ~ExternalDataThreshold() { unsetenv("ONNXTRAIN_EXTERNAL_DATA_BYTES"); }
};

// Deterministic batches for an MLP with 8 inputs and 1 output: batch k is the same in every session.
void run_steps(TrainingSession& s, int64_t from, int64_t n) {
  for (int64_t k = from; k < from + n; ++k) {
    std::mt19937 rng(static_cast<unsigned>(1000 + k));
    std::normal_distribution<float> nd;
    std::vector<float> x(16 * 8), y(16);
    for (float& v : x) v = nd(rng);
    for (int i = 0; i < 16; ++i) y[i] = std::tanh(x[i * 8] - 0.5f * x[i * 8 + 1]);
    s.train_step({{"x", Tensor::view(DType::Float32, {16, 8}, x.data())},
                  {s.target_name(), Tensor::view(DType::Float32, {16, 1}, y.data())}});
  }
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype == b.dtype && a.shape == b.shape && std::memcmp(a.data, b.data, a.nbytes()) == 0;
}

void expect_identical(const TrainingSession& a, const TrainingSession& b) {
  ASSERT_EQ(a.trainable(), b.trainable());
  for (const std::string& w : a.trainable()) EXPECT_TRUE(same_bytes(a.get_weight(w), b.get_weight(w))) << w;
  ASSERT_EQ(a.state_names(), b.state_names());
  for (const std::string& n : a.state_names()) EXPECT_TRUE(same_bytes(a.state(n), b.state(n))) << n;
  EXPECT_EQ(a.step(), b.step());
}

std::vector<fs::path> data_files(const fs::path& dir, const std::string& model_name) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n.rfind(model_name + ".", 0) == 0 && n.ends_with(".data")) out.push_back(e.path());
  }
  return out;
}

TrainingConfig adam() {
  TrainingConfig cfg;
  cfg.optimizer.kind = "adam";
  cfg.optimizer.learning_rate = 1e-2;
  return cfg;
}

TEST(LargeModel, TheSessionHoldsOneCopyOfEachWeightAndOfTheState) {
  auto dir = test::temp_dir("large_one_copy");
  TrainingSession s = TrainingSession::from_file(test::make_mlp(dir, "8 64 64 1"), adam());
  run_steps(s, 0, 2);
  // fc2.weight (64 x 64) and its moments live in the store only; the graphs keep dtype and dims.
  for (const Graph* g : {&s.training_graph(), &s.gradient_graph()}) {
    const TensorData& w = g->initializers.at("fc2.weight");
    EXPECT_TRUE(is_hollow(w));
    EXPECT_EQ(w.dims, (std::vector<int64_t>{64, 64}));
  }
  EXPECT_TRUE(is_hollow(s.training_graph().initializers.at("fc2.weight.exp_avg")));
  // Small tensors keep their bytes (gradient rules may read small constants).
  EXPECT_FALSE(is_hollow(s.training_graph().initializers.at("fc3.bias")));
  // The shells name what the store holds (host copies when the store is not host memory: the guarded test
  // device, ONNXTRAIN_DEVICE=guarded); the full forms copy it, equal to the live values.
  const bool host = s.device() == Device::CPU;
  const Model shell = s.checkpoint_shell();
  EXPECT_EQ(is_hollow(shell.graph.initializers.at("fc2.weight")), host);
  EXPECT_EQ(is_hollow(shell.training_info[0].algorithm.initializers.at("fc2.weight.exp_avg_sq")), host);
  const Tensor live = s.get_weight("fc2.weight");  // a host copy
  if (host) {
    const std::span<const std::byte> in_store = s.stored_bytes()("fc2.weight");
    ASSERT_EQ(in_store.size(), live.nbytes());
    EXPECT_EQ(std::memcmp(in_store.data(), live.data, live.nbytes()), 0);
  }
  const Model full = s.checkpoint();
  EXPECT_EQ(full.graph.initializers.at("fc2.weight").bytes.size(), live.nbytes());
  EXPECT_EQ(std::memcmp(full.graph.initializers.at("fc2.weight").bytes.data(), live.data, live.nbytes()), 0);
  EXPECT_FALSE(is_hollow(s.export_inference().graph.initializers.at("fc1.weight")));
}

TEST(LargeModel, ExternalDataLoadTrainCheckpointResumeExportBitForBit) {
  ExternalDataThreshold small("4096");  // this model's tensors add up to ~19 KB: the large-model path
  auto dir = test::temp_dir("large_round_trip");
  const fs::path model = test::make_mlp(dir, "8 64 64 1");
  TrainingSession straight = TrainingSession::from_file(model, adam());
  run_steps(straight, 0, 5);

  TrainingSession first = TrainingSession::from_file(model, adam());
  run_steps(first, 0, 3);
  const fs::path ck = dir / "ck.onnx";
  first.save_checkpoint(ck);
  ASSERT_EQ(data_files(dir, "ck.onnx").size(), 1u);
  // The large tensors moved out of the model file: fc2.weight is 16 KB, and its two moments as much again each.
  {
    unsetenv("ONNXTRAIN_EXTERNAL_DATA_BYTES");
    first.save_checkpoint(dir / "inline.onnx");
    setenv("ONNXTRAIN_EXTERNAL_DATA_BYTES", "4096", 1);
    EXPECT_TRUE(data_files(dir, "inline.onnx").empty());
    EXPECT_GT(fs::file_size(dir / "inline.onnx"), fs::file_size(ck) + 3u * 16 * 1024);
    EXPECT_GT(fs::file_size(data_files(dir, "ck.onnx")[0]), 3u * 16 * 1024);
  }
  // The file holds what the session holds: the same tensors as the in-memory checkpoint.
  const Model on_disk = load_model(ck);
  const Model in_memory = first.checkpoint();
  EXPECT_EQ(on_disk.graph.initializers, in_memory.graph.initializers);
  EXPECT_EQ(on_disk.training_info[0].algorithm.initializers, in_memory.training_info[0].algorithm.initializers);

  TrainingSession resumed = TrainingSession::from_checkpoint(ck);
  run_steps(resumed, 3, 2);
  expect_identical(straight, resumed);

  // Saving again replaces the data file; the export uses external data as well and loads to the live weights.
  resumed.save_checkpoint(ck);
  EXPECT_EQ(data_files(dir, "ck.onnx").size(), 1u);
  const fs::path exported = dir / "exported.onnx";
  resumed.export_inference(exported);
  ASSERT_EQ(data_files(dir, "exported.onnx").size(), 1u);
  const Model back = load_model(exported);
  EXPECT_TRUE(back.training_info.empty());
  for (const std::string& w : resumed.trainable()) {
    const TensorData& t = back.graph.initializers.at(w);
    const Tensor live = resumed.get_weight(w);
    ASSERT_EQ(t.bytes.size(), live.nbytes()) << w;
    EXPECT_EQ(std::memcmp(t.bytes.data(), live.data, live.nbytes()), 0) << w;
  }
  // Under the threshold again: the next save is one file, and the data file goes.
  unsetenv("ONNXTRAIN_EXTERNAL_DATA_BYTES");
  resumed.save_checkpoint(ck);
  EXPECT_TRUE(data_files(dir, "ck.onnx").empty());
  expect_identical(resumed, TrainingSession::from_checkpoint(ck));
}

TEST(LargeModel, AMalformedThresholdIsNamed) {
  ExternalDataThreshold bad("2GB");
  auto dir = test::temp_dir("large_bad_threshold");
  TrainingSession s = TrainingSession::from_file(test::make_mlp(dir, "8 16 1"), adam());
  try {
    s.save_checkpoint(dir / "ck.onnx");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ONNXTRAIN_EXTERNAL_DATA_BYTES"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'2GB'"), std::string::npos) << e.what();
  }
}

// Flips one byte inside the external data file (weights and optimizer state streamed from the store); the load
// must fail on the checksum and name the tensor, and the intact file loads again.
TEST(LargeModel, ChecksumsCoverTheExternalTensors) {
  ExternalDataThreshold small("1");
  auto dir = test::temp_dir("large_checksums");
  TrainingSession s = TrainingSession::from_file(test::make_mlp(dir, "8 64 64 1"), adam());
  run_steps(s, 0, 2);
  const fs::path ck = dir / "ck.onnx";
  s.save_checkpoint(ck);
  const std::vector<fs::path> data = data_files(dir, "ck.onnx");
  ASSERT_EQ(data.size(), 1u);
  const auto size = fs::file_size(data[0]);
  // Every byte of the data file belongs to some tensor's checksum or is alignment padding: flip bytes at a few
  // places spread over the file, each in a fresh copy, and expect a named tensor whenever the load fails.
  std::vector<char> original(size);
  {
    std::ifstream in(data[0], std::ios::binary);
    in.read(original.data(), static_cast<std::streamsize>(size));
  }
  int named = 0;
  for (size_t at : {size_t(0), size / 3, size / 2, size - 200}) {
    SCOPED_TRACE(at);
    std::vector<char> flipped = original;
    flipped[at] ^= 0x10;
    {
      std::ofstream out(data[0], std::ios::binary | std::ios::trunc);
      out.write(flipped.data(), static_cast<std::streamsize>(size));
    }
    try {
      TrainingSession::from_checkpoint(ck);
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("does not match its checksum"), std::string::npos) << msg;
      EXPECT_NE(msg.find("tensor '"), std::string::npos) << msg;
      ++named;
    }
  }
  EXPECT_GE(named, 3);  // at most one of the places can be padding
  std::ofstream(data[0], std::ios::binary | std::ios::trunc).write(original.data(), static_cast<std::streamsize>(size));
  expect_identical(s, TrainingSession::from_checkpoint(ck));
}

// A child saves a checkpoint of weights all 1 over one of weights all 0 through the streamed path, and is
// SIGKILLed half-way through writing the data file, before its rename, just after it, and the same for the
// model file (ONNXTRAIN_TEST_KILL_SAVE, graph/model_io.cpp). The checkpoint on disk must be one whole save.
TEST(LargeModel, AKilledStreamedSaveLeavesTheLastGoodCheckpoint) {
  ExternalDataThreshold small("1");
  auto dir = test::temp_dir("large_kill");
  TrainingSession s = TrainingSession::from_file(test::make_mlp(dir, "8 64 64 1"), adam());
  run_steps(s, 0, 1);
  const fs::path ck = dir / "ck.onnx";
  auto fill_weights = [&](float v) {
    for (const std::string& w : s.trainable()) {
      Tensor t = s.get_weight(w);
      for (int64_t k = 0; k < t.numel(); ++k) t.ptr<float>()[k] = v;
      s.set_weight(w, t);
    }
  };
  struct Point {
    const char* spec;
    float on_disk;
  };
  for (const Point p : {Point{"write:.data", 0}, Point{"rename:.data", 0}, Point{"renamed:.data", 0},
                        Point{"write:ck.onnx", 0}, Point{"rename:ck.onnx", 0}, Point{"renamed:ck.onnx", 1}}) {
    SCOPED_TRACE(p.spec);
    fill_weights(0);
    s.save_checkpoint(ck);
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      try {
        setenv("ONNXTRAIN_TEST_KILL_SAVE", p.spec, 1);
        fill_weights(1);
        s.save_checkpoint(ck);
      } catch (...) {
      }
      _exit(3);
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "the child was not killed (status " << status << ")";
    TrainingSession r = TrainingSession::from_checkpoint(ck);  // loads, checksums included
    size_t other = 0;
    for (const std::string& w : r.trainable()) {
      Tensor t = r.get_weight(w);
      for (int64_t k = 0; k < t.numel(); ++k) other += t.ptr<float>()[k] != p.on_disk;
    }
    EXPECT_EQ(other, 0u) << "weights from different saves";
  }
  // The next save cleans up: one data file, no temp files.
  s.save_checkpoint(ck);
  EXPECT_EQ(data_files(dir, "ck.onnx").size(), 1u);
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
}

}  // namespace
}  // namespace onnxtrain
