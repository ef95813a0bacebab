#include "cli/run.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>

#include "cli/progress.h"
#include "graph/error.h"
#include "graph/model_io.h"
#include "optimizers/optimizer.h"

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

// "<file>:<line>: <key>" for the key, or for the nearest enclosing key that was set ("data.inputs" for
// "data.inputs.x").
std::string where_of(const RunConfig& cfg, const std::string& key) {
  for (std::string k = key; !k.empty(); k.resize(k.rfind('.') == std::string::npos ? 0 : k.rfind('.')))
    if (auto it = cfg.locations.find(k); it != cfg.locations.end()) return it->second + ": " + key;
  return cfg.source.string() + ": " + key;
}

std::string names(const Dataset& d) {
  std::string s;
  for (const auto& [k, v] : d) s += (s.empty() ? "" : ", ") + k + " " + v.describe();
  return s;
}

Dataset take_rows(const Dataset& d, const std::vector<int64_t>& rows) {
  Dataset out;
  for (const auto& [k, t] : d) {
    std::vector<int64_t> shape = t.shape;
    shape[0] = static_cast<int64_t>(rows.size());
    Tensor o = Tensor::empty(t.dtype, shape);
    gather_rows(t, rows, o);
    out[k] = std::move(o);
  }
  return out;
}

}  // namespace

std::vector<std::string> select_trainable(const Model& model, const RunConfig& cfg) {
  std::vector<std::string> floats;
  for (const auto& [name, t] : model.graph.initializers)
    if (is_floating(t.dtype)) floats.push_back(name);
  auto matching = [&](const std::vector<std::string>& patterns, const std::string& key) {
    std::vector<std::string> out;
    for (const std::string& p : patterns) {
      size_t before = out.size();
      for (const std::string& n : floats)
        if (glob_match(p, n) && std::find(out.begin(), out.end(), n) == out.end()) out.push_back(n);
      if (out.size() == before) {
        std::string all;
        for (const std::string& n : floats) all += (all.empty() ? "" : ", ") + n;
        fail(where_of(cfg, key), "'" + p + "' matches no floating-point initializer of the model; they are: " + all);
      }
    }
    return out;
  };
  std::vector<std::string> chosen = cfg.trainable.empty() ? floats : matching(cfg.trainable, "trainable");
  std::vector<std::string> frozen = matching(cfg.frozen, "frozen");
  std::erase_if(chosen, [&](const std::string& n) { return std::find(frozen.begin(), frozen.end(), n) != frozen.end(); });
  if (chosen.empty()) fail(where_of(cfg, cfg.frozen.empty() ? "trainable" : "frozen"), "leaves no weight to train");
  std::sort(chosen.begin(), chosen.end());
  return chosen;
}

Dataset read_sources(const RunConfig& cfg, const std::vector<std::string>& files, const std::string& key) {
  CsvOptions csv{cfg.data.csv_delimiter.at(0), cfg.data.csv_header};
  Dataset all;
  for (const std::string& f : files) {
    Dataset d;
    try {
      d = read_data_file(cfg.resolve(f), csv);
    } catch (const Error& e) {
      fail(where_of(cfg, key), e.what());
    }
    for (auto& [k, t] : d) {
      if (all.count(k)) fail(where_of(cfg, key), "array '" + k + "' appears in more than one file");
      if (t.rank() > 0 && t.shape[0] == 0) fail(where_of(cfg, key), f + ": no rows (array '" + k + "' is " + t.describe() + ")");
      all[k] = std::move(t);
    }
  }
  return all;
}

