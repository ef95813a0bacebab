#pragma once
// TrainingSession: the C++ API. From an inference model it builds three graphs that share one weight store:
//   inference  = the model as given;
//   gradients  = model + loss + backward (outputs: loss and "<weight>_grad" per trainable weight);
//   train step = gradients graph + optimizer, whose updates the executor writes back in place;
//   with gradient accumulation, also an accumulate-only step (gradients added into buffers, no update).
// Optimizer state (moments, step counter, learning rates) lives in the same store; see docs/optimizers.md.
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "executor/device.h"
#include "executor/executor.h"
#include "graph/ir.h"
#include "graph/model_io.h"  // TensorBytes
#include "training/forward_backward.h"
#include "training/session_interface.h"
#include "training/training_config.h"

namespace onnxtrain {

class NonFiniteError;  // executor/finite.h
struct LabelRange;      // training/labels.h

// The one-process session (data-parallel when config.parallel has a communicator); the Session interface's
// calls are documented here.
class TrainingSession final : public Session {
 public:
  TrainingSession(Model model, TrainingConfig config);
  static TrainingSession from_file(const std::filesystem::path& model, TrainingConfig config);

  // One step on a batch: the model's inputs plus the loss target (target_name()). Returns the loss before
  // the update; when data-parallel, the loss of the ranks' batches together (the same on every rank).
  float train_step(const Feeds& feeds) override;
  // The model's outputs, in order.
  std::vector<Tensor> infer(const Feeds& inputs) override;
  // Loss and the gradient of every trainable weight, without updating anything. This rank's own batch only:
  // no communication, also when data-parallel.
  // (Session::Gradients: loss, and grads by weight name.)
  Gradients gradients(const Feeds& feeds) override;

  const std::vector<std::string>& trainable() const override { return trainable_; }
  const TrainingConfig& config() const override { return config_; }
  const std::string& target_name() const override { return target_; }
  // The session's edge (docs/gpu.md): weights, state and every result below come back as host tensors, and
  // set_weight and feeds take tensors on any device, whatever device the session runs on.
  Tensor get_weight(const std::string& name) const override;  // a host copy
  // The live value of a trainable weight, not a copy, on the session's device: every step updates it in place
  // (read it between steps, through executor/transfer.h unless the session runs on the CPU).
  const Tensor& weight_value(const std::string& name) const override;
  std::map<std::string, Tensor> weights() const override;     // host copies of every trainable weight
  void set_weight(const std::string& name, const Tensor& value) override;
  // The default group's learning rate. Setting it scales every parameter group's rate by the same factor
  // (as torch's schedulers do), so groups keep their ratio to the default.
  double learning_rate() const override;
  void set_learning_rate(double lr) override;
  // Optimizer updates applied so far ("optim.step"); micro-batches of an accumulation do not count.
  int64_t step() const override;
  // With on_non_finite = "skip": train_step calls whose update was not applied (micro-batches included; they
  // do not advance step()), and the report of the latest one ("" before the first, and after a resume). The
  // count is saved in checkpoints.
  int64_t skipped_steps() const override { return skipped_steps_; }
  const std::string& last_skip_reason() const override { return last_skip_reason_; }
  // train_step calls so far, skipped ones and micro-batches included: the "training step N" of a non-finite
  // report. Saved in checkpoints, so a resumed run keeps numbering.
  int64_t train_step_calls() const override { return step_calls_; }
  // With mixed precision: the current loss scale, and the steps skipped because of an overflow (both 0 without).
  float loss_scale() const override;
  int64_t overflow_steps() const override;
  // For epoch-based schedules (scikit-learn's adaptive): report an epoch's mean training loss, and ask whether
  // the schedule wants training to stop.
  void end_epoch(double mean_loss) override;
  bool stop_requested() const override;
  // A host copy of an optimizer state tensor by its documented name ("fc1.weight.exp_avg", "optim.step", ...).
  Tensor state(const std::string& name) const override;
  const std::vector<std::string>& state_names() const override { return state_names_; }
  // The inference model with the current weights (no training_info, no optimizer state).
  Model export_inference() const override;
  void export_inference(const std::filesystem::path& path) const override;  // the same, saved atomically
  // Trainable checkpoint (docs/checkpoint.md): the inference model with the current weights, plus
  // training_info[0] holding one training step, its update bindings and the optimizer state, plus the
  // configuration in metadata_props. Standard ONNX: inference runtimes run it and ignore training_info.
  Model checkpoint() const override;
  // checkpoint() and export_inference() without the copies: every tensor the session stores (weights,
  // optimizer state) is hollow (dtype and dims, no bytes; graph/model_io.h), and stored_bytes() reads them in
  // place until the next train_step. save_checkpoint and export_inference(path) stream them to the file this way
  // (docs/checkpoint.md, "Large models"). On a device other than the CPU they hold host copies instead.
  Model checkpoint_shell() const override;
  // The model a checkpoint stores: the inference model, plus the training forward's adapter dropout nodes and
  // their step counter when adapter.dropout > 0 (docs/lora.md). export_inference never has them.
  Model export_shell() const;
  TensorBytes stored_bytes() const override;
  // Atomic: temp file, fsync, rename. When data-parallel only rank 0 writes (the others return at once; the
  // ranks hold the same state), as for export_inference(path).
  void save_checkpoint(const std::filesystem::path& path) const override;
  // Rebuilds the session a checkpoint was saved from; training continues bit-for-bit on CPU. Errors name the
  // file (or `source`).
  // `parallel` resumes data-parallel (every rank reads the same checkpoint). `device` is where the resumed
  // session runs, whatever device saved it (checkpoints hold host copies of every tensor).
  static TrainingSession from_checkpoint(const std::filesystem::path& path, DataParallelSpec parallel = {},
                                         std::string device = default_device_name());
  static TrainingSession from_checkpoint(const Model& checkpoint, const std::string& source,
                                         DataParallelSpec parallel = {}, std::string device = default_device_name());
  // A standard ONNX model of the gradients graph with the current weights: inputs are the model's plus the
  // target, outputs are the loss and "<weight>_grad" per trainable weight. Fused gradient ops ship as
  // model-local functions with standard-op bodies, so any ONNX runtime can run it.
  Model export_gradient_model() const override;
  // The Yield boundary (docs/yield.md), for an outside autograd that owns the loss: the model's outputs, in
  // order, keeping the activations the backward pass reads; then the gradients of the trainable weights and
  // of config.inputs_requiring_grad, by name, given one gradient per output (nullopt = zeros). Runs on this
  // session's weights: a train_step or set_weight between calls is seen by the next run_forward. The
  // forward/backward graphs are built on the first run_forward. See ForwardBackwardSession.
  std::vector<Tensor> run_forward(const Feeds& inputs) override;
  std::map<std::string, Tensor> run_backward(const std::vector<std::optional<Tensor>>& output_grads) override;
  // The session behind run_forward/run_backward (built on first use), for inspection.
  ForwardBackwardSession& forward_backward();
  // The full training-step graph (for inspection and for portable export).
  const Graph& training_graph() const override { return train_->graph(); }
  // With TrainingConfig::profile: where train_step's time went, per step of its plan, most expensive first
  // (accumulation micro-batches not included). Empty without.
  std::vector<StepTime> profile() const override { return train_->profile(); }
  const Graph& gradient_graph() const override { return grad_->graph(); }
  // Bytes of the arena of train_step's latest plan (every intermediate value, placed by lifetime by the
  // memory planner; 0 before the first step): the activation memory that memory.recompute reduces.
  size_t arena_bytes() const override { return train_->last_plan() ? train_->last_plan()->arena_bytes() : 0; }
  // Of arena_bytes(), the optimizer's new weights and state, which the plan hands over to the store: the same at
  // every batch size and with or without recomputation. The rest is the activations, gradients and temporaries.
  size_t arena_update_bytes() const override { return train_->last_plan() ? train_->last_plan()->handed_over_bytes() : 0; }
  // The communicator of a data-parallel session; null otherwise.
  const std::shared_ptr<Communicator>& communicator() const override { return config_.parallel.communicator; }
  Device device() const override { return device_; }

