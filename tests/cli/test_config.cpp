// Config parsing: values land in the right fields, and every kind of mistake gets a message that names the
// file, line and key, says what was expected and suggests the likely intended key or value.
#include <gtest/gtest.h>

#include "cli/config.h"
#include "common/test_env.h"
#include "executor/device.h"
#include "graph/error.h"

namespace onnxtrain::cli {
namespace {

const std::string kBase = "model: m.onnx\ndata:\n  train: t.npz\n";

std::string error_of(const std::string& text, const std::vector<std::string>& sets = {}) {
  return test::error_of([&] { parse_config(text, "dir/run.yaml", sets); });
}

TEST(Config, ValuesAndDefaults) {
  RunConfig c = parse_config(kBase +
                                 "trainable: [\"head.*\"]\n"
                                 "optimizer:\n  kind: adamw\n  learning_rate: 3e-4\n  weight_decay: null\n"
                                 "  groups:\n    - {match: [\"head.bias\"], learning_rate: 0.1}\n"
                                 "loss: {kind: cross_entropy, label_smoothing: 0.1, ignore_index: null}\n"
                                 "data:\n  train: [a.npy, b.npy]\n  inputs: {x: [c1, c2]}\n  target: label\n"
                                 "train: {epochs: 3, metrics: [loss, accuracy]}\n",
                             "dir/run.yaml", {"train.batch_size=7", "schedule.kind=cosine"});
  EXPECT_EQ(c.model, "m.onnx");
  EXPECT_EQ(c.trainable, (std::vector<std::string>{"head.*"}));
  EXPECT_EQ(c.training.optimizer.kind, "adamw");
  EXPECT_DOUBLE_EQ(c.training.optimizer.learning_rate, 3e-4);
  EXPECT_FALSE(c.training.optimizer.weight_decay.has_value());
  ASSERT_EQ(c.training.optimizer.groups.size(), 1u);
  EXPECT_DOUBLE_EQ(*c.training.optimizer.groups[0].learning_rate, 0.1);
  EXPECT_EQ(c.training.loss.kind, "cross_entropy");
  EXPECT_FALSE(c.training.loss.ignore_index.has_value());
  EXPECT_EQ(c.data.train, (std::vector<std::string>{"a.npy", "b.npy"}));
  EXPECT_EQ(c.data.inputs.at("x"), (std::vector<std::string>{"c1", "c2"}));
  EXPECT_EQ(c.epochs, 3);
  EXPECT_EQ(c.batch_size, 7);
  EXPECT_EQ(c.training.schedule.kind, "cosine");
  EXPECT_EQ(c.metrics, (std::vector<std::string>{"loss", "accuracy"}));
  EXPECT_EQ(c.output, "runs/run");  // default: runs/<config stem>
  EXPECT_EQ(c.resolve("t.npz"), std::filesystem::path("dir/t.npz"));
  EXPECT_EQ(c.resolve("/abs/t.npz"), std::filesystem::path("/abs/t.npz"));
  // The stored text reproduces the overrides.
  RunConfig again = parse_config(c.text, "dir/run.yaml");
  EXPECT_EQ(again.batch_size, 7);
  EXPECT_EQ(again.training.schedule.kind, "cosine");
}

TEST(Config, ErrorsNameLineKeyExpectationAndChoices) {
  EXPECT_EQ(error_of(kBase + "optimizer:\n  learning_rate: -1\n"),
            "dir/run.yaml:5: optimizer.learning_rate: expected a number > 0, got '-1'");
  EXPECT_EQ(error_of(kBase + "train:\n  epochs: 2.5\n"), "dir/run.yaml:5: train.epochs: expected an integer >= 1, got '2.5'");
  EXPECT_EQ(error_of(kBase + "loss:\n  label_smoothing: 2\n"),
            "dir/run.yaml:5: loss.label_smoothing: expected a number >= 0 and <= 1, got '2'");
  EXPECT_EQ(error_of(kBase + "data:\n  shuffle: maybe\n"), "dir/run.yaml:5: data.shuffle: expected true or false, got 'maybe'");
  const std::string kind = error_of(kBase + "loss:\n  kind: cross_entropi\n");
  EXPECT_NE(kind.find("dir/run.yaml:5: loss.kind: expected one of: "), std::string::npos) << kind;
  EXPECT_NE(kind.find("cross_entropy"), std::string::npos) << kind;
  EXPECT_NE(kind.find("(did you mean 'cross_entropy'?)"), std::string::npos) << kind;
  EXPECT_EQ(error_of(kBase + "device: gpu\n"),
            "dir/run.yaml:4: device 'gpu': expected \"cpu\", \"cuda\", \"cuda:N\" (N a device index >= 0) or \"guarded\" (the test device)");
  EXPECT_EQ(error_of(kBase + "device: [cuda]\n"), "dir/run.yaml:4: device: expected a string, got a list");
}

// The adapter keys reach TrainingConfig::adapter (docs/lora.md); off by default; a target may be one glob.
TEST(Config, AdapterKeys) {
  RunConfig d = parse_config(kBase, "dir/run.yaml");
  EXPECT_EQ(d.training.adapter.kind, "none");
  RunConfig c = parse_config(kBase + "adapter:\n  kind: lora\n  rank: 4\n  alpha: 8\n  target: [\"*query*\", w]\n",
                             "dir/run.yaml", {"adapter.seed=5"});
  EXPECT_EQ(c.training.adapter.kind, "lora");
  EXPECT_EQ(c.training.adapter.rank, 4);
  EXPECT_DOUBLE_EQ(c.training.adapter.alpha, 8);
  EXPECT_EQ(c.training.adapter.target, (std::vector<std::string>{"*query*", "w"}));
  EXPECT_EQ(c.training.adapter.seed, 5);
  EXPECT_EQ(parse_config(kBase + "adapter: {kind: lora, target: all-linear}\n", "r.yaml").training.adapter.target,
            std::vector<std::string>{"all-linear"});
  const std::string kind = error_of(kBase + "adapter:\n  kind: lorra\n");
  EXPECT_NE(kind.find("dir/run.yaml:5: adapter.kind: expected one of: none, lora; got 'lorra' (did you mean 'lora'?)"),
            std::string::npos) << kind;
  EXPECT_EQ(error_of(kBase + "adapter:\n  rank: 0\n"), "dir/run.yaml:5: adapter.rank: expected an integer >= 1 and <= 1048576, got '0'");
}

// The distributed keys reach TrainingConfig::parallel (docs/distributed.md): overlap on, 1 MB buckets, no
// compression and a reduction every micro-batch by default; located errors.
TEST(Config, DistributedKeys) {
  RunConfig d = parse_config(kBase, "dir/run.yaml");
  EXPECT_TRUE(d.training.parallel.overlap);
  EXPECT_EQ(d.training.parallel.bucket_bytes, DataParallelSpec::kDefaultBucketBytes);
  EXPECT_EQ(d.training.parallel.compression, "none");
  EXPECT_TRUE(d.training.parallel.reduce_every_micro_batch);
  RunConfig c = parse_config(kBase + "distributed:\n  overlap: false\n  bucket_bytes: 65536\n  compression: bfloat16\n",
                             "dir/run.yaml", {"distributed.reduce_every_micro_batch=false"});
  EXPECT_FALSE(c.training.parallel.overlap);
  EXPECT_EQ(c.training.parallel.bucket_bytes, 65536u);
  EXPECT_EQ(c.training.parallel.compression, "bfloat16");
  EXPECT_FALSE(c.training.parallel.reduce_every_micro_batch);
  const std::string bad = error_of(kBase + "distributed:\n  compression: int8\n");
  EXPECT_NE(bad.find("dir/run.yaml:5: distributed.compression: expected one of: none, bfloat16, float16"),
            std::string::npos) << bad;
  EXPECT_NE(error_of(kBase + "distributed:\n  bucket_bytes: 0\n").find("distributed.bucket_bytes"), std::string::npos);
}

// The numerical-guard keys reach TrainingConfig (docs/reliability.md), defaults "raise" and false.
TEST(Config, NonFinitePolicyKeys) {
  RunConfig d = parse_config(kBase, "dir/run.yaml");
  EXPECT_EQ(d.training.on_non_finite, "raise");
  EXPECT_FALSE(d.training.check_every_value);
  RunConfig c = parse_config(kBase + "train: {on_non_finite: skip, check_every_value: true}\n", "dir/run.yaml");
  EXPECT_EQ(c.training.on_non_finite, "skip");
  EXPECT_TRUE(c.training.check_every_value);
  const std::string bad = error_of(kBase + "train:\n  on_non_finite: ignore\n");
  EXPECT_NE(bad.find("dir/run.yaml:5: train.on_non_finite: expected one of: raise, skip"), std::string::npos) << bad;
  EXPECT_FALSE(d.training.profile);
  EXPECT_TRUE(parse_config(kBase + "train: {profile: true}\n", "dir/run.yaml").training.profile);
  EXPECT_EQ(d.max_skipped_steps, 0);
  EXPECT_EQ(parse_config(kBase + "train: {on_non_finite: skip, max_skipped_steps: 50}\n", "dir/run.yaml").max_skipped_steps, 50);
  const std::string negative = error_of(kBase + "train:\n  max_skipped_steps: -1\n");
  EXPECT_NE(negative.find("dir/run.yaml:5: train.max_skipped_steps: expected an integer >= 0, got '-1'"), std::string::npos)
      << negative;
}

// Regression (fuzz_config): bytes that are not UTF-8 are refused with the line, instead of being accepted once
// and then failing to reproduce from the text a checkpoint stores.
TEST(Config, NonUtf8TextIsRefused) {
  const std::string text = "model: m.on\xff\xffnx\ndata:\n  train: t.npz\n";
  EXPECT_NE(error_of(text).find("dir/run.yaml:1: not valid UTF-8"), std::string::npos) << error_of(text);
  EXPECT_NE(error_of(kBase, {"output=r\xffun"}).find("--set output: not valid UTF-8"), std::string::npos);
  // Valid multi-byte UTF-8 still round-trips.
  RunConfig c = parse_config(kBase + "output: \"runs/caf\xc3\xa9\"\n", "dir/run.yaml");
  EXPECT_EQ(c.output, "runs/caf\xc3\xa9");
  EXPECT_EQ(parse_config(c.text, "dir/run.yaml").text, c.text);
}

// The device key goes through parse_device: "cuda:N" reaches the session's config, and where CUDA cannot be
// used the error names the file, the line, the value and what is missing.
TEST(Config, DeviceIsParsedByParseDevice) {
  EXPECT_EQ(parse_config(kBase + "device: cpu\n", "dir/run.yaml").training.device, "cpu");
  if (cuda_available()) {
    EXPECT_EQ(parse_config(kBase + "device: cuda:0\n", "dir/run.yaml").training.device, "cuda:0");
    GTEST_SKIP() << "a CUDA device is present; the missing-CUDA error cannot be observed here";
  }
  EXPECT_EQ(error_of(kBase + "device: cuda:0\n"),
            "dir/run.yaml:4: device 'cuda:0' requested, but " + cuda_unavailable_reason());
  EXPECT_EQ(error_of(kBase, {"device=cuda:1"}), "--set device: device 'cuda:1' requested, but " + cuda_unavailable_reason());
}

TEST(Config, UnknownKeysSuggestTheIntendedOne) {
  const std::string typo = error_of(kBase + "optimizer:\n  kind: sgd\n  learnig_rate: 0.1\n");
  EXPECT_NE(typo.find("dir/run.yaml:6: unknown key 'optimizer.learnig_rate' (did you mean 'optimizer.learning_rate'?)"),
            std::string::npos) << typo;
  EXPECT_NE(typo.find("valid keys under 'optimizer': kind, learning_rate,"), std::string::npos) << typo;
  // A key in the wrong section.
  const std::string misplaced = error_of(kBase + "epochs: 3\n");
  EXPECT_NE(misplaced.find("dir/run.yaml:4: unknown key 'epochs' (did you mean 'train.epochs'?)"), std::string::npos) << misplaced;
  const std::string section = error_of(kBase + "optimiser:\n  kind: sgd\n");
  EXPECT_NE(section.find("unknown key 'optimiser' (did you mean 'optimizer'?)"), std::string::npos) << section;
  const std::string group = error_of(kBase + "optimizer:\n  groups:\n    - {match: [a], lr: 0.1}\n");
  EXPECT_NE(group.find("optimizer.groups[0]: unknown key 'lr'; valid keys: match, learning_rate, weight_decay"),
            std::string::npos) << group;
  EXPECT_EQ(error_of(kBase + "optimizer: 3\n"), "dir/run.yaml:4: optimizer: expected a mapping of: kind, learning_rate, "
                                                 "weight_decay, momentum, dampening, nesterov, convention, beta, beta1, beta2, "
                                                 "amsgrad, eps, lr_decay, initial_accumulator_value, max_grad_norm, "
                                                 "gradient_accumulation, groups");
}

TEST(Config, OverridesAndMissingKeys) {
  EXPECT_EQ(error_of(kBase, {"train.epochs=0"}), "--set train.epochs: train.epochs: expected an integer >= 1, got '0'");
  const std::string unknown = error_of(kBase, {"train.epoch=3"});
  EXPECT_NE(unknown.find("--set train.epoch: unknown key 'train.epoch' (did you mean 'train.epochs'?)"), std::string::npos) << unknown;
  EXPECT_EQ(error_of(kBase, {"train.epochs"}), "--set train.epochs: expected key=value, e.g. --set optimizer.learning_rate=0.1");
  EXPECT_EQ(error_of("data:\n  train: t.npz\n"), "dir/run.yaml: model: required key missing (the ONNX model to train)");
  EXPECT_EQ(error_of("model: m.onnx\n"), "dir/run.yaml: data.train: required key missing (the training data file)");
  EXPECT_EQ(error_of("model: [unclosed\n"), "dir/run.yaml:2: not valid YAML: end of sequence flow not found");
  const std::string es = error_of(kBase + "early_stopping:\n  patience: 2\n  metric: val_acuracy\n");
  EXPECT_NE(es.find("dir/run.yaml:6: early_stopping.metric: expected one of: train_loss, val_loss"), std::string::npos) << es;
  // Errors found later by the library are located by their key.
  RunConfig c = parse_config(kBase + "schedule:\n  kind: step\n", "dir/run.yaml");
  EXPECT_EQ(c.locate("schedule.step_size: expected >= 1"), "dir/run.yaml:5: schedule.step_size: expected >= 1");
  EXPECT_EQ(c.locate("model 'x': bad"), "model 'x': bad");
}

TEST(Config, DidYouMean) {
  EXPECT_EQ(did_you_mean("learnig_rate", {"kind", "learning_rate"}), "learning_rate");
  EXPECT_EQ(did_you_mean("zzz", {"kind", "learning_rate"}), "");
}

}  // namespace
}  // namespace onnxtrain::cli