RunData load_run_data(const RunConfig& cfg) {
  RunData r;
  r.train = read_sources(cfg, cfg.data.train, "data.train");
  if (!cfg.data.validation.empty()) {
    r.validation = read_sources(cfg, cfg.data.validation, "data.validation");
  } else if (cfg.data.validation_split > 0) {
    const int64_t n = r.train.begin()->second.rank() ? r.train.begin()->second.shape[0] : 0;
    const int64_t held = static_cast<int64_t>(std::llround(n * cfg.data.validation_split));
    if (held < 1 || held >= n)
      fail(where_of(cfg, "data.validation_split"), std::to_string(n) + " rows split this way leave " +
                                                        std::to_string(held) + " for validation; need at least 1 on each side");
    std::vector<int64_t> perm = RandomSampler(n, true, cfg.data.seed).indices(-1);
    std::vector<int64_t> val(perm.begin(), perm.begin() + held), train(perm.begin() + held, perm.end());
    std::sort(val.begin(), val.end());
    std::sort(train.begin(), train.end());  // the file's order, so shuffle: false keeps it
    r.validation = take_rows(r.train, val);
    r.train = take_rows(r.train, train);
  }
  for (const auto& [k, t] : r.train)
    if (t.rank() == 0) fail(where_of(cfg, "data.train"), "array '" + k + "' is a scalar; expected one row per sample");
  r.train_rows = r.train.begin()->second.shape[0];
  return r;
}

std::map<std::string, Tensor> make_feeds(const RunConfig& cfg, const TrainingSession& s, const Dataset& data,
                                         const std::string& what) {
  const Graph& g = s.gradient_graph();
  std::vector<const ValueInfo*> feeds;
  for (const ValueInfo& in : g.inputs)
    if (!g.is_initializer(in.name)) feeds.push_back(&in);
  std::map<std::string, Tensor> out;
  for (const ValueInfo* in : feeds) {
    const bool is_target = in->name == s.target_name();
    std::string key = is_target ? "data.target" : "data.inputs." + in->name;
    std::vector<std::string> arrays;
    if (is_target) arrays = cfg.data.target;
    else if (auto it = cfg.data.inputs.find(in->name); it != cfg.data.inputs.end()) arrays = it->second;
    else {
      key = "data.inputs";
      arrays = {in->name};
      if (!data.count(in->name) && feeds.size() == 2 && data.count("x")) arrays = {"x"};
    }
    std::vector<Tensor> parts;
    for (const std::string& a : arrays) {
      auto it = data.find(a);
      if (it == data.end())
        fail(where_of(cfg, key), "array or column '" + a + "' for " + (is_target ? "the loss target" : "model input '" + in->name + "'") +
                                     " is not in the " + what + " data; it has: " + names(data));
      parts.push_back(it->second);
    }
    Tensor t;
    if (parts.size() == 1) {
      t = parts[0];
    } else {
      // Columns (or column blocks) side by side: [N] and [N, k] arrays become one [N, sum k] array.
      int64_t n = parts[0].shape[0], width = 0;
      for (size_t i = 0; i < parts.size(); ++i) {
        if (parts[i].rank() > 2 || parts[i].shape[0] != n)
          fail(where_of(cfg, key), "'" + arrays[i] + "' is " + parts[i].describe() + "; only [rows] or [rows, k] arrays with the same rows can be combined");
        width += parts[i].rank() == 2 ? parts[i].shape[1] : 1;
      }
      t = Tensor::empty(DType::Float64, {n, width});
      int64_t col = 0;
      for (const Tensor& p : parts) {
        Tensor d = convert(p, DType::Float64);
        const int64_t k = p.rank() == 2 ? p.shape[1] : 1;
        for (int64_t r = 0; r < n; ++r)
          for (int64_t c = 0; c < k; ++c) t.ptr<double>()[r * width + col + c] = d.ptr<double>()[r * k + c];
        col += k;
      }
    }
    const TypeInfo& want = in->type;
    if (want.dtype != DType::Undefined && want.dtype != t.dtype) t = convert(t, want.dtype);
    // The arrays' rows may be flat where the model wants a shape ([N, 64] for [N, 1, 8, 8]).
    if (want.shape && !want.shape->empty()) {
      std::vector<int64_t> shape = {t.shape[0]};
      bool known = true;
      for (size_t i = 1; i < want.shape->size(); ++i) {
        known = known && (*want.shape)[i].known();
        shape.push_back((*want.shape)[i].value);
      }
      const int64_t per_row = t.shape[0] ? t.numel() / t.shape[0] : 0;
      if (known && shape != t.shape) {
        if (numel_of(shape) / std::max<int64_t>(shape[0], 1) != per_row || t.shape[0] == 0)
          fail(where_of(cfg, key), "the " + what + " data gives " + (is_target ? "the target" : "input '" + in->name + "'") +
                                       " as " + t.describe() + " but the " + (is_target ? "loss expects " : "model expects ") +
                                       to_string(*want.shape) + " (rows first)");
        t.shape = shape;
      }
    }
    out[in->name] = std::move(t);
  }
  return out;
}

