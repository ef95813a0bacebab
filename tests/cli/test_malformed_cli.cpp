// Malformed input through the onnxtrain binary (issue 12, docs/reliability.md): an empty dataset, and configs whose
// numbers are out of range. Each must end the process with an exit code and a message that names the config
// file and line, the key or the data file, and what was expected; never a crash or a hang.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdint>
#include <fstream>
#include <sstream>

#include "cli/config.h"
#include "common/test_env.h"
#include "graph/error.h"

namespace onnxtrain {
namespace {

namespace fs = std::filesystem;

struct Outcome {
  int code = -1;  // the exit code; -1 when the process died of a signal
  std::string text;
};

// Runs the binary with stdout and stderr captured in a file.
Outcome onnxtrain(const std::string& args, const fs::path& dir) {
  const fs::path log = dir / "cli.log";
  const int status = std::system((std::string(ONNXTRAIN_CLI) + " " + args + " > " + log.string() + " 2>&1").c_str());
  std::ifstream f(log);
  std::stringstream s;
  s << f.rdbuf();
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, s.str()};
}

std::string read_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// A float32 .npy file of the given shape filled with 0.5.
void write_npy(const fs::path& path, const std::vector<int64_t>& shape) {
  std::string dims;
  int64_t n = 1;
  for (int64_t d : shape) dims += std::to_string(d) + ",", n *= d;
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
  header.append(63 - (10 + header.size()) % 64, ' ');
  header += '\n';
  std::ofstream f(path, std::ios::binary);
  const uint16_t len = static_cast<uint16_t>(header.size());
  f.write("\x93NUMPY\x01\x00", 8);
  f.write(reinterpret_cast<const char*>(&len), 2);
  f << header;
  const float v = 0.5f;
  for (int64_t i = 0; i < n; ++i) f.write(reinterpret_cast<const char*>(&v), sizeof v);
}

// A folder with a 3-4-1 MLP (input x [batch, 3], output y [batch, 1]) and a config training it on `data`.
class MalformedCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::temp_dir(std::string("cli_malformed_") + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    test::make_mlp(dir_, "3 4 1");
  }
  fs::path config(const std::string& data, const std::string& extra = "") {
    const fs::path p = dir_ / "run.yaml";
    std::ofstream(p) << "model: mlp.onnx\noutput: out\nlog: {progress: none}\n" << data << extra;
    return p;
  }
  void csv(const std::string& name, const std::string& text) { std::ofstream(dir_ / name) << text; }
  fs::path dir_;
};

const char* const kCsvData = "data:\n  train: train.csv\n  inputs: {x: [a, b, c]}\n  target: t\n";
const char* const kRows = "a,b,c,t\n1,2,3,0.5\n4,5,6,1.5\n7,8,9,2.5\n";

TEST_F(MalformedCli, EmptyDatasetsAreNamedNeverTrained) {
  csv("train.csv", kRows);
  ASSERT_EQ(onnxtrain("train " + config(kCsvData).string(), dir_).code, 0);  // the setup itself trains

  struct Case {
    const char* what;
    std::function<void()> make;
    std::string extra;
    std::vector<std::string> expect;  // substrings of the message
  };
  const std::vector<Case> cases = {
      {"a CSV file with a header and no rows", [&] { csv("train.csv", "a,b,c,t\n"); }, "",
       {"run.yaml:5: data.train", "train.csv", "no rows"}},
      {"an empty CSV file", [&] { csv("train.csv", ""); }, "", {"run.yaml:5: data.train", "train.csv", "the file is empty"}},
      {"a .npy array with zero rows", [&] {
         write_npy(dir_ / "x.npy", {0, 3});
         write_npy(dir_ / "t.npy", {0, 1});
       },
       "", {"run.yaml:5: data.train", "no rows"}},
      {"an empty validation file", [&] {
         csv("train.csv", kRows);
         csv("val.csv", "a,b,c,t\n");
       },
       "  validation: val.csv\n", {"run.yaml:", "data.validation", "val.csv", "no rows"}},
      {"fewer rows than one batch with drop_last", [&] { csv("train.csv", kRows); },
       "  drop_last: true\ntrain: {batch_size: 8}\n", {"3 samples make no full batch of 8"}},
  };
  for (const Case& c : cases) {
    c.make();
    std::string data = kCsvData;
    if (std::string(c.what).find(".npy") != std::string::npos) data = "data:\n  train: [x.npy, t.npy]\n  target: t\n";
    const Outcome r = onnxtrain("train " + config(data, c.extra).string(), dir_);
    EXPECT_EQ(r.code, 1) << c.what << ":\n" << r.text;
    for (const std::string& e : c.expect) EXPECT_NE(r.text.find(e), std::string::npos) << c.what << ": no '" << e << "' in\n" << r.text;
    EXPECT_EQ(r.text.find("stopped:"), std::string::npos) << c.what << " trained:\n" << r.text;
  }
}

