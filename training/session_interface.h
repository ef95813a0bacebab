#pragma once
// Session: what every kind of training session offers. The Trainer, train_epoch, the Python binding, the
// estimators and the CLI take a Session& and never ask which kind they hold (docs/architecture.md, "Sessions").
// The kinds:
//   TrainingSession (training/session.h): one process; data-parallel across MPI or NCCL ranks when its config
//     carries a communicator (every rank runs its own session and calls train_step with its shard);
//   ReplicatedSession (training/replicas.h): one-thread replicas in this process that split every batch.
// Reads (weights, state, checkpoints, exports) see the run's one set of values: replicas hold the same weights and
// state after every step, and so do data-parallel ranks. Calls that change them (train_step, set_weight,
// set_learning_rate, end_epoch) reach every replica.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "distributed/communicator.h"
#include "executor/executor.h"  // StepTime
#include "graph/ir.h"
#include "graph/model_io.h"  // TensorBytes
#include "training/training_config.h"

namespace onnxtrain {

// A batch: the model's inputs plus the loss target (and sample weights when the loss reads them), by name.
using Feeds = std::map<std::string, Tensor>;

class Session {
 public:
  virtual ~Session() = default;

  // ---- Steps. Only train_step and end_epoch change anything.
  // One optimizer step on a batch (one micro-batch with gradient accumulation); the loss before the update. NaN
  // for a step skipped with on_non_finite = "skip".
  virtual float train_step(const Feeds& feeds) = 0;
  // The model's outputs, in order.
  virtual std::vector<Tensor> infer(const Feeds& inputs) = 0;
  // Loss and the gradient of every trainable weight, without updating anything.
  struct Gradients {
    float loss = 0;
    std::map<std::string, Tensor> grads;
  };
  virtual Gradients gradients(const Feeds& feeds) = 0;
  // The Yield boundary (docs/yield.md): the forward half, then the backward half given the outputs' gradients.
  virtual std::vector<Tensor> run_forward(const Feeds& inputs) = 0;
  virtual std::map<std::string, Tensor> run_backward(const std::vector<std::optional<Tensor>>& output_grads) = 0;
  // An epoch's mean training loss, for epoch-based schedules; and whether the schedule asks training to stop.
  virtual void end_epoch(double mean_loss) = 0;
  virtual bool stop_requested() const = 0;

  // ---- Weights, as host copies; weight_value is the live value on the session's device.
  virtual const std::vector<std::string>& trainable() const = 0;
  virtual Tensor get_weight(const std::string& name) const = 0;
  virtual const Tensor& weight_value(const std::string& name) const = 0;
  virtual std::map<std::string, Tensor> weights() const = 0;
  virtual void set_weight(const std::string& name, const Tensor& value) = 0;

  // ---- Optimizer state and the step's bookkeeping (TrainingSession documents each).
  virtual double learning_rate() const = 0;
  virtual void set_learning_rate(double lr) = 0;
  virtual int64_t step() const = 0;
  virtual int64_t skipped_steps() const = 0;
  virtual const std::string& last_skip_reason() const = 0;
  virtual int64_t train_step_calls() const = 0;
  virtual float loss_scale() const = 0;
  virtual int64_t overflow_steps() const = 0;
  virtual Tensor state(const std::string& name) const = 0;
  virtual const std::vector<std::string>& state_names() const = 0;

  // ---- Checkpoints and exports (docs/checkpoint.md). Only rank 0 of a data-parallel run writes files.
  virtual Model checkpoint() const = 0;
  virtual Model checkpoint_shell() const = 0;
  virtual TensorBytes stored_bytes() const = 0;
  virtual void save_checkpoint(const std::filesystem::path& path) const = 0;
  virtual Model export_inference() const = 0;
  virtual void export_inference(const std::filesystem::path& path) const = 0;
  virtual Model export_gradient_model() const = 0;

  // ---- What it trains, and where.
  virtual const TrainingConfig& config() const = 0;
  virtual const std::string& target_name() const = 0;
  virtual const Graph& training_graph() const = 0;
  virtual const Graph& gradient_graph() const = 0;
  virtual Device device() const = 0;
  virtual std::vector<StepTime> profile() const = 0;
  virtual size_t arena_bytes() const = 0;
  virtual size_t arena_update_bytes() const = 0;
  // The communicator between the processes of a data-parallel run; null for one process (replicas are one
  // process: they split the batches it reads rather than each reading a share of the data).
  virtual const std::shared_ptr<Communicator>& communicator() const = 0;
  // One-thread replicas that split each batch (1 for every other kind).
  virtual int replicas() const { return 1; }
  // This process's rank and the number of processes: 0 and 1 without a communicator.
  int rank() const { return communicator() ? communicator()->rank() : 0; }
  int world_size() const { return communicator() ? communicator()->size() : 1; }
};

}  // namespace onnxtrain
