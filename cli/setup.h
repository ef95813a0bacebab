#pragma once
// Setting a run up, for train, resume and eval: the config's data, and the session that trains on it.
// cli/run.h runs what this builds.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cli/config.h"
#include "distributed/communicator.h"
#include "training/data.h"
#include "training/session.h"
#include "training/session_interface.h"

namespace onnxtrain::cli {

// "<file>:<line>: <key>" for the key, or for the nearest enclosing key that was set ("data.inputs" for
// "data.inputs.x"): errors found after parsing still point at the line to fix.
std::string where_of(const RunConfig& cfg, const std::string& key);

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
std::map<std::string, Tensor> make_feeds(const RunConfig& cfg, const Session& s, const Dataset& data,
                                         const std::string& what);

// Optimizer steps the run plans: max_steps, or epochs * batches / gradient_accumulation, where a batch is
// batch_size rows on each of world_size data-parallel ranks.
int64_t planned_steps(const RunConfig& cfg, int64_t train_rows, int world_size = 1);

// The ranks of `mpirun -np N onnxtrain train|resume`, or this process alone; made on first use, so commands
// that do not train never initialize MPI.
const std::shared_ptr<Communicator>& world();
// The same once made, else null: reporting an error must not be what starts MPI.
Communicator* world_if_made();

// A model's metadata value for `key` (checkpoints carry the run's config and format there), or null.
const std::string* metadata_value(const Model& m, const std::string& key);

// What a run trains is one Session: a TrainingSession (alone, or one MPI rank of a job), or with `replicas:`
// one-thread copies of it in this process that split every batch (a ReplicatedSession). Only these two
// functions tell them apart.
//
// A new run: the config's model with its trainable weights, loss, optimizer and schedule. `data` sizes the
// schedule when the config leaves total_steps to the run.
std::unique_ptr<Session> build_session(const RunConfig& cfg, const RunData& data);
// A resumed run: the checkpoint's graph, weights and optimizer state (the config it carries decides the rest).
std::unique_ptr<Session> restore_session(const RunConfig& cfg, const Model& checkpoint, const std::string& path);
// `onnxtrain eval`: the model at `model_path` as a checkpoint restored, or as a plain model trained the
// config's way (its loss is what eval reports).
TrainingSession evaluation_session(const RunConfig& cfg, const std::string& model_path);

}  // namespace onnxtrain::cli