TEST_F(MalformedCli, OutOfRangeNumbersNameTheLineKeyAndRange) {
  csv("train.csv", kRows);
  struct Case {
    std::string yaml;  // appended to the config; the bad key is on line 8 unless it is a --set
    std::string expect;
    int code = 2;  // config errors exit 2; those the library finds while building the session exit 1
  };
  const std::vector<Case> cases = {
      {"optimizer: {learning_rate: -0.1}\n", "run.yaml:8: optimizer.learning_rate: expected a number > 0, got '-0.1'"},
      {"optimizer: {learning_rate: 0}\n", "run.yaml:8: optimizer.learning_rate: expected a number > 0, got '0'"},
      {"optimizer: {learning_rate: .inf}\n", "run.yaml:8: optimizer.learning_rate: expected a number > 0, got '.inf'"},
      {"optimizer: {learning_rate: .nan}\n", "run.yaml:8: optimizer.learning_rate: expected a number > 0, got '.nan'"},
      {"train: {batch_size: 0}\n", "run.yaml:8: train.batch_size: expected an integer >= 1, got '0'"},
      {"train: {batch_size: 99999999999999999999}\n",
       "run.yaml:8: train.batch_size: expected an integer >= 1, got '99999999999999999999'"},
      {"train: {epochs: -1}\n", "run.yaml:8: train.epochs: expected an integer >= 1, got '-1'"},
      {"train: {max_steps: -5}\n", "run.yaml:8: train.max_steps: expected an integer >= 0, got '-5'"},
      {"optimizer: {kind: sgd, momentum: 1.5}\n", "run.yaml:8: optimizer.momentum: expected a number >= 0 and <= 1, got '1.5'"},
      {"optimizer: {weight_decay: -0.01}\n", "run.yaml:8: optimizer.weight_decay: expected a number >= 0, got '-0.01'"},
      {"optimizer: {gradient_accumulation: 0}\n",
       "run.yaml:8: optimizer.gradient_accumulation: expected an integer >= 1 and <= 1048576, got '0'"},
      {"loss: {label_smoothing: 1.5}\n", "run.yaml:8: loss.label_smoothing: expected a number >= 0 and <= 1, got '1.5'"},
      {"loss: {class_weights: [1, .nan]}\n", "run.yaml:8: loss.class_weights: expected a list of finite numbers, got a list"},
      {"threads: -2\n", "run.yaml:8: threads: expected an integer >= 0 and <= 4096, got '-2'"},
      {"checkpoint: {keep_last: -1}\n", "run.yaml:8: checkpoint.keep_last: expected an integer >= 0 and <= 1048576, got '-1'"},
      {"schedule: {kind: step, gamma: 0}\n", "run.yaml:8: schedule.gamma: expected a number > 0, got '0'"},
      // In range for the parser, out of range for the optimizer it configures: found while building the session,
      // still located in the config.
      {"optimizer: {kind: adam, beta1: 1}\n", "run.yaml:8: optimizer.beta1: expected a number in [0, 1)", 1},
      {"schedule: {kind: step}\n", "run.yaml:8: schedule.step_size", 1},
  };
  for (const Case& c : cases) {
    const Outcome r = onnxtrain("train " + config(kCsvData, c.yaml).string(), dir_);
    EXPECT_EQ(r.code, c.code) << c.yaml << r.text;
    EXPECT_NE(r.text.find(c.expect), std::string::npos) << c.yaml << "expected '" << c.expect << "' in:\n" << r.text;
  }
  const Outcome set = onnxtrain("train " + config(kCsvData).string() + " --set train.epochs=-3", dir_);
  EXPECT_EQ(set.code, 2);
  EXPECT_NE(set.text.find("--set train.epochs: train.epochs: expected an integer >= 1, got '-3'"), std::string::npos) << set.text;
}

// The numerical guard as the CLI reports it with policy "raise" (the default): a diverging run stops on the
// step whose loss went non-finite, names it and the tensor, and exits 1.
TEST_F(MalformedCli, NonFiniteLossNamesTheStepAndTensor) {
  csv("train.csv", kRows);
  const Outcome r = onnxtrain("train " + config(kCsvData, "optimizer: {learning_rate: 1e30}\ntrain: {batch_size: 1, epochs: 5}\n").string(), dir_);
  EXPECT_EQ(r.code, 1) << r.text;
  EXPECT_NE(r.text.find("onnxtrain train: training step "), std::string::npos) << r.text;
  EXPECT_NE(r.text.find("went non-finite, so the step's update was not applied [value '"), std::string::npos) << r.text;
  EXPECT_EQ(r.text.find("stopped:"), std::string::npos) << r.text;
}

