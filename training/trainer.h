#pragma once
// Trainer: the training loop over a Session (any kind: training/session_interface.h) and a DataLoader, with callbacks (progress, checkpoints,
// early stopping, metrics files), validation metrics, Ctrl-C handling and resumable position. docs/trainer.md.
//
//   Trainer t(session, train_loader, opts);
//   t.set_validation(&val_loader);
//   t.add_callback(std::make_shared<CheckpointEvery>("ckpt", 100, 3));
//   TrainResult r = t.fit();
#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "training/checkpoint.h"
#include "training/data.h"
#include "training/session_interface.h"

namespace onnxtrain {

// Validation metrics by name: "loss" (the session's loss, sample-weighted mean over batches), "accuracy"
// (argmax over axis 1 against class indices or one-hot targets; a single output column is thresholded at 0 for
// bce_with_logits, 0.5 otherwise), "mse", "mae", "r2" (scikit-learn's r2_score, uniform average over outputs).
const std::vector<std::string>& metric_kinds();
// True for metrics where larger is better (accuracy, r2).
bool metric_higher_is_better(const std::string& metric);

// Computes metrics over a loader with the session's current weights: a forward-only graph (model + loss,
// no backward) that shares nothing with the session but reads its weights before each evaluate().
class Evaluator {
 public:
  // `prediction`: the output the loss reads ("" = the first output); `loss_kind` picks the accuracy threshold.
  Evaluator(const Session& session, std::string prediction = "", std::string loss_kind = "");
  std::map<std::string, double> evaluate(const Session& session, DataLoader& data,
                                         const std::vector<std::string>& metrics);

 private:
  std::shared_ptr<TensorStore> store_;
  std::unique_ptr<Executor> exec_;
  std::string target_, loss_kind_;
};

struct StepInfo {
  int64_t epoch = 0;              // 0-based
  int64_t batch = 0;              // batch index within the epoch, 0-based
  int64_t batches_per_epoch = 0;
  int64_t step = 0;               // optimizer updates so far (after this batch)
  int64_t epochs = 0;             // the run's epochs (TrainerOptions::epochs)
  int64_t max_steps = 0;          // TrainerOptions::max_steps (0 = none)
  int64_t samples = 0;            // rows in this batch, all data-parallel ranks together
  bool updated = false;           // false for the first N-1 micro-batches of an accumulation
  // on_non_finite "skip": this batch's loss or a gradient was NaN/Inf and nothing was applied (loss is NaN;
  // session().last_skip_reason() names the step and the tensor).
  bool skipped = false;
  float loss = 0;
  double learning_rate = 0;
  double seconds = 0;             // wall time of this step
};

struct EpochInfo {
  int64_t epoch = 0;
  int64_t step = 0;
  double train_loss = 0;                  // mean batch loss of the epoch's batches that were not skipped
  int64_t skipped = 0;                    // batches of the epoch skipped (on_non_finite "skip")
  std::map<std::string, double> metrics;  // "val_loss", "val_accuracy", ... (empty without validation)
  double seconds = 0;
};

struct TrainResult {
  // finished (all epochs), max_steps, early_stopping, schedule (the adaptive schedule asked to stop),
  // interrupted (interrupt flag), stopped (a callback called request_stop), max_skipped_steps (more steps were
  // skipped than TrainerOptions::max_skipped_steps allows)
  std::string reason;
  int64_t steps = 0;
  int64_t skipped_steps = 0;  // the session's skipped_steps() at the end (the whole run, resumes included)
  int64_t epochs = 0;  // epochs completed
  std::map<std::string, double> metrics;  // the last validation metrics
  std::filesystem::path checkpoint;       // the last checkpoint written, if any
};

class Trainer;

// Hooks into the loop; every method has a no-op default. save_state/load_state let a callback carry its state
// through checkpoints (metadata keys should start with "onnxtrain.trainer.").
class Callback {
 public:
  virtual ~Callback() = default;
  virtual void on_train_begin(Trainer&) {}
  virtual void on_step(Trainer&, const StepInfo&) {}
  virtual void on_epoch_end(Trainer&, const EpochInfo&) {}
  virtual void on_train_end(Trainer&, TrainResult&) {}
  virtual void save_state(Metadata&) const {}
  virtual void load_state(const Metadata&, const std::string& source) {}
};

struct TrainerOptions {
  int64_t epochs = 1;
  int64_t max_steps = 0;  // optimizer steps; 0 = no limit
  // With on_non_finite "skip": stop (reason "max_skipped_steps") once the session has skipped more steps than
  // this, counted over the whole run including before a resume; 0 = no limit. A run that skips every step is
  // broken, and this turns it into an error instead of a run that trains nothing.
  int64_t max_skipped_steps = 0;
  std::vector<std::string> metrics = {"loss"};  // computed on the validation loader after each epoch
  std::string prediction;                       // model output for metrics ("" = the loss's, the first)
  std::string loss_kind;                        // for the accuracy threshold of single-column outputs
  // Checked at every step boundary; when set, the loop stops with reason "interrupted" (the CLI sets it from
  // SIGINT; CheckpointEvery then saves).
  const std::atomic<bool>* interrupt = nullptr;
  // Stored in every checkpoint() (the CLI keeps its config here, so `onnxtrain resume` needs only the file).
  Metadata metadata;
};

class Trainer {
 public:
  // Any session kind. Over replicas (training/replicas.h) each batch is split across them, and the run counts as
  // one process (rank 0 of 1) for the data, logs and checkpoints; data-parallel, each rank runs its own Trainer.
  Trainer(Session& session, DataLoader& train, TrainerOptions options = {});

