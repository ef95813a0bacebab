#pragma once
// ReplicatedSession: data parallelism across the threads of one process. N replicas of a TrainingSession, each
// on its own thread and running its kernels on one OpenMP thread; a step splits the batch's rows into N parts,
// every replica runs forward and backward on its part, the gradients are averaged in shared memory
// (distributed/threads.h) and every replica applies the same update to its own copy of the weights.
//
// Why: with one session on N threads, every operator is split across the cores, so each one's output is read
// by the other core in the next; where cross-core traffic is dear (docs/performance.md, "Replicas") that costs
// more than the arithmetic. Replicas exchange data once per step, in the gradient allreduce.
//
// The step is the data-parallel step of docs/distributed.md on the whole batch: for a loss that is a mean
// over rows (or a sum), the same update as one session on the whole batch, up to float rounding. Unequal parts
// (rows not divisible by N) are weighted by their row counts. Losses whose mean is weighted differently
// (class weights, ignored labels) average the parts' means instead, as MPI ranks do.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "distributed/threads.h"
#include "training/session.h"
#include "training/session_interface.h"

namespace onnxtrain {

// Whether replicas can run on a device: they average gradients in host memory from inside their kernels, so they
// run where the CPU kernels run, on "cpu" and on the guarded test device (which is how CI checks their edges).
bool replicas_run_on(const std::string& device);

class ReplicatedSession final : public Session {
 public:
  // Builds replica r as make(parallel_r), each on its own thread (replica 0 on the caller's), at the same time:
  // data-parallel sessions broadcast replica 0's weights and state while they are built.
  using Factory = std::function<TrainingSession(const DataParallelSpec&)>;
  ReplicatedSession(int replicas, const Factory& make);
  // N replicas of TrainingSession(model, config); config.parallel must be empty.
  ReplicatedSession(const Model& model, const TrainingConfig& config, int replicas);
  // N replicas resumed from a trainable checkpoint (TrainingSession::from_checkpoint).
  static std::unique_ptr<ReplicatedSession> from_checkpoint(const std::filesystem::path& path, int replicas);
  ~ReplicatedSession() override;
  ReplicatedSession(const ReplicatedSession&) = delete;
  ReplicatedSession& operator=(const ReplicatedSession&) = delete;

  int replicas() const override { return static_cast<int>(sessions_.size()); }

  // One step on the whole batch: every feed is split along dimension 0 (the batch: the smallest first dimension;
  // a feed with k times as many, such as per-token targets flattened, is split in blocks of k). A batch with
  // fewer rows than replicas leaves the extra ones standing in with weight 0. Returns the batch's loss. After an
  // error raised by every replica alike (a non-finite loss with on_non_finite = "raise", a bad label in every
  // part) the session can go on; after one raised by some replicas only, the replicas may be out of step and
  // every later call throws.
  float train_step(const Feeds& feeds) override;
  // The calls that change weights or state reach every replica, each on its replica's thread.
  void set_weight(const std::string& name, const Tensor& value) override;
  void set_learning_rate(double lr) override;
  void end_epoch(double mean_loss) override;

  // Replica 0. Every replica holds the same weights and state after each step, so reading it (weights, state,
  // checkpoint(), export) reads the replicated session; the calls below do.
  const TrainingSession& primary() const { return *sessions_.front(); }
  // Computations that change no weights or state run on replica 0, from the caller's thread (infer on one
  // OpenMP thread, as the replicas run).
  std::vector<Tensor> infer(const Feeds& inputs) override;
  Gradients gradients(const Feeds& feeds) override { return replica0().gradients(feeds); }
  std::vector<Tensor> run_forward(const Feeds& inputs) override { return replica0().run_forward(inputs); }
  std::map<std::string, Tensor> run_backward(const std::vector<std::optional<Tensor>>& output_grads) override {
    return replica0().run_backward(output_grads);
  }
  bool stop_requested() const override { return primary().stop_requested(); }
  const std::vector<std::string>& trainable() const override { return primary().trainable(); }
  Tensor get_weight(const std::string& name) const override { return primary().get_weight(name); }
  const Tensor& weight_value(const std::string& name) const override { return primary().weight_value(name); }
  std::map<std::string, Tensor> weights() const override { return primary().weights(); }
  double learning_rate() const override { return primary().learning_rate(); }
  int64_t step() const override { return primary().step(); }
  int64_t skipped_steps() const override { return primary().skipped_steps(); }
  const std::string& last_skip_reason() const override { return primary().last_skip_reason(); }
  int64_t train_step_calls() const override { return primary().train_step_calls(); }
  float loss_scale() const override { return primary().loss_scale(); }
  int64_t overflow_steps() const override { return primary().overflow_steps(); }
  Tensor state(const std::string& name) const override { return primary().state(name); }
  const std::vector<std::string>& state_names() const override { return primary().state_names(); }
  Model checkpoint() const override { return primary().checkpoint(); }
  Model checkpoint_shell() const override { return primary().checkpoint_shell(); }
  TensorBytes stored_bytes() const override { return primary().stored_bytes(); }
  // Only replica 0 writes.
  void save_checkpoint(const std::filesystem::path& path) const override { primary().save_checkpoint(path); }
  Model export_inference() const override { return primary().export_inference(); }
  void export_inference(const std::filesystem::path& path) const override { primary().export_inference(path); }
  Model export_gradient_model() const override { return primary().export_gradient_model(); }
  const TrainingConfig& config() const override { return primary().config(); }
  const std::string& target_name() const override { return primary().target_name(); }
  const Graph& training_graph() const override { return primary().training_graph(); }
  const Graph& gradient_graph() const override { return primary().gradient_graph(); }
  Device device() const override { return primary().device(); }
  // Replica 0's plan: each replica's profile covers its part of the batch.
  std::vector<StepTime> profile() const override { return primary().profile(); }
  size_t arena_bytes() const override { return primary().arena_bytes(); }
  size_t arena_update_bytes() const override { return primary().arena_update_bytes(); }
  // Null: the replicas are one process (their own communicator joins the threads, inside train_step).
  const std::shared_ptr<Communicator>& communicator() const override { return no_communicator_; }

  // Runs f on every replica at once, each on its replica's thread; rethrows the first error.
  void for_each(const std::function<void(TrainingSession&)>& f);

 private:
  struct Pool;
  TrainingSession& replica0() { return *sessions_.front(); }
  // Runs job(ctx, r) for every replica r on its thread and waits; then rethrows as train_step describes.
  void run(void (*job)(void*, int), void* ctx, const char* what);
  void check_usable() const;
  void split(const Feeds& feeds);
  static void step_job(void* self, int replica);

  std::unique_ptr<ThreadGroup> group_;
  std::vector<std::unique_ptr<TrainingSession>> sessions_;
  std::unique_ptr<Pool> pool_;
  std::string broken_;  // why every call throws, after a failure that left the replicas out of step
  // The per-replica feeds of the last step: views into the caller's arrays, rebuilt when the feeds change.
  std::vector<Feeds> parts_;
  std::vector<std::pair<int64_t, int64_t>> rows_;  // per replica: first row, row count
  std::vector<float> losses_;
  int64_t batch_rows_ = -1;
  std::shared_ptr<Communicator> no_communicator_;
};

}  // namespace onnxtrain