// Policy "skip": one warning line per skipped step naming it and the tensor, the count in the summary, and the
// trained model is the one a run without that row produces (batch 1, in file order).
TEST_F(MalformedCli, SkipPolicyWarnsNamesTheStepAndTrainsAsWithoutTheRow) {
  const std::string skip = "  shuffle: false\ntrain: {batch_size: 1, epochs: 1, on_non_finite: skip}\n";
  csv("train.csv", "a,b,c,t\n1,2,3,0.5\n4,5,6,1.5\n7,8,9,2.5\n2,inf,1,0.5\n3,1,2,1\n0,1,0,0.1\n");
  const Outcome r = onnxtrain("train " + config(kCsvData, skip).string(), dir_);
  ASSERT_EQ(r.code, 0) << r.text;
  EXPECT_NE(r.text.find("onnxtrain: warning: skipped step #1 (epoch 1, batch 4/6): training step 4 (optimizer step 4): "
                        "the loss went non-finite, so the step's update was not applied [value 'loss'"),
            std::string::npos)
      << r.text;
  EXPECT_NE(r.text.find("stopped: finished after 5 steps"), std::string::npos) << r.text;
  EXPECT_NE(r.text.find("skipped steps: 1 "), std::string::npos) << r.text;
  const std::string skipped_model = read_text(dir_ / "out/model.onnx");

  csv("train.csv", "a,b,c,t\n1,2,3,0.5\n4,5,6,1.5\n7,8,9,2.5\n3,1,2,1\n0,1,0,0.1\n");
  const Outcome ref = onnxtrain("train " + config(kCsvData, skip).string(), dir_);
  ASSERT_EQ(ref.code, 0) << ref.text;
  EXPECT_NE(ref.text.find("skipped steps: 0 "), std::string::npos) << ref.text;
  EXPECT_EQ(ref.text.find("warning"), std::string::npos) << ref.text;
  EXPECT_FALSE(skipped_model.empty());
  EXPECT_TRUE(read_text(dir_ / "out/model.onnx") == skipped_model) << "the skipped row changed the trained weights";
}

// A run that skips every step: the first 10 warnings, then every 100th (said once), the full count in the
// summary; with train.max_skipped_steps the run fails instead, naming the key, its line and the latest step.
TEST_F(MalformedCli, SkipWarningsAreRateLimitedAndMaxSkippedStepsFails) {
  std::string rows = "a,b,c,t\n";
  for (int i = 0; i < 250; ++i) rows += "nan,1,2,0.5\n";
  csv("train.csv", rows);
  const std::string skip = "train: {batch_size: 1, epochs: 1, on_non_finite: skip}\n";
  const Outcome r = onnxtrain("train " + config(kCsvData, skip).string(), dir_);
  ASSERT_EQ(r.code, 0) << r.text;
  size_t warnings = 0;
  for (size_t at = r.text.find("warning: skipped step #"); at != std::string::npos; at = r.text.find("warning: skipped step #", at + 1))
    ++warnings;
  EXPECT_EQ(warnings, 12u) << r.text;  // #1 to #10, #100, #200
  for (const char* n : {"#10 (", "#100 (", "#200 ("})
    EXPECT_NE(r.text.find(std::string("skipped step ") + n), std::string::npos) << n << "\n" << r.text;
  EXPECT_EQ(r.text.find("skipped step #11 ("), std::string::npos) << r.text;
  EXPECT_NE(r.text.find("from now on only every 100th skipped step is reported"), std::string::npos) << r.text;
  EXPECT_NE(r.text.find("skipped steps: 250 "), std::string::npos) << r.text;
  EXPECT_NE(r.text.find("stopped: finished after 0 steps"), std::string::npos) << r.text;

  const Outcome limited =
      onnxtrain("train " + config(kCsvData, "train: {batch_size: 1, on_non_finite: skip,\n        max_skipped_steps: 20}\n").string(), dir_);
  EXPECT_EQ(limited.code, 1) << limited.text;
  EXPECT_NE(limited.text.find("run.yaml:9: train.max_skipped_steps: 21 steps were skipped, more than the limit of 20, so "
                              "the run stopped; the latest: training step 21 (optimizer step 1)"),
            std::string::npos)
      << limited.text;
  EXPECT_NE(limited.text.find("stopped: max_skipped_steps"), std::string::npos) << limited.text;
}

// YAML that is valid but not shaped like a config (found by fuzz/fuzz_config.cpp): mapping keys that are lists or
// mappings. They are config errors with the line, not a yaml-cpp exception.
TEST(ConfigShape, NonScalarKeysAreConfigErrors) {
  const std::string base = "model: m.onnx\ndata:\n  train: t.npz\n";
  EXPECT_EQ(test::error_of([&] { cli::parse_config(base + "? [a, b]\n: c\n", "run.yaml"); }),
            "run.yaml:4: expected a key name, got a list");
  EXPECT_EQ(test::error_of([&] { cli::parse_config(base + "  inputs: {? {k: v} : x}\n", "run.yaml"); }),
            "run.yaml:4: data.inputs: expected a key name, got a mapping");
  EXPECT_EQ(test::error_of([&] { cli::parse_config(base + "optimizer:\n  groups:\n    - {[x]: 1}\n", "run.yaml"); }),
            "run.yaml:5: optimizer.groups[0]: expected a key name, got a list");
}

}  // namespace
}  // namespace onnxtrain
