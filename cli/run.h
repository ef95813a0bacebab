#pragma once
// What train, resume and eval share: turning a RunConfig into a session, data loaders and a Trainer.
#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/config.h"
#include "training/trainer.h"

namespace onnxtrain::cli {

// Metadata keys under which a checkpoint carries the run's config, so `onnxtrain resume` needs only the file.
inline constexpr const char* kConfigKey = "onnxtrain.cli.config";
inline constexpr const char* kConfigPathKey = "onnxtrain.cli.config_path";

// The float initializers matched by `trainable` (all when empty) minus those matched by `frozen`. A pattern
// that matches nothing is an error naming the key and its line.
std::vector<std::string> select_trainable(const Model& model, const RunConfig& cfg);

// The files of a data key, read and merged into one Dataset.
Dataset read_sources(const RunConfig& cfg, const std::vector<std::string>& files, const std::string& key);

// Raw data of a run: training rows and validation rows (a separate file or a seeded split).
struct RunData {
  Dataset train, validation;
  int64_t train_rows = 0;
};
RunData load_run_data(const RunConfig& cfg);

// Feeds for the session (model inputs converted to their dtype and per-sample shape, the target to the loss's).
std::map<std::string, Tensor> make_feeds(const RunConfig& cfg, const TrainingSession& s, const Dataset& data,
                                         const std::string& what);

// Optimizer steps the run plans: max_steps, or epochs * batches / gradient_accumulation, where a batch is
// batch_size rows on each of world_size data-parallel ranks.
int64_t planned_steps(const RunConfig& cfg, int64_t train_rows, int world_size = 1);

// Applies `threads` (OpenMP) and returns a message describing the setting.
void apply_threads(const RunConfig& cfg);

// Runs the training loop of `onnxtrain train` / `resume`: callbacks from the config, SIGINT handling, the final
// export and summary. `restore_from` continues a checkpoint. Returns the exit code (0, or 130 if interrupted).
// `replicas`: when set, `session` is its replica 0 and the steps go through it.
int run_training(const RunConfig& cfg, TrainingSession& session, const RunData& data,
                 const Model* restore_from, const std::string& restore_source, ReplicatedSession* replicas = nullptr);

}  // namespace onnxtrain::cli
