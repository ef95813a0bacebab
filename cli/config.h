#pragma once
// The YAML run configuration of `onnxtrain train/eval/resume`. One table of keys drives parsing, validation,
// error messages (file:line, expected, valid choices, "did you mean") and the reference config that
// `onnxtrain config` prints and docs/cli.md embeds: the TrainingConfig options come from the schema
// (training/config_schema.h), the run's own keys (model, data.*, train.epochs, log.*, ...) from config.cpp.
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "executor/device.h"
#include "training/session.h"

namespace onnxtrain::cli {

struct DataConfig {
  std::vector<std::string> train;       // files; their arrays are merged (a .npy is named by its stem)
  std::vector<std::string> validation;  // same; empty = use validation_split (or no validation)
  double validation_split = 0;          // fraction of the training rows held out (seeded shuffle)
  std::map<std::string, std::vector<std::string>> inputs;  // model input -> arrays/columns (concatenated)
  std::vector<std::string> target = {"y"};
  bool shuffle = true;
  uint64_t seed = 0;
  bool drop_last = false;
  std::string csv_delimiter = ",";
  bool csv_header = true;
};

struct RunConfig {
  std::filesystem::path source;  // the config file (relative paths are resolved against its folder)
  std::string text;              // the YAML after --set overrides, as stored in checkpoints
  std::string model;
  std::string output;
  std::string device = default_device_name();  // $ONNXTRAIN_DEVICE, else "cpu"
  int64_t threads = 0;
  int64_t replicas = 1;  // one-thread replicas that split each batch (training/replicas.h); 1 = one session
  std::vector<std::string> trainable, frozen;
  TrainingConfig training;  // loss, penalty, optimizer, schedule, device, prediction
  DataConfig data;
  int64_t epochs = 1, max_steps = 0, batch_size = 32, eval_batch_size = 0;
  int64_t max_skipped_steps = 0;  // with on_non_finite skip: more skipped steps than this end the run (0 = no limit)
  std::vector<std::string> metrics = {"loss"};
  std::string early_metric = "val_loss", early_mode = "auto";
  int64_t patience = 0;
  double min_delta = 0;
  int64_t checkpoint_every = 0, keep_last = 3;
  std::string log_file = "metrics.csv", log_format = "auto", progress = "auto";
  int64_t log_every = 1;

  // A path from the config, resolved against the config file's folder.
  std::filesystem::path resolve(const std::string& p) const;
  std::filesystem::path output_dir() const { return resolve(output); }
  // Where a key was set ("config.yaml:12" or "--set optimizer.kind"), for errors found after parsing.
  std::map<std::string, std::string> locations;
  // Prefixes an error message that starts with a config key ("optimizer.learning_rate: ...") with its location.
  std::string locate(const std::string& message) const;
};

// Parses YAML text (with "key.path=value" overrides) into a RunConfig. `source` names the file in errors and
// anchors relative paths. Throws Error: "<file>:<line>: <key>: expected ..., got ...".
RunConfig parse_config(const std::string& text, const std::filesystem::path& source,
                       const std::vector<std::string>& overrides = {});
RunConfig load_config(const std::filesystem::path& path, const std::vector<std::string>& overrides = {});

// The reference config: every key with its default and a comment.
std::string reference_config();

// The closest candidate within a small edit distance, or "".
std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace onnxtrain::cli
