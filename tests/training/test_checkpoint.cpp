// Trainable checkpoints (docs/checkpoint.md): bit-for-bit resume, the stored format, atomic saves under a real
// SIGKILL, and clear errors for damaged files.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <set>

#include "common/test_env.h"
#include "graph/error.h"
#include "graph/model_io.h"
#include "training/checkpoint.h"
#include "training/training_info_runner.h"
#include "training/session.h"

namespace onnxtrain {
namespace {

namespace fs = std::filesystem;

fs::path make_mlp(const fs::path& dir, const std::string& sizes) {
  auto path = dir / "mlp.onnx";
  std::string cmd = test::python() + " " + (test::source_dir() / "examples/make_mlp.py").string() + " " +
                    path.string() + " --sizes " + sizes + " > /dev/null";
  if (std::system(cmd.c_str()) != 0) throw std::runtime_error("failed: " + cmd);
  return path;
}

// Deterministic batches: batch k is the same in every session that asks for it.
Feeds batch(const TrainingSession& s, int64_t k, int64_t bs, int64_t f, std::vector<std::vector<float>>& keep) {
  std::mt19937 rng(static_cast<unsigned>(1000 + k));
  std::normal_distribution<float> nd;
  keep.emplace_back(static_cast<size_t>(bs * f));
  for (auto& v : keep.back()) v = nd(rng);
  float* x = keep.back().data();
  keep.emplace_back(static_cast<size_t>(bs));
  for (int64_t i = 0; i < bs; ++i) keep.back()[i] = std::tanh(x[i * f] - 0.5f * x[i * f + 1]);
  return {{"x", Tensor::view(DType::Float32, {bs, f}, x)},
          {s.target_name(), Tensor::view(DType::Float32, {bs, 1}, keep.back().data())}};
}

void run_steps(TrainingSession& s, int64_t from, int64_t n) {
  std::vector<std::vector<float>> keep;
  for (int64_t k = from; k < from + n; ++k) s.train_step(batch(s, k, 16, 8, keep));
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype == b.dtype && a.shape == b.shape && std::memcmp(a.data, b.data, a.nbytes()) == 0;
}

// Optimizer state and step (the child changes only weights).
void expect_identical_state(const TrainingSession& a, const TrainingSession& b) {
  ASSERT_EQ(a.state_names(), b.state_names());
  for (const std::string& n : a.state_names()) EXPECT_TRUE(same_bytes(a.state(n), b.state(n))) << n;
  EXPECT_EQ(a.step(), b.step());
}

void expect_identical(const TrainingSession& a, const TrainingSession& b) {
  ASSERT_EQ(a.trainable(), b.trainable());
  for (const std::string& w : a.trainable()) EXPECT_TRUE(same_bytes(a.get_weight(w), b.get_weight(w))) << w;
  ASSERT_EQ(a.state_names(), b.state_names());
  for (const std::string& n : a.state_names()) EXPECT_TRUE(same_bytes(a.state(n), b.state(n))) << n;
  EXPECT_EQ(a.step(), b.step());
}

// N steps, save, load, M steps must equal N + M steps straight, byte for byte.
void check_resume(const TrainingConfig& cfg, const std::string& name, int64_t n, int64_t m) {
  auto dir = test::temp_dir("ckpt_resume_" + name);
  const fs::path model = make_mlp(dir, "8 32 16 1");
  TrainingSession straight = TrainingSession::from_file(model, cfg);
  run_steps(straight, 0, n);
  const fs::path ck = dir / "ck.onnx";
  straight.save_checkpoint(ck);
  TrainingSession resumed = TrainingSession::from_checkpoint(ck);
  expect_identical(straight, resumed);
  EXPECT_EQ(resumed.learning_rate(), straight.learning_rate());
  run_steps(straight, n, m);
  run_steps(resumed, n, m);
  expect_identical(straight, resumed);
  EXPECT_EQ(resumed.learning_rate(), straight.learning_rate());
  // And the resumed run really trained (the comparison is not between two frozen sessions).
  TrainingSession fresh = TrainingSession::from_file(model, cfg);
  EXPECT_FALSE(same_bytes(fresh.get_weight("fc1.weight"), resumed.get_weight("fc1.weight")));
}

TEST(Checkpoint, ResumeIsBitForBitSgdMomentum) {
  TrainingConfig cfg;
  cfg.optimizer.kind = "sgd";
  cfg.optimizer.momentum = 0.9;
  cfg.optimizer.nesterov = true;
  cfg.optimizer.weight_decay = 1e-3;
  cfg.optimizer.learning_rate = 0.03;
  cfg.schedule.kind = "step";
  cfg.schedule.step_size = 2;
  cfg.schedule.gamma = 0.7;
  check_resume(cfg, "sgd", 5, 6);
}

TEST(Checkpoint, ResumeIsBitForBitAdam) {
  TrainingConfig cfg;
  cfg.optimizer.kind = "adam";
  cfg.optimizer.learning_rate = 3e-3;
  cfg.optimizer.amsgrad = true;
  cfg.optimizer.max_grad_norm = 0.5;
  cfg.schedule.kind = "cosine";
  cfg.schedule.warmup_steps = 3;
  cfg.schedule.total_steps = 20;
  check_resume(cfg, "adam", 4, 7);
}

// Saved in the middle of a gradient accumulation: the partial sum and the micro-batch count carry over.
TEST(Checkpoint, ResumeIsBitForBitMidAccumulation) {
  TrainingConfig cfg;
  cfg.optimizer.kind = "adamw";
  cfg.optimizer.gradient_accumulation = 3;
  cfg.optimizer.groups.push_back({{"*.bias"}, 1e-2, 0.0});
  cfg.loss.kind = "huber";
  cfg.loss.delta = 0.3;
  check_resume(cfg, "accum", 4, 5);
}

// The adaptive schedule learns from epoch losses; what it learned (rate, best loss, patience count) resumes.
TEST(Checkpoint, AdaptiveScheduleStateResumes) {
  TrainingConfig cfg;
  cfg.optimizer.learning_rate = 0.05;
  cfg.schedule.kind = "adaptive";
  cfg.schedule.n_iter_no_change = 1;
  auto dir = test::temp_dir("ckpt_adaptive");
  TrainingSession straight = TrainingSession::from_file(make_mlp(dir, "8 16 1"), cfg);
  // Losses that stop improving: after two bad epochs the rate drops by 5, and one bad epoch is pending.
  for (double loss : {1.0, 0.5, 0.6, 0.7, 0.8}) straight.end_epoch(loss);
  run_steps(straight, 0, 1);
  const fs::path ck = dir / "ck.onnx";
  straight.save_checkpoint(ck);
  TrainingSession resumed = TrainingSession::from_checkpoint(ck);
  for (TrainingSession* s : {&straight, &resumed}) {
    s->end_epoch(0.9);  // the second bad epoch in a row since the drop: a resumed count makes it drop again
    run_steps(*s, 1, 1);
  }
  EXPECT_EQ(resumed.learning_rate(), straight.learning_rate());
  EXPECT_DOUBLE_EQ(straight.learning_rate(), 0.05 / 25);
  expect_identical(straight, resumed);
}

TEST(Checkpoint, FormatHoldsTrainingStepStateAndConfig) {
  auto dir = test::temp_dir("ckpt_format");
  TrainingConfig cfg;
  cfg.optimizer.kind = "adam";
  TrainingSession s = TrainingSession::from_file(make_mlp(dir, "8 16 1"), cfg);
  run_steps(s, 0, 2);
  s.save_checkpoint(dir / "ck.onnx");
  const Model m = load_model(dir / "ck.onnx");
  ASSERT_EQ(m.training_info.size(), 1u);
  const TrainingInfo& ti = m.training_info[0];
  std::map<std::string, std::string> update(ti.update_binding.begin(), ti.update_binding.end());
  std::set<std::string> alg_outputs;
  for (const ValueInfo& o : ti.algorithm.outputs) alg_outputs.insert(o.name);
  for (const std::string& w : s.trainable()) {
    ASSERT_TRUE(update.count(w)) << w;
    EXPECT_TRUE(alg_outputs.count(update[w])) << w;
    EXPECT_TRUE(m.graph.is_initializer(w));
    EXPECT_FALSE(ti.algorithm.is_initializer(w)) << "weights live in the main graph only";
    for (const char* suffix : {".exp_avg", ".exp_avg_sq"}) {
      const std::string st = w + suffix;
      EXPECT_TRUE(update.count(st)) << st;
      ASSERT_TRUE(ti.algorithm.is_initializer(st)) << st;
      EXPECT_FALSE(m.graph.is_initializer(st)) << "optimizer state stays out of the inference graph";
    }
  }
  EXPECT_TRUE(update.count("optim.step"));
  EXPECT_EQ(ti.algorithm.initializers.at("optim.step").as<int64_t>()[0], 2);
  std::set<std::string> init_keys;
  for (const auto& [k, v] : ti.initialization_binding) init_keys.insert(k);
  for (const std::string& st : s.state_names()) EXPECT_TRUE(init_keys.count(st)) << st;
  // Inputs of the algorithm are only what the main graph does not already have: the loss target.
  ASSERT_EQ(ti.algorithm.inputs.size(), 1u);
  EXPECT_EQ(ti.algorithm.inputs[0].name, s.target_name());
  std::map<std::string, std::string> meta(m.metadata.begin(), m.metadata.end());
  EXPECT_EQ(meta["onnxtrain.version"], ONNXTRAIN_VERSION);
  EXPECT_EQ(meta["onnxtrain.optimizer.kind"], "adam");
  EXPECT_EQ(meta["onnxtrain.step"], "2");

  // export_inference: no training info, no optimizer state, none of our metadata.
  s.export_inference(dir / "inf.onnx");
  const Model inf = load_model(dir / "inf.onnx");
  EXPECT_TRUE(inf.training_info.empty());
  for (const auto& [name, t] : inf.graph.initializers) EXPECT_EQ(name.find("optim."), std::string::npos) << name;
  EXPECT_EQ(inf.graph.initializers.size(), 4u);
  for (const auto& [k, v] : inf.metadata) EXPECT_NE(k.rfind("onnxtrain.", 0), 0u) << k;
  // A session re-loaded from the checkpoint exports the same clean model.
  TrainingSession r = TrainingSession::from_checkpoint(dir / "ck.onnx");
  EXPECT_TRUE(r.export_inference().training_info.empty());
  EXPECT_TRUE(r.export_inference().functions.empty());
}

TEST(Checkpoint, ConfigRoundTripsThroughMetadata) {
  TrainingConfig c;
  c.trainable = {"a,b", "c"};
  c.prediction = "out";
  c.loss.kind = "cross_entropy";
  c.loss.class_weights = {0.1, 1.0 / 3.0, 2e-300};
  c.loss.ignore_index = std::nullopt;
  c.loss.eps = 1e-7;
  c.loss.label_smoothing = 0.05;
  c.penalty.l2 = 0.25;
  c.optimizer.kind = "sgd";
  c.optimizer.learning_rate = 0.1 + 0.2;  // not a short decimal: must still round-trip exactly
  c.optimizer.eps = std::nullopt;
  c.optimizer.weight_decay = 0.0;
  c.optimizer.nesterov = true;
  c.optimizer.gradient_accumulation = 4;
  c.optimizer.groups.push_back({{"fc1.*", "x?"}, 0.5, std::nullopt});
  c.optimizer.groups.push_back({{"b"}, std::nullopt, 1e-4});
  c.schedule.kind = "adaptive";
  c.schedule.n_iter_no_change = 7;
  const TrainingConfig r = config_from_metadata(config_to_metadata(c), "test");
  EXPECT_EQ(r.trainable, c.trainable);
  EXPECT_EQ(r.prediction, c.prediction);
  EXPECT_EQ(r.loss.kind, c.loss.kind);
  EXPECT_EQ(r.loss.class_weights, c.loss.class_weights);
  EXPECT_EQ(r.loss.ignore_index, std::nullopt);
  EXPECT_EQ(r.loss.eps, c.loss.eps);
  EXPECT_EQ(r.loss.label_smoothing, c.loss.label_smoothing);
  EXPECT_EQ(r.penalty.l2, c.penalty.l2);
  EXPECT_EQ(r.optimizer.learning_rate, c.optimizer.learning_rate);
  EXPECT_EQ(r.optimizer.eps, std::nullopt);
  EXPECT_EQ(r.optimizer.weight_decay, std::optional<double>(0.0));
  EXPECT_TRUE(r.optimizer.nesterov);
  EXPECT_EQ(r.optimizer.gradient_accumulation, 4);
  ASSERT_EQ(r.optimizer.groups.size(), 2u);
  EXPECT_EQ(r.optimizer.groups[0].match, c.optimizer.groups[0].match);
  EXPECT_EQ(r.optimizer.groups[0].learning_rate, 0.5);
  EXPECT_EQ(r.optimizer.groups[0].weight_decay, std::nullopt);
  EXPECT_EQ(r.optimizer.groups[1].weight_decay, 1e-4);
  EXPECT_EQ(r.schedule.kind, "adaptive");
  EXPECT_EQ(r.schedule.n_iter_no_change, 7);

  Metadata bad = config_to_metadata(c);
  for (auto& [k, v] : bad)
    if (k == "onnxtrain.optimizer.momentum") v = "0.9x";
  try {
    config_from_metadata(bad, "ck.onnx");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ck.onnx"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("onnxtrain.optimizer.momentum"), std::string::npos) << e.what();
  }
}

std::string error_of(const fs::path& p) {
  try {
    TrainingSession::from_checkpoint(p);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Checkpoint, DamagedFilesGiveClearErrors) {
  auto dir = test::temp_dir("ckpt_damaged");
  const fs::path model = make_mlp(dir, "8 16 1");
  TrainingSession s = TrainingSession::from_file(model, {});
  s.save_checkpoint(dir / "ck.onnx");
  std::ifstream in(dir / "ck.onnx", std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(bytes.size(), 1000u);

  auto write = [&](const std::string& name, const std::string& content) {
    std::ofstream(dir / name, std::ios::binary) << content;
    return dir / name;
  };
  // Truncated at several points, including inside the tensors and inside the training info.
  for (size_t cut : {size_t(0), size_t(7), bytes.size() / 3, bytes.size() / 2, bytes.size() - 5}) {
    const fs::path p = write("trunc.onnx", bytes.substr(0, cut));
    const std::string err = error_of(p);
    EXPECT_NE(err.find("trunc.onnx"), std::string::npos) << "cut at " << cut << ": '" << err << "'";
  }
  // Random bytes, and a valid checkpoint with a flipped run of bytes in the middle.
  std::mt19937 rng(3);
  std::string garbage(4096, '\0');
  for (auto& c : garbage) c = static_cast<char>(rng());
  EXPECT_NE(error_of(write("garbage.onnx", garbage)).find("garbage.onnx"), std::string::npos);
  std::string flipped = bytes;
  for (size_t i = bytes.size() / 2; i < bytes.size() / 2 + 64; ++i) flipped[i] = static_cast<char>(~flipped[i]);
  // A flip inside a float payload is still a well-formed model; only framing damage must be reported.
  const std::string err = error_of(write("flipped.onnx", flipped));
  if (!err.empty()) {
    EXPECT_NE(err.find("flipped.onnx"), std::string::npos) << err;
  }
  // A plain model is not a checkpoint, and a missing file is named.
  EXPECT_NE(error_of(model).find("not an onnxtrain checkpoint"), std::string::npos) << error_of(model);
  EXPECT_NE(error_of(dir / "missing.onnx").find("missing.onnx"), std::string::npos);
}

// A child process saves a checkpoint with every weight set to 1 over one whose weights are all 0, and is
// SIGKILLed at a chosen point of the save (ONNXTRAIN_TEST_KILL_SAVE, graph/model_io.cpp): half-way through
// writing a file, before its rename, or just after it. With external data the data file is written first, then
// the model that points at it. The file on disk must always be one complete save: it loads, and every weight
// holds the same value (a model from one save pointing at the data file of another would mix inline small
// tensors with external large ones from different saves). The kill points are events, not timer guesses, so
// each case happens in every run. The next successful save removes the killed save's temp files.
void kill_mid_save(const std::string& name, bool external) {
  auto dir = test::temp_dir("ckpt_kill_" + name);
  TrainingConfig cfg;
  cfg.optimizer.kind = "adam";
  TrainingSession s = TrainingSession::from_file(make_mlp(dir, "8 256 256 1"), cfg);
  run_steps(s, 0, 1);
  const fs::path ck = dir / "ck.onnx";
  auto save = [&] { save_model_large(s.checkpoint(), ck, SaveOptions{.force_external_data = external}); };
  auto fill_weights = [&](float v) {
    for (const std::string& w : s.trainable()) {
      Tensor t = s.get_weight(w);
      for (int64_t k = 0; k < t.numel(); ++k) t.ptr<float>()[k] = v;
      s.set_weight(w, t);
    }
  };
  auto temp_files = [&] {
    std::vector<std::string> found;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().filename().string().rfind(".ck.onnx", 0) == 0) found.push_back(e.path().filename().string());
    return found;
  };
  fill_weights(0);
  save();
  ASSERT_TRUE(temp_files().empty());

  struct Point {
    std::string spec;
    float on_disk;    // the weights' value in the checkpoint after the kill
    bool temp_left;   // the killed save left a temp file behind
  };
  std::vector<Point> points;
  const std::string model_suffix = ":ck.onnx";
  if (external)
    for (const char* phase : {"write", "rename", "renamed"})
      points.push_back({std::string(phase) + ":.data", 0.0f, std::string(phase) != "renamed"});
  points.push_back({"write" + model_suffix, 0.0f, true});
  points.push_back({"rename" + model_suffix, 0.0f, true});
  points.push_back({"renamed" + model_suffix, 1.0f, false});

  for (const Point& p : points) {
    SCOPED_TRACE(p.spec);
    fill_weights(0);
    save();  // a complete save of 0s, which also removes the temp files of the previous kill
    ASSERT_TRUE(temp_files().empty());
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      // Child: one save of 1s, killed by the hook; exceptions must not unwind into gtest.
      try {
        setenv("ONNXTRAIN_TEST_KILL_SAVE", p.spec.c_str(), 1);
        fill_weights(1);
        save();
      } catch (...) {
      }
      _exit(3);
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "the child was not killed (status " << status << ")";
    EXPECT_EQ(!temp_files().empty(), p.temp_left);
    TrainingSession r = TrainingSession::from_checkpoint(ck);
    const float v = r.get_weight("fc2.bias").ptr<float>()[0];  // inline even with external data
    EXPECT_EQ(v, p.on_disk);
    size_t mixed = 0;
    for (const std::string& w : r.trainable()) {
      Tensor t = r.get_weight(w);
      for (int64_t k = 0; k < t.numel(); ++k) mixed += t.ptr<float>()[k] != v;
    }
    EXPECT_EQ(mixed, 0u) << "weights from different saves (fc2.bias = " << v << ")";
    if (v == 0.0f) {
      fill_weights(0);
      expect_identical_state(s, r);
    }
  }
  fill_weights(2);
  save();
  EXPECT_TRUE(temp_files().empty()) << "a successful save removes the temp files that killed saves left";
  EXPECT_EQ(TrainingSession::from_checkpoint(ck).get_weight("fc2.bias").ptr<float>()[0], 2.0f);
}

TEST(Checkpoint, KillMidSaveLeavesPreviousCheckpointReadable) { kill_mid_save("inline", false); }
TEST(Checkpoint, KillMidSaveWithExternalDataLeavesPreviousCheckpointReadable) { kill_mid_save("external", true); }

}  // namespace
}  // namespace onnxtrain

namespace onnxtrain {
namespace {

template <class T> std::vector<T> read_raw(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::string b((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (b.empty() || b.size() % sizeof(T)) throw std::runtime_error("bad file " + p.string());
  std::vector<T> v(b.size() / sizeof(T));
  std::memcpy(v.data(), b.data(), b.size());
  return v;
}

// A model written in Python with onnx.helper.make_training_info (Gradient op + Momentum/Adam of
// ai.onnx.preview.training, stale optimizer state that initialization must reset): our runner executes the
// spec and the weights match numpy running onnx's reference update rules.
void check_training_info(const std::string& kind) {
  auto dir = test::temp_dir("training_info_" + kind);
  std::string cmd = test::python() + " " +
                    (test::source_dir() / "tests/training/training_info_reference.py").string() + " " + dir.string() +
                    " " + kind;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  TrainingInfoRunner r(load_model(dir / "model.onnx"));
  EXPECT_EQ(*r.value("T").ptr<int64_t>(), 7);  // stale, as stored
  r.initialize();
  EXPECT_EQ(*r.value("T").ptr<int64_t>(), 0);
  for (const char* st : {"V_W", "V_B"}) {
    Tensor v = r.value(st);
    for (int64_t i = 0; i < v.numel(); ++i) EXPECT_EQ(v.ptr<float>()[i], 0.0f) << st;
  }
  const std::vector<double> loss = read_raw<double>(dir / "loss.bin");
  for (size_t k = 0; k < loss.size(); ++k) {
    std::vector<float> x = read_raw<float>(dir / ("x" + std::to_string(k) + ".bin"));
    std::vector<float> t = read_raw<float>(dir / ("t" + std::to_string(k) + ".bin"));
    std::map<std::string, Tensor> feeds{{"X", Tensor::view(DType::Float32, {8, 3}, x.data())},
                                        {"Target", Tensor::view(DType::Float32, {8, 2}, t.data())}};
    std::vector<Tensor> out = r.step(feeds);
    EXPECT_NEAR(*out.at(0).ptr<float>(), loss[k], 1e-5 * std::abs(loss[k])) << "step " << k;
  }
  EXPECT_EQ(*r.value("T").ptr<int64_t>(), static_cast<int64_t>(loss.size()));
  for (const char* w : {"W", "B"}) {
    const std::vector<double> want = read_raw<double>(dir / (std::string(w) + ".bin"));
    Tensor got = r.value(w);
    ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size())) << w;
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got.ptr<float>()[i], want[i], 1e-5 + 1e-4 * std::abs(want[i])) << w << "[" << i << "]";
  }
  // The trained values travel back into a model: main-graph weights and algorithm state alike.
  const Model trained = r.model();
  EXPECT_EQ(trained.training_info[0].algorithm.initializers.at("T").as<int64_t>()[0], static_cast<int64_t>(loss.size()));
  EXPECT_EQ(trained.graph.initializers.at("W").as<float>()[0], r.value("W").ptr<float>()[0]);
}

TEST(TrainingInfoRunner, ExecutesOnnxSpecModelWithGradientAndAdam) { check_training_info("adam"); }
TEST(TrainingInfoRunner, ExecutesOnnxSpecModelWithGradientAndMomentum) { check_training_info("momentum"); }

// The external-data path (taken by itself above 2 GB) forced on a small checkpoint: weights and state leave the
// protobuf, the checkpoint still resumes byte for byte, and re-saving replaces the data file.
TEST(Checkpoint, ExternalDataRoundTrips) {
  auto dir = test::temp_dir("ckpt_external");
  TrainingConfig cfg;
  cfg.optimizer.kind = "adam";
  TrainingSession s = TrainingSession::from_file(make_mlp(dir, "8 64 32 1"), cfg);
  run_steps(s, 0, 2);
  const fs::path ck = dir / "ck.onnx";
  s.save_checkpoint(dir / "inline.onnx");
  const size_t inline_size = fs::file_size(dir / "inline.onnx");
  save_model_large(s.checkpoint(), ck, SaveOptions{.force_external_data = true, .external_min_bytes = 64});
  auto data_files = [&] {
    std::vector<fs::path> v;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".data" && e.path().filename().string().rfind("ck.onnx.", 0) == 0) v.push_back(e.path());
    return v;
  };
  ASSERT_EQ(data_files().size(), 1u);
  const size_t weights_bytes = (8 * 64 + 64 + 64 * 32 + 32 + 32 + 1) * 4;
  EXPECT_GT(fs::file_size(data_files()[0]), 3 * weights_bytes - 4096);  // weights and both moments
  EXPECT_LT(fs::file_size(ck) + 3 * weights_bytes - 4096, inline_size);
  TrainingSession r = TrainingSession::from_checkpoint(ck);
  expect_identical(s, r);
  run_steps(s, 2, 3);
  run_steps(r, 2, 3);
  expect_identical(s, r);
  const fs::path old = data_files()[0];
  save_model_large(r.checkpoint(), ck, SaveOptions{.force_external_data = true});
  ASSERT_EQ(data_files().size(), 1u);
  EXPECT_NE(data_files()[0], old);
  expect_identical(s, TrainingSession::from_checkpoint(ck));
  // Back under the limit with no forcing: one self-contained file, no data file left behind.
  r.save_checkpoint(ck);
  EXPECT_TRUE(data_files().empty());
  expect_identical(s, TrainingSession::from_checkpoint(ck));
}

TEST(TrainingInfoRunner, RunsOurOwnCheckpointLikeTheSession) {
  // Our checkpoint's algorithm, executed by the generic runner, takes the same step as the session.
  auto dir = test::temp_dir("training_info_ours");
  TrainingConfig cfg;
  cfg.optimizer.kind = "sgd";
  cfg.optimizer.momentum = 0.9;
  TrainingSession s = TrainingSession::from_file(make_mlp(dir, "8 16 1"), cfg);
  run_steps(s, 0, 2);
  TrainingInfoRunner r(s.checkpoint());
  std::vector<std::vector<float>> keep;
  Feeds f = batch(s, 2, 16, 8, keep);
  r.step(f);
  s.train_step(f);
  for (const std::string& w : s.trainable()) EXPECT_TRUE(same_bytes(r.value(w), s.get_weight(w))) << w;
  for (const std::string& n : s.state_names()) EXPECT_TRUE(same_bytes(r.value(n), s.state(n))) << n;
}

}  // namespace
}  // namespace onnxtrain
