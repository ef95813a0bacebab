#pragma once
// Running what cli/setup.h built, for `onnxtrain train` and `resume`: the Trainer loop, then its report.
#include <optional>
#include <string>

#include "cli/config.h"
#include "cli/setup.h"
#include "training/trainer.h"

namespace onnxtrain::cli {

// Metadata keys under which a checkpoint carries the run's config, so `onnxtrain resume` needs only the file.
inline constexpr const char* kConfigKey = "onnxtrain.cli.config";
inline constexpr const char* kConfigPathKey = "onnxtrain.cli.config_path";

// The checkpoint a resumed run's sessions were restored from: the loop continues at its epoch, batch and
// callbacks' state.
struct Resume {
  const Model& checkpoint;
  const std::string& source;
};

// Trains until the config's epochs or steps are done, early stopping ends the run, or Ctrl-C stops it at a step
// boundary (a checkpoint is saved either way); prints the banner first and writes OUTPUT/model.onnx last.
TrainResult run(const RunConfig& cfg, Session& session, const RunData& data,
                std::optional<Resume> resume = std::nullopt);

// Prints what the run did and where its files are; returns the exit code (0, 130 interrupted, 1 when it stopped
// on too many skipped steps or diverged).
int report(const RunConfig& cfg, Session& session, const TrainResult& result);

}  // namespace onnxtrain::cli