  void set_validation(DataLoader* validation) { validation_ = validation; }
  void add_callback(std::shared_ptr<Callback> cb) { callbacks_.push_back(std::move(cb)); }
  void on_step(std::function<void(const StepInfo&)> f);
  void on_epoch_end(std::function<void(const EpochInfo&)> f);

  // Runs from the current position (the start, or where restore() left it) until the epochs are done, max_steps
  // is reached or something stops it.
  TrainResult fit();
  // Asks the loop to stop at the next step boundary.
  void request_stop(std::string reason);
  // Validation metrics now (empty without a validation loader).
  std::map<std::string, double> validate();

  // The session's checkpoint plus the loop position (epoch, batch, seed, epoch loss so far), every callback's
  // state and options.metadata.
  Model checkpoint() const;
  void save_checkpoint(const std::filesystem::path& path) const;
  // Continues where a checkpoint() left off (the session must have been rebuilt from the same checkpoint).
  // The global batch (batch size x ranks) must be the checkpoint's; the number of ranks may differ (see
  // resumed_batch_size). Errors name `source` and the key.
  void restore(const Model& checkpoint, const std::string& source);

  Session& session() { return session_; }
  const TrainerOptions& options() const { return options_; }
  int64_t epoch() const { return epoch_; }
  int64_t batch() const { return batch_; }
  const std::vector<std::shared_ptr<Callback>>& callbacks() const { return callbacks_; }
  // The session's data-parallel rank and number of ranks (0 and 1 without a communicator, and with replicas).
  // Files (checkpoints, metrics logs) are written by rank 0 only.
  int rank() const { return session_.rank(); }
  int world_size() const { return session_.world_size(); }

 private:
  void add_checkpoint_metadata(Model& m) const;  // the loop's position and the callbacks' state
  Session& session_;
  DataLoader& train_;
  DataLoader* validation_ = nullptr;
  TrainerOptions options_;
  std::vector<std::shared_ptr<Callback>> callbacks_;
  std::unique_ptr<Evaluator> evaluator_;
  int64_t epoch_ = 0, batch_ = 0;
  double epoch_loss_ = 0;  // sum of this epoch's batch losses so far (skipped batches excluded)
  int64_t epoch_skipped_ = 0;  // batches of this epoch skipped so far
  std::optional<std::string> stop_;
  std::map<std::string, double> last_metrics_;
};

// The per-rank batch size that continues a Trainer checkpoint on `world_size` ranks with the same global batch
// (the checkpoint's batch size x its ranks), so the steps are those the original run would have taken. Errors
// name `source` when the global batch does not divide by world_size.
int64_t resumed_batch_size(const Model& checkpoint, int world_size, const std::string& source);

// Saves "<dir>/step-<N>.onnx" every `every` optimizer steps (0 = only at the end), keeps the newest `keep_last`
// such files, and always saves at the end of fit() (also when interrupted), so the run can be resumed.
class CheckpointEvery : public Callback {
 public:
  CheckpointEvery(std::filesystem::path dir, int64_t every, int keep_last);
  void on_step(Trainer& t, const StepInfo& s) override;
  void on_train_end(Trainer& t, TrainResult& r) override;
  const std::filesystem::path& last() const { return last_; }

 private:
  void save(Trainer& t, int64_t step);
  std::filesystem::path dir_;
  int64_t every_;
  int keep_last_;
  std::filesystem::path last_;
};

// Stops when `metric` (an EpochInfo metric such as "val_loss", or "train_loss") has not improved by more than
// min_delta for `patience` epochs in a row. mode: "min", "max", or "auto" (max for accuracy and r2).
class EarlyStopping : public Callback {
 public:
  EarlyStopping(std::string metric, int64_t patience, double min_delta = 0, std::string mode = "auto");
  void on_epoch_end(Trainer& t, const EpochInfo& e) override;
  void save_state(Metadata& m) const override;
  void load_state(const Metadata& m, const std::string& source) override;
  std::optional<double> best() const { return best_; }

 private:
  std::string metric_;
  int64_t patience_;
  double min_delta_;
  bool maximize_;
  std::optional<double> best_;
  int64_t bad_epochs_ = 0;
};

// One row per logged step and per epoch, as CSV (header: event,epoch,step,loss,lr,samples_per_s,<metrics>)
// or JSON lines (one object per row). Appends to an existing file, so a resumed run continues its log.
// Data-parallel: rank 0 writes (the logged loss is already reduced over the ranks), the others nothing.
class MetricsLog : public Callback {
 public:
  MetricsLog(std::filesystem::path path, std::vector<std::string> epoch_metrics, std::string format = "",
             int64_t every = 1);
  void on_train_begin(Trainer& t) override;
  void on_step(Trainer& t, const StepInfo& s) override;
  void on_epoch_end(Trainer& t, const EpochInfo& e) override;

 private:
  void row(const std::string& event, int64_t epoch, int64_t step, double loss, double lr, double rate,
           const std::map<std::string, double>& metrics);
  std::filesystem::path path_;
  std::vector<std::string> columns_;
  bool json_;
  int64_t every_;
  bool writes_ = false;  // rank 0 (set by on_train_begin)
};

}  // namespace onnxtrain