int64_t planned_steps(const RunConfig& cfg, int64_t train_rows, int world_size) {
  // Each rank's share of an epoch, as DistributedSampler pads (or, with drop_last, drops) it.
  const int64_t rows = cfg.data.drop_last ? train_rows / world_size : (train_rows + world_size - 1) / world_size;
  const int64_t batches = cfg.data.drop_last ? rows / cfg.batch_size : (rows + cfg.batch_size - 1) / cfg.batch_size;
  const int64_t by_epochs = cfg.epochs * batches / std::max(1, cfg.training.optimizer.gradient_accumulation);
  return cfg.max_steps > 0 ? std::min(cfg.max_steps, by_epochs) : by_epochs;
}

void apply_threads(const RunConfig& cfg) {
  if (cfg.threads > 0) omp_set_num_threads(static_cast<int>(cfg.threads));
}

int run_training(const RunConfig& cfg, TrainingSession& session, const RunData& data, const Model* restore_from,
                 const std::string& restore_source, ReplicatedSession* replicas) {
  const std::filesystem::path out = cfg.output_dir();
  std::error_code ec;
  std::filesystem::create_directories(out, ec);
  if (ec) fail(where_of(cfg, "output"), "cannot create " + out.string() + ": " + ec.message());

  // Data-parallel (mpirun): every rank reads its share of each epoch's order, batch_size rows per step.
  // Replicas are one process: they split each batch the loader gives, they do not shard the data.
  const int rank = !replicas && session.communicator() ? session.communicator()->rank() : 0;
  const int world = !replicas && session.communicator() ? session.communicator()->size() : 1;
  const bool main_rank = rank == 0;
  DataLoader train(make_feeds(cfg, session, data.train, "training"), cfg.batch_size,
                   std::make_shared<RandomSampler>(data.train_rows, cfg.data.shuffle, cfg.data.seed, rank, world),
                   cfg.data.drop_last);
  std::unique_ptr<DataLoader> val;
  if (!data.validation.empty())
    val = std::make_unique<DataLoader>(make_feeds(cfg, session, data.validation, "validation"),
                                       cfg.eval_batch_size > 0 ? cfg.eval_batch_size : cfg.batch_size);

  TrainerOptions opts;
  opts.epochs = cfg.epochs;
  opts.max_steps = cfg.max_steps;
  opts.max_skipped_steps = cfg.max_skipped_steps;
  opts.metrics = cfg.metrics;
  opts.prediction = cfg.training.prediction;
  opts.loss_kind = cfg.training.loss.kind;
  opts.interrupt = &g_interrupted;
  opts.metadata = {{kConfigKey, cfg.text}, {kConfigPathKey, std::filesystem::absolute(cfg.source).string()}};
  Trainer trainer = replicas ? Trainer(*replicas, train, opts) : Trainer(session, train, opts);
  if (val) trainer.set_validation(val.get());
  std::vector<std::string> columns;
  if (val)
    for (const std::string& m : cfg.metrics) columns.push_back("val_" + m);
  if (main_rank) trainer.add_callback(std::make_shared<Progress>(cfg.progress));
  trainer.add_callback(std::make_shared<MetricsLog>(out / cfg.log_file, columns, cfg.log_format == "auto" ? "" : cfg.log_format,
                                                    cfg.log_every));
  trainer.add_callback(std::make_shared<CheckpointEvery>(out / "checkpoints", cfg.checkpoint_every, static_cast<int>(cfg.keep_last)));
  if (cfg.patience > 0)
    trainer.add_callback(std::make_shared<EarlyStopping>(cfg.early_metric, cfg.patience, cfg.min_delta, cfg.early_mode));
  if (auto hook = test_signal_hook(rank)) trainer.add_callback(hook);
  if (restore_from) trainer.restore(*restore_from, restore_source);

  // Rank 0 speaks for the job; the others print only errors.
  if (!main_rank && !std::freopen("/dev/null", "w", stdout)) fail("stdout", "cannot silence rank " + std::to_string(rank));
  if (world > 1)
    std::printf("data-parallel: %d ranks (%s), batch %lld per rank (%lld per step)\n", world,
                session.communicator()->backend().c_str(), static_cast<long long>(cfg.batch_size),
                static_cast<long long>(cfg.batch_size) * world);
  if (replicas)
    std::printf("replicas: %d one-thread replicas, each on a part of every batch of %lld\n", replicas->replicas(),
                static_cast<long long>(cfg.batch_size));
  std::printf("training %s on %s: %zu trainable tensors, %lld training rows%s, batch %lld, %s lr %g, %lld epochs\n",
              cfg.model.c_str(), cfg.device.c_str(), session.trainable().size(), static_cast<long long>(data.train_rows),
              val ? (", " + std::to_string(val->size()) + " validation rows").c_str() : "",
              static_cast<long long>(cfg.batch_size), cfg.training.optimizer.kind.c_str(), session.learning_rate(),
              static_cast<long long>(cfg.epochs));
  if (restore_from)
    std::printf("resuming at epoch %lld, batch %lld, step %lld\n", static_cast<long long>(trainer.epoch() + 1),
                static_cast<long long>(trainer.batch()), static_cast<long long>(session.step()));
  std::fflush(stdout);

  g_interrupted = false;
  auto previous = std::signal(SIGINT, on_sigint);
  TrainResult r = trainer.fit();
  std::signal(SIGINT, previous);

  const std::filesystem::path model_path = out / "model.onnx";
  session.export_inference(model_path);
  std::printf("stopped: %s after %lld steps (%lld epochs complete)\n", r.reason.c_str(), static_cast<long long>(r.steps),
              static_cast<long long>(r.epochs));
  if (cfg.training.on_non_finite == "skip" || r.skipped_steps > 0)
    std::printf("skipped steps: %lld (non-finite loss or gradient; train.on_non_finite: skip)\n",
                static_cast<long long>(r.skipped_steps));
  std::printf("checkpoint: %s\n", r.checkpoint.string().c_str());
  std::printf("metrics log: %s\n", (out / cfg.log_file).string().c_str());
  std::printf("trained model: %s\n", model_path.string().c_str());
  for (const auto& [k, v] : r.metrics) std::printf("validation %s: %.6g\n", k.substr(4).c_str(), v);
  if (cfg.training.profile)
    std::printf("profile of train_step (train.profile): %s", format_profile(session.profile()).c_str());
  if (r.reason == "interrupted") {
    std::printf("interrupted; continue with: onnxtrain resume %s\n", r.checkpoint.string().c_str());
    return 130;
  }
  if (r.reason == "max_skipped_steps") {
    const std::string& last = session.last_skip_reason();
    std::fflush(stdout);
    std::fprintf(stderr, "onnxtrain: %s: %lld steps were skipped, more than the limit of %lld, so the run stopped%s%s\n",
                 where_of(cfg, "train.max_skipped_steps").c_str(), static_cast<long long>(r.skipped_steps),
                 static_cast<long long>(cfg.max_skipped_steps), last.empty() ? "" : "; the latest: ", last.c_str());
    return 1;
  }
  if (r.reason == "diverged") {
    std::fprintf(stderr, "onnxtrain: the loss is not finite (diverged); lower optimizer.learning_rate or clip gradients\n");
    return 1;
  }
  return 0;
}

}  // namespace onnxtrain::cli
