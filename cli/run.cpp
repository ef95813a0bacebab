#include "cli/run.h"

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "cli/commands.h"
#include "cli/progress.h"
#include "graph/error.h"

namespace onnxtrain::cli {

namespace {

std::atomic<bool> g_interrupted{false};

extern "C" void on_sigint(int) {
  g_interrupted.store(true);
  std::signal(SIGINT, SIG_DFL);  // a second Ctrl-C ends the process at once
}

// Test-only hook, as ONNXTRAIN_TEST_SHAPE_INFERENCE_FAULT is for shape inference: with
// ONNXTRAIN_TEST_SIGINT_AT_STEP=k the process sends itself SIGINT right after step k (on every rank, or only on
// rank ONNXTRAIN_TEST_SIGINT_RANK), so the Ctrl-C tests interrupt at a known step instead of racing a timer
// against the run. Everything from the signal on is the real path: handler, flag, step boundary, checkpoint.
// ONNXTRAIN_TEST_SIGNAL=KILL sends SIGKILL instead: a rank that dies at a known step.
class SignalAtStep : public Callback {
 public:
  SignalAtStep(int64_t step, int sig) : step_(step), sig_(sig) {}
  void on_step(Trainer&, const StepInfo& s) override {
    if (s.step == step_) std::raise(sig_);
  }