 private:
  // The constructor, step by step (session.cpp): each reads what the ones before it built.
  struct Build;
  void adapt_model(Build& b);
  void build_forward_graphs(Build& b);
  void choose_trainable(Build& b);
  void build_gradient_graph(Build& b);
  void build_step_graphs(Build& b);
  void compile(Build& b);
  const Graph& forward_of(const Build& b) const;  // the model as computed: with mixed precision's casts
  // from_checkpoint on a model it may take apart (the path overload's, loaded for it).
  static TrainingSession resume(Model&& checkpoint, const std::string& source, DataParallelSpec parallel,
                                std::string device);
  std::span<const Tensor* const> order_feeds(Executor& ex, const Feeds& feeds);
  // Data-parallel: the collectives between gradients and optimizer, and rank 0's state on every rank.
  void reduce_gradients(Graph& step_graph, std::map<std::string, std::string>& grads) const;
  void synchronize_initial_state();
  bool writes_files() const { return !config_.parallel.active() || config_.parallel.communicator->rank() == 0; }
  void skip_or_raise(const NonFiniteError& e);
  // Records how reports name the loss and gradients a step checks; returns them, loss first.
  std::vector<std::string> describe_guarded(const std::string& loss, const std::map<std::string, std::string>& grads);

  // A hollow tensor for what the store holds (a host copy off the CPU), for the shells above.
  TensorData stored_or_hollow(const std::string& name) const;
  Model inference_shell() const;  // export_inference()'s model, hollow as export_shell's
  // The model and the graphs the session builds keep dtype and dims of their floating-point initializers; the
  // store holds the one copy of the bytes (a large model would otherwise be held once per executor).
  void keep_in_store(Graph& g);

  Model model_;
  TrainingConfig config_;
  Device device_;
  std::vector<std::string> trainable_;
  std::string target_, loss_, lr_name_;
  std::map<std::string, std::string> grad_names_;
  std::shared_ptr<TensorStore> store_;
  std::unique_ptr<Executor> infer_, grad_, train_, accumulate_;
  std::vector<std::string> state_names_, group_lr_names_;
  Graph initialization_;  // the checkpoint's initialization graph, built while the state's initial values exist
  std::string step_name_;
  std::string dropout_counter_;     // kLoraDropoutCounter when the training graphs have adapter dropout
  std::vector<std::pair<std::string, std::string>> updates_;  // the training step's (new value, state)
  int micro_ = 0;  // micro-batches accumulated since the last update
  std::unique_ptr<LrSchedule> schedule_;  // null for "constant"
  std::vector<const Tensor*> feed_ptrs_;
  std::unique_ptr<KernelRegistry> registry_;  // default kernels plus AllReduce, when data-parallel
  std::unique_ptr<ForwardBackwardSession> forward_backward_;  // run_forward/run_backward, built on first use
  int64_t step_calls_ = 0;  // train_step calls, for naming the step in a non-finite report
  int64_t skipped_steps_ = 0;
  std::string last_skip_reason_;
  // The values train_step checks for NaN/Inf, with how a report names them ("the gradient of 'w'").
  std::map<std::string, std::string> guarded_;
  std::shared_ptr<const LabelRange> labels_;  // set when the loss reads class indices (checked per batch)
};

}  // namespace onnxtrain
