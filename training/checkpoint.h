#pragma once
// Trainable checkpoints: one standard ONNX ModelProto holding the inference model with its current weights, a
// TrainingInfoProto with one full training step and the optimizer state, and the session's configuration in
// metadata_props. The format and every metadata key: docs/checkpoint.md. TrainingSession::save_checkpoint,
// TrainingSession::from_checkpoint and TrainingSession::checkpoint are the entry points; this header exposes
// the configuration <-> metadata mapping they use. Running any TrainingInfoProto: training/training_info_runner.h.
#include <string>
#include <utility>
#include <vector>

#include "training/external_data.h"  // save_model_large, SaveOptions
#include "training/session.h"

namespace onnxtrain {

// Bumped when a checkpoint written by this version cannot be read by an older one.
inline constexpr const char* kCheckpointFormat = "1";
// Every metadata key we write starts with this; keys with this prefix are ours and are stripped on load.
inline constexpr const char* kCheckpointKeyPrefix = "onnxtrain.";

using Metadata = std::vector<std::pair<std::string, std::string>>;

// The checkpoint's initialization graph: an output "init/<state>" per optimizer state holding the value a new
// session starts from (ConstantOfShape for filled tensors), read from the training graph's initializers.
Graph initialization_graph(const Graph& training_graph, const std::vector<std::string>& state_names);

// The configuration as "onnxtrain.<section>.<field>" entries (numbers round-trip exactly).
Metadata config_to_metadata(const TrainingConfig& config);
// The inverse. Keys that are absent keep their defaults (so older checkpoints load); a malformed value is an
// Error naming `source` and the key.
TrainingConfig config_from_metadata(const Metadata& metadata, const std::string& source);

}  // namespace onnxtrain