 private:
  int64_t step_;
  int sig_;
};

std::shared_ptr<Callback> test_signal_hook(int rank) {
  const char* step = std::getenv("ONNXTRAIN_TEST_SIGINT_AT_STEP");
  if (!step || !*step) return nullptr;
  if (const char* only = std::getenv("ONNXTRAIN_TEST_SIGINT_RANK"); only && *only && std::atoi(only) != rank) return nullptr;
  const char* sig = std::getenv("ONNXTRAIN_TEST_SIGNAL");
  return std::make_shared<SignalAtStep>(std::atoll(step), sig && std::string(sig) == "KILL" ? SIGKILL : SIGINT);
}

// Made before the loaders and the Trainer, so an `output` that cannot be written fails before the first step
// rather than at the first checkpoint.
std::filesystem::path output_folder(const RunConfig& cfg) {
  const std::filesystem::path out = cfg.output_dir();
  std::error_code ec;
  std::filesystem::create_directories(out, ec);
  if (ec) fail(where_of(cfg, "output"), "cannot create " + out.string() + ": " + ec.message());
  return out;
}

struct Loaders {
  DataLoader train;
  std::unique_ptr<DataLoader> validation;  // null without validation data
};

// Data-parallel (mpirun): every rank reads its share of each epoch's order, batch_size rows per step.
Loaders loaders_for(const RunConfig& cfg, const Session& session, const RunData& data) {
  return Loaders{
      DataLoader(make_feeds(cfg, session, data.train, "training"), cfg.batch_size,
                 std::make_shared<RandomSampler>(data.train_rows, cfg.data.shuffle, cfg.data.seed, session.rank(),
                                                 session.world_size()),
                 cfg.data.drop_last),
      data.validation.empty()
          ? nullptr
          : std::make_unique<DataLoader>(make_feeds(cfg, session, data.validation, "validation"),
                                         cfg.eval_batch_size > 0 ? cfg.eval_batch_size : cfg.batch_size)};
}

TrainerOptions trainer_options(const RunConfig& cfg) {
  TrainerOptions opts;
  opts.epochs = cfg.epochs;
  opts.max_steps = cfg.max_steps;
  opts.max_skipped_steps = cfg.max_skipped_steps;
  opts.metrics = cfg.metrics;
  opts.prediction = cfg.training.prediction;
  opts.loss_kind = cfg.training.loss.kind;
  opts.interrupt = &g_interrupted;
  opts.metadata = {{kConfigKey, cfg.text}, {kConfigPathKey, std::filesystem::absolute(cfg.source).string()}};
  return opts;
}

void add_callbacks(Trainer& trainer, const RunConfig& cfg, const std::filesystem::path& out,
                   bool validates) {
  std::vector<std::string> columns;
  if (validates)
    for (const std::string& m : cfg.metrics) columns.push_back("val_" + m);
  if (trainer.rank() == 0) trainer.add_callback(std::make_shared<Progress>(cfg.progress));
  trainer.add_callback(std::make_shared<MetricsLog>(out / cfg.log_file, columns, cfg.log_format == "auto" ? "" : cfg.log_format,
                                                    cfg.log_every));
  trainer.add_callback(std::make_shared<CheckpointEvery>(out / "checkpoints", cfg.checkpoint_every, static_cast<int>(cfg.keep_last)));
  if (cfg.patience > 0)
    trainer.add_callback(std::make_shared<EarlyStopping>(cfg.early_metric, cfg.patience, cfg.min_delta, cfg.early_mode));
  if (auto hook = test_signal_hook(trainer.rank())) trainer.add_callback(hook);
}

// Rank 0 speaks for the job (banner, progress, report); the others print only errors.
void silence_other_ranks(const Session& s) {
  const int rank = s.rank();
  if (rank != 0 && !std::freopen("/dev/null", "w", stdout)) fail("stdout", "cannot silence rank " + std::to_string(rank));
}

void print_banner(const RunConfig& cfg, const Session& session, const RunData& data, const Loaders& loaders,
                  const Trainer& trainer, bool resumed) {
  const int world = session.world_size();
  if (world > 1)
    std::printf("data-parallel: %d ranks (%s), batch %lld per rank (%lld per step)\n", world,
                session.communicator()->backend().c_str(), static_cast<long long>(cfg.batch_size),
                static_cast<long long>(cfg.batch_size) * world);
  if (session.replicas() > 1)
    std::printf("replicas: %d one-thread replicas, each on a part of every batch of %lld\n", session.replicas(),
                static_cast<long long>(cfg.batch_size));
  std::printf("training %s on %s: %zu trainable tensors, %lld training rows%s, batch %lld, %s lr %g, %lld epochs\n",
              cfg.model.c_str(), cfg.device.c_str(), session.trainable().size(), static_cast<long long>(data.train_rows),
              loaders.validation ? (", " + std::to_string(loaders.validation->size()) + " validation rows").c_str() : "",
              static_cast<long long>(cfg.batch_size), cfg.training.optimizer.kind.c_str(), session.learning_rate(),
              static_cast<long long>(cfg.epochs));
  if (resumed)
    std::printf("resuming at epoch %lld, batch %lld, step %lld\n", static_cast<long long>(trainer.epoch() + 1),
                static_cast<long long>(trainer.batch()), static_cast<long long>(session.step()));
  std::fflush(stdout);
}

// Ctrl-C only raises the flag the loop checks at each step boundary, so the run stops with a checkpoint instead
// of losing the steps since the last one.
TrainResult fit_until_interrupted(Trainer& trainer) {
  g_interrupted = false;
  auto previous = std::signal(SIGINT, on_sigint);
  TrainResult r = trainer.fit();
  std::signal(SIGINT, previous);
  return r;
}

std::filesystem::path trained_model_path(const RunConfig& cfg) { return cfg.output_dir() / "model.onnx"; }

}  // namespace

TrainResult run(const RunConfig& cfg, Session& session, const RunData& data, std::optional<Resume> resume) {
  const std::filesystem::path out = output_folder(cfg);
  Loaders loaders = loaders_for(cfg, session, data);
  Trainer trainer(session, loaders.train, trainer_options(cfg));
  if (loaders.validation) trainer.set_validation(loaders.validation.get());
  add_callbacks(trainer, cfg, out, loaders.validation != nullptr);
  if (resume) trainer.restore(resume->checkpoint, resume->source);
  silence_other_ranks(session);
  print_banner(cfg, session, data, loaders, trainer, resume.has_value());
  TrainResult r = fit_until_interrupted(trainer);
  session.export_inference(trained_model_path(cfg));
  return r;
}

int report(const RunConfig& cfg, Session& session, const TrainResult& r) {
  const std::filesystem::path out = cfg.output_dir();
  std::printf("stopped: %s after %lld steps (%lld epochs complete)\n", r.reason.c_str(), static_cast<long long>(r.steps),
              static_cast<long long>(r.epochs));
  if (cfg.training.on_non_finite == "skip" || r.skipped_steps > 0)
    std::printf("skipped steps: %lld (non-finite loss or gradient; train.on_non_finite: skip)\n",
                static_cast<long long>(r.skipped_steps));
  std::printf("checkpoint: %s\n", r.checkpoint.string().c_str());
  std::printf("metrics log: %s\n", (out / cfg.log_file).string().c_str());
  std::printf("trained model: %s\n", trained_model_path(cfg).string().c_str());
  for (const auto& [k, v] : r.metrics) std::printf("validation %s: %.6g\n", k.substr(4).c_str(), v);
  if (cfg.training.profile)
    std::printf("profile of train_step (train.profile): %s", format_profile(session.profile()).c_str());
  if (r.reason == "interrupted") {
    std::printf("interrupted; continue with: onnxtrain resume %s\n", r.checkpoint.string().c_str());
    return kExitInterrupted;
  }
  if (r.reason == "max_skipped_steps") {
    const std::string& last = session.last_skip_reason();
    std::fflush(stdout);
    std::fprintf(stderr, "onnxtrain: %s: %lld steps were skipped, more than the limit of %lld, so the run stopped%s%s\n",
                 where_of(cfg, "train.max_skipped_steps").c_str(), static_cast<long long>(r.skipped_steps),
                 static_cast<long long>(cfg.max_skipped_steps), last.empty() ? "" : "; the latest: ", last.c_str());
    return kExitFailure;
  }
  if (r.reason == "diverged") {
    std::fprintf(stderr, "onnxtrain: the loss is not finite (diverged); lower optimizer.learning_rate or clip gradients\n");
    return kExitFailure;
  }
  return 0;
}

}  // namespace onnxtrain::cli
