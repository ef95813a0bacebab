#include "training/trainer.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <regex>
#include <set>

#include "executor/transfer.h"
#include "graph/error.h"

namespace onnxtrain {

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

const std::string kTrainerKey = "onnxtrain.trainer.";

// Shortest text that reads back to the same double, so a resumed run continues with exactly the same sums.
std::string exact(double v) {
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

const std::string* find_key(const Metadata& m, const std::string& k) {
  for (const auto& [key, v] : m)
    if (key == k) return &v;
  return nullptr;
}

template <class T> T read_key(const Metadata& m, const std::string& k, const std::string& source) {
  const std::string* s = find_key(m, k);
  if (!s) fail(source, "metadata key '" + k + "' is missing (not a checkpoint written by the Trainer)");
  T v{};
  auto r = std::from_chars(s->data(), s->data() + s->size(), v);
  if (r.ec != std::errc() || r.ptr != s->data() + s->size())
    fail(source, "metadata key '" + k + "': expected a number, got '" + *s + "'");
  return v;
}

// The nodes the outputs depend on, in order; initializers nobody reads are dropped too.
Graph prune_to(Graph g, const std::vector<std::string>& outputs) {
  std::set<std::string> needed(outputs.begin(), outputs.end());
  std::vector<bool> keep(g.nodes.size());
  for (size_t i = g.nodes.size(); i-- > 0;) {
    const Node& n = g.nodes[i];
    keep[i] = std::any_of(n.outputs.begin(), n.outputs.end(), [&](const std::string& o) { return needed.count(o); });
    if (keep[i]) needed.insert(n.inputs.begin(), n.inputs.end());
  }
  std::vector<Node> nodes;
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (keep[i]) nodes.push_back(std::move(g.nodes[i]));
  g.nodes = std::move(nodes);
  std::erase_if(g.initializers, [&](const auto& kv) { return !needed.count(kv.first); });
  std::erase_if(g.inputs, [&](const ValueInfo& v) { return !needed.count(v.name); });
  std::vector<ValueInfo> outs;
  for (const std::string& o : outputs) outs.push_back({o, g.type_of(o) ? *g.type_of(o) : TypeInfo{}});
  g.outputs = std::move(outs);
  return g;
}

// Per-metric running sums over a validation pass.
struct MetricSums {
  double loss = 0, sq = 0, abs = 0, correct = 0;
  int64_t rows = 0, elems = 0, predictions = 0;
  std::vector<double> y, y2, res;  // per output column, for r2
  int64_t r2_rows = 0;
};

}  // namespace

const std::vector<std::string>& metric_kinds() {
  static const std::vector<std::string> k = {"loss", "accuracy", "mse", "mae", "r2"};
  return k;
}

bool metric_higher_is_better(const std::string& metric) {
  auto ends = [&](const std::string& s) { return metric.size() >= s.size() && metric.substr(metric.size() - s.size()) == s; };
  return ends("accuracy") || ends("r2");
}

Evaluator::Evaluator(const Session& session, std::string prediction, std::string loss_kind)
    : store_(std::make_shared<TensorStore>()), target_(session.target_name()), loss_kind_(std::move(loss_kind)) {
  const Model m = session.export_inference();
  if (prediction.empty()) prediction = m.graph.outputs.at(0).name;
  const Graph& gg = session.gradient_graph();
  Graph g = prune_to(gg, {gg.outputs.at(0).name, prediction});
  // The session's graphs leave large weights hollow (its store holds them); this executor has a store of its own.
  for (auto& [name, t] : g.initializers)
    if (is_hollow(t)) t = m.graph.initializers.at(name);
  auto opsets = m.opset_imports;
  opsets.emplace("onnxtrain", 1);
  ExecutorOptions eo;
  eo.device = session.device();  // validation runs where training does; only the metrics' inputs come back
  eo.variables.insert(session.trainable().begin(), session.trainable().end());
  exec_ = std::make_unique<Executor>(std::move(g), opsets, store_, eo);
}

std::map<std::string, double> Evaluator::evaluate(const Session& session, DataLoader& data,
                                                  const std::vector<std::string>& metrics) {
  for (const std::string& k : metrics)
    if (std::find(metric_kinds().begin(), metric_kinds().end(), k) == metric_kinds().end()) {
      std::string all;
      for (const std::string& v : metric_kinds()) all += (all.empty() ? "" : ", ") + v;
      fail("metric '" + k + "'", "unknown; valid metrics: " + all);
    }
  // Device to device: the session's live weights into this executor's copy.
  for (const std::string& name : session.trainable())
    copy_into(store_->at(name), session.weight_value(name), "weight '" + name + "'");
  auto wants = [&](const char* k) { return std::find(metrics.begin(), metrics.end(), k) != metrics.end(); };
  const bool logits = loss_kind_ == "bce_with_logits";
  MetricSums m;
  data.start_epoch(0);
  for (int64_t b = 0; b < data.batches_per_epoch(); ++b) {
    const Feeds& f = data.batch(b);
    std::vector<Tensor> out = exec_->run(f);
    const int64_t n = out[1].rank() ? out[1].shape[0] : 1;
    const Tensor& loss = out[0];
    m.loss += read_number(loss, "validation loss") * n;  // a host tensor: run() returned copies
    m.rows += n;
    if (!wants("accuracy") && !wants("mse") && !wants("mae") && !wants("r2")) continue;
    const Tensor p = convert(out[1], DType::Float64);
    const Tensor t = convert(f.at(target_), DType::Float64);
    const double* pp = p.ptr<double>();
    const double* tp = t.ptr<double>();
    const int64_t pn = p.numel(), tn = t.numel();
    if (wants("accuracy")) {
      const int64_t classes = p.rank() >= 2 ? p.shape[1] : 1;
      if (classes == 1) {
        if (tn != pn) fail("metric 'accuracy'", "prediction " + p.describe() + " and target " + t.describe() + " differ in size");
        for (int64_t i = 0; i < pn; ++i) m.correct += ((pp[i] > (logits ? 0.0 : 0.5)) == (tp[i] > 0.5));
        m.predictions += pn;
      } else {
        const int64_t inner = pn / (n * classes);
        const bool one_hot = tn == pn;
        if (!one_hot && tn != n * inner)
          fail("metric 'accuracy'", "target " + t.describe() + " is neither class indices nor one-hot for prediction " + p.describe());
        auto argmax = [&](const double* v, int64_t o, int64_t i) {
          int64_t best = 0;
          for (int64_t c = 1; c < classes; ++c)
            if (v[(o * classes + c) * inner + i] > v[(o * classes + best) * inner + i]) best = c;
          return best;
        };
        for (int64_t o = 0; o < n; ++o)
          for (int64_t i = 0; i < inner; ++i) {
            const int64_t want = one_hot ? argmax(tp, o, i) : static_cast<int64_t>(tp[o * inner + i]);
            m.correct += argmax(pp, o, i) == want;
          }
        m.predictions += n * inner;
      }
    }
    if (wants("mse") || wants("mae") || wants("r2")) {
      if (tn != pn) fail("metric 'mse/mae/r2'", "prediction " + p.describe() + " and target " + t.describe() + " differ in size");
      const int64_t cols = pn / n;
      if (m.y.empty()) m.y.assign(cols, 0), m.y2.assign(cols, 0), m.res.assign(cols, 0);
      for (int64_t i = 0; i < pn; ++i) {
        const double d = pp[i] - tp[i];
        m.sq += d * d;
        m.abs += std::abs(d);
        m.y[i % cols] += tp[i];
        m.y2[i % cols] += tp[i] * tp[i];
        m.res[i % cols] += d * d;
      }
      m.elems += pn;
      m.r2_rows += n;
    }
  }
  std::map<std::string, double> r;
  for (const std::string& k : metrics) {
    if (k == "loss") r[k] = m.loss / m.rows;
    else if (k == "accuracy") r[k] = m.correct / m.predictions;
    else if (k == "mse") r[k] = m.sq / m.elems;
    else if (k == "mae") r[k] = m.abs / m.elems;
    else if (k == "r2") {
      // scikit-learn's r2_score: per output 1 - SS_res / SS_tot (1 for a perfect fit of a constant target,
      // 0 for an imperfect one), then the plain mean over outputs.
      double sum = 0;
      for (size_t c = 0; c < m.y.size(); ++c) {
        const double tot = m.y2[c] - m.y[c] * m.y[c] / m.r2_rows;
        sum += tot > 0 ? 1 - m.res[c] / tot : (m.res[c] == 0 ? 1.0 : 0.0);
      }
      r[k] = sum / m.y.size();
    }
  }
  return r;
}

Trainer::Trainer(Session& session, DataLoader& train, TrainerOptions options)
    : session_(session), train_(train), options_(std::move(options)) {
  if (options_.epochs < 1) fail("epochs", "expected an integer >= 1, got " + std::to_string(options_.epochs));
  if (options_.max_steps < 0) fail("max_steps", "expected an integer >= 0, got " + std::to_string(options_.max_steps));
  if (options_.max_skipped_steps < 0)
    fail("max_skipped_steps", "expected an integer >= 0, got " + std::to_string(options_.max_skipped_steps));
}

namespace {

class LambdaCallback : public Callback {
 public:
  std::function<void(const StepInfo&)> step;
  std::function<void(const EpochInfo&)> epoch;
  void on_step(Trainer&, const StepInfo& s) override {
    if (step) step(s);
  }
  void on_epoch_end(Trainer&, const EpochInfo& e) override {
    if (epoch) epoch(e);
  }
};

}  // namespace

void Trainer::on_step(std::function<void(const StepInfo&)> f) {
  auto cb = std::make_shared<LambdaCallback>();
  cb->step = std::move(f);
  add_callback(cb);
}

void Trainer::on_epoch_end(std::function<void(const EpochInfo&)> f) {
  auto cb = std::make_shared<LambdaCallback>();
  cb->epoch = std::move(f);
  add_callback(cb);
}

void Trainer::request_stop(std::string reason) {
  if (!stop_) stop_ = std::move(reason);
}

std::map<std::string, double> Trainer::validate() {
  if (!validation_ || options_.metrics.empty()) return {};
  if (!evaluator_) evaluator_ = std::make_unique<Evaluator>(session_, options_.prediction, options_.loss_kind);
  std::map<std::string, double> r;
  for (const auto& [k, v] : evaluator_->evaluate(session_, *validation_, options_.metrics)) r["val_" + k] = v;
  return r;
}

TrainResult Trainer::fit() {
  stop_.reset();
  for (auto& cb : callbacks_) cb->on_train_begin(*this);
  const int64_t nb = train_.batches_per_epoch();
  const std::shared_ptr<Communicator>& comm = session_.communicator();
  const bool parallel = world_size() > 1;
  auto check_stop = [&] {
    if (!stop_ && options_.interrupt && options_.interrupt->load()) stop_ = "interrupted";
    // Every other reason follows from state the ranks share; an interrupt may reach one rank only, and the
    // others must stop with it or they would wait in the next step's allreduce.
    if (parallel && options_.interrupt && comm->allreduce(stop_ ? 1.0 : 0.0, ReduceOp::Sum) > 0 && !stop_)
      stop_ = "interrupted";
    if (!stop_ && options_.max_steps > 0 && session_.step() >= options_.max_steps) stop_ = "max_steps";
    if (!stop_ && options_.max_skipped_steps > 0 && session_.skipped_steps() > options_.max_skipped_steps)
      stop_ = "max_skipped_steps";
    return stop_.has_value();
  };
  while (epoch_ < options_.epochs && !check_stop()) {
    train_.start_epoch(epoch_);
    const auto epoch_start = Clock::now();
    while (batch_ < nb && !check_stop()) {
      const auto t0 = Clock::now();
      const Feeds& f = train_.batch(batch_);
      const int64_t before = session_.step();
      const int64_t skipped_before = session_.skipped_steps();
      const float loss = session_.train_step(f);
      const bool skipped = session_.skipped_steps() != skipped_before;
      ++batch_;
      if (skipped) ++epoch_skipped_;
      else epoch_loss_ += loss;
      StepInfo s;
      s.epoch = epoch_;
      s.batch = batch_ - 1;
      s.batches_per_epoch = nb;
      s.step = session_.step();
      s.epochs = options_.epochs;
      s.max_steps = options_.max_steps;
      s.samples = f.begin()->second.shape[0] * world_size();  // the sampler gives every rank as many rows
      s.updated = s.step != before;
      s.skipped = skipped;
      s.loss = loss;
      s.learning_rate = session_.learning_rate();
      s.seconds = since(t0);
      for (auto& cb : callbacks_) cb->on_step(*this, s);
      if (!skipped && !std::isfinite(loss)) request_stop("diverged");
    }
    if (batch_ < nb) break;  // stopped inside the epoch
    EpochInfo e;
    e.epoch = epoch_;
    e.skipped = epoch_skipped_;
    e.train_loss = nb > epoch_skipped_ ? epoch_loss_ / double(nb - epoch_skipped_) : std::nan("");
    e.metrics = validate();
    e.step = session_.step();
    e.seconds = since(epoch_start);
    session_.end_epoch(e.train_loss);
    last_metrics_ = e.metrics;
    // The position moves before the callbacks run, so a checkpoint taken there resumes in the next epoch.
    ++epoch_;
    batch_ = 0;
    epoch_loss_ = 0;
    epoch_skipped_ = 0;
    for (auto& cb : callbacks_) cb->on_epoch_end(*this, e);
    if (session_.stop_requested()) request_stop("schedule");
  }
  TrainResult r;
  r.reason = stop_.value_or("finished");
  if (r.reason == "max_steps" && batch_ != 0) last_metrics_ = validate();  // metrics of the final weights
  r.steps = session_.step();
  r.skipped_steps = session_.skipped_steps();
  r.epochs = epoch_;
  r.metrics = last_metrics_;
  for (auto& cb : callbacks_) cb->on_train_end(*this, r);
  return r;
}

Model Trainer::checkpoint() const {
  Model m = session_.checkpoint();
  add_checkpoint_metadata(m);
  return m;
}

void Trainer::add_checkpoint_metadata(Model& m) const {
  auto put = [&](const std::string& k, std::string v) { m.metadata.emplace_back(kTrainerKey + k, std::move(v)); };
  put("epoch", std::to_string(epoch_));
  put("batch", std::to_string(batch_));
  put("epoch_loss", exact(epoch_loss_));
  put("epoch_skipped", std::to_string(epoch_skipped_));
  put("seed", std::to_string(train_.sampler().seed()));
  put("batch_size", std::to_string(train_.batch_size()));
  put("samples", std::to_string(train_.size()));
  put("world_size", std::to_string(world_size()));
  for (const auto& cb : callbacks_) cb->save_state(m.metadata);
  for (const auto& kv : options_.metadata) m.metadata.push_back(kv);
}

void Trainer::save_checkpoint(const std::filesystem::path& path) const {
  if (rank() != 0) return;  // the ranks hold the same state
  // Streamed from the session's store, without a copy of the weights and state (docs/checkpoint.md).
  Model m = session_.checkpoint_shell();
  add_checkpoint_metadata(m);
  save_model_large(m, path, {}, session_.stored_bytes());
}


namespace {

// Ranks of the run a checkpoint comes from (checkpoints from before data-parallel Trainers have none: 1).
int64_t checkpoint_world(const Metadata& m, const std::string& source) {
  if (!find_key(m, kTrainerKey + "world_size")) return 1;
  const int64_t w = read_key<int64_t>(m, kTrainerKey + "world_size", source);
  if (w < 1) fail(source, "metadata key '" + kTrainerKey + "world_size': expected an integer >= 1");
  return w;
}

}  // namespace

int64_t resumed_batch_size(const Model& ckpt, int world_size, const std::string& source) {
  const int64_t was = checkpoint_world(ckpt.metadata, source);
  const int64_t global = read_key<int64_t>(ckpt.metadata, kTrainerKey + "batch_size", source) * was;
  if (global % world_size != 0)
    fail(source, "the checkpoint was trained with a global batch of " + std::to_string(global) + " (" + std::to_string(was) +
                     " rank(s)); it cannot be split evenly over " + std::to_string(world_size) + " ranks");
  return global / world_size;
}

void Trainer::restore(const Model& ckpt, const std::string& source) {
  const Metadata& m = ckpt.metadata;
  // The data order is a function of (seed, epoch, batch size, dataset size): any change breaks "same order".
  auto same = [&](const char* key, uint64_t now) {
    const uint64_t was = read_key<uint64_t>(m, kTrainerKey + key, source);
    if (was != now)
      fail(source, std::string("the checkpoint was trained with ") + key + " " + std::to_string(was) + ", this run has " +
                       std::to_string(now) + "; resuming needs the same data and order");
  };
  same("seed", train_.sampler().seed());
  // The global batch decides the steps; how many ranks share it does not (resumed_batch_size).
  const uint64_t global = read_key<uint64_t>(m, kTrainerKey + "batch_size", source) * checkpoint_world(m, source);
  const uint64_t now = static_cast<uint64_t>(train_.batch_size()) * world_size();
  if (global != now)
    fail(source, "the checkpoint was trained with a global batch (batch size x ranks) of " + std::to_string(global) +
                     ", this run has " + std::to_string(now) + "; resuming needs the same data and order");
  same("samples", static_cast<uint64_t>(train_.size()));
  epoch_ = read_key<int64_t>(m, kTrainerKey + "epoch", source);
  batch_ = read_key<int64_t>(m, kTrainerKey + "batch", source);
  epoch_loss_ = read_key<double>(m, kTrainerKey + "epoch_loss", source);
  // Absent in checkpoints from before the skip policy was counted: nothing was skipped then.
  epoch_skipped_ = find_key(m, kTrainerKey + "epoch_skipped") ? read_key<int64_t>(m, kTrainerKey + "epoch_skipped", source) : 0;
  if (epoch_ < 0 || batch_ < 0 || batch_ > train_.batches_per_epoch())
    fail(source, "trainer position epoch " + std::to_string(epoch_) + " batch " + std::to_string(batch_) +
                     " does not fit this data (" + std::to_string(train_.batches_per_epoch()) + " batches per epoch)");
  if (epoch_skipped_ < 0 || epoch_skipped_ > batch_)
    fail(source, "metadata key '" + kTrainerKey + "epoch_skipped': expected 0 to " + std::to_string(batch_) +
                     " (the batches of this epoch so far), got " + std::to_string(epoch_skipped_));
  for (auto& cb : callbacks_) cb->load_state(m, source);
}

CheckpointEvery::CheckpointEvery(std::filesystem::path dir, int64_t every, int keep_last)
    : dir_(std::move(dir)), every_(every), keep_last_(keep_last) {
  if (every < 0) fail("checkpoint.every", "expected an integer >= 0, got " + std::to_string(every));
  if (keep_last < 0) fail("checkpoint.keep_last", "expected an integer >= 0, got " + std::to_string(keep_last));
}

void CheckpointEvery::on_step(Trainer& t, const StepInfo& s) {
  if (every_ > 0 && s.updated && s.step % every_ == 0) save(t, s.step);
}

void CheckpointEvery::on_train_end(Trainer& t, TrainResult& r) {
  save(t, t.session().step());
  r.checkpoint = last_;
}

void CheckpointEvery::save(Trainer& t, int64_t step) {
  last_ = dir_ / ("step-" + std::to_string(step) + ".onnx");
  if (t.rank() != 0) return;  // rank 0 writes; the others hold the same state
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec) fail(dir_.string(), "cannot create the checkpoint folder: " + ec.message());
  t.save_checkpoint(last_);
  if (keep_last_ == 0) return;
  // Older checkpoints beyond keep_last go, with their external-data side files ("<name>.<nonce>.data").
  static const std::regex pattern(R"(step-(\d+)\.onnx)");
  std::vector<std::pair<int64_t, std::string>> found;
  for (const auto& e : std::filesystem::directory_iterator(dir_)) {
    std::smatch mt;
    const std::string name = e.path().filename().string();
    if (std::regex_match(name, mt, pattern)) found.emplace_back(std::stoll(mt[1]), name);
  }
  std::sort(found.rbegin(), found.rend());
  for (size_t i = static_cast<size_t>(keep_last_); i < found.size(); ++i) {
    std::filesystem::remove(dir_ / found[i].second, ec);
    for (const auto& e : std::filesystem::directory_iterator(dir_)) {
      const std::string name = e.path().filename().string();
      if (name.rfind(found[i].second + ".", 0) == 0 && name.size() > 5 && name.substr(name.size() - 5) == ".data")
        std::filesystem::remove(e.path(), ec);
    }
  }
}

EarlyStopping::EarlyStopping(std::string metric, int64_t patience, double min_delta, std::string mode)
    : metric_(std::move(metric)), patience_(patience), min_delta_(min_delta) {
  if (patience < 1) fail("early_stopping.patience", "expected an integer >= 1, got " + std::to_string(patience));
  if (!(min_delta >= 0)) fail("early_stopping.min_delta", "expected a number >= 0");
  if (mode == "auto") maximize_ = metric_higher_is_better(metric_);
  else if (mode == "min" || mode == "max") maximize_ = mode == "max";
  else fail("early_stopping.mode", "expected one of: auto, min, max; got '" + mode + "'");
}

void EarlyStopping::on_epoch_end(Trainer& t, const EpochInfo& e) {
  double v;
  if (metric_ == "train_loss") v = e.train_loss;
  else if (auto it = e.metrics.find(metric_); it != e.metrics.end()) v = it->second;
  else {
    std::string all = "train_loss";
    for (const auto& [k, x] : e.metrics) all += ", " + k;
    fail("early_stopping.metric", "'" + metric_ + "' is not computed; available: " + all);
  }
  const bool better = !best_ || (maximize_ ? v > *best_ + min_delta_ : v < *best_ - min_delta_);
  if (better) {
    best_ = v;
    bad_epochs_ = 0;
  } else if (++bad_epochs_ >= patience_) {
    t.request_stop("early_stopping");
  }
}

void EarlyStopping::save_state(Metadata& m) const {
  m.emplace_back(kTrainerKey + "early_stopping.best", best_ ? exact(*best_) : "");
  m.emplace_back(kTrainerKey + "early_stopping.bad_epochs", std::to_string(bad_epochs_));
}

void EarlyStopping::load_state(const Metadata& m, const std::string& source) {
  const std::string* b = find_key(m, kTrainerKey + "early_stopping.best");
  if (!b) return;  // the checkpoint's run had no early stopping: start counting now
  best_ = b->empty() ? std::nullopt : std::optional<double>(read_key<double>(m, kTrainerKey + "early_stopping.best", source));
  bad_epochs_ = read_key<int64_t>(m, kTrainerKey + "early_stopping.bad_epochs", source);
}

MetricsLog::MetricsLog(std::filesystem::path path, std::vector<std::string> epoch_metrics, std::string format,
                       int64_t every)
    : path_(std::move(path)), columns_(std::move(epoch_metrics)), every_(every) {
  if (format.empty()) {
    const std::string ext = path_.extension().string();
    format = ext == ".jsonl" || ext == ".json" ? "jsonl" : "csv";
  }
  if (format != "csv" && format != "jsonl") fail("log.format", "expected csv or jsonl, got '" + format + "'");
  if (every < 1) fail("log.every", "expected an integer >= 1, got " + std::to_string(every));
  json_ = format == "jsonl";
}

void MetricsLog::on_train_begin(Trainer& t) {
  // Data-parallel ranks share the logged values (the loss is reduced), so rank 0 writes for all.
  writes_ = t.rank() == 0;
  if (!writes_) return;
  std::error_code ec;
  const bool fresh = !std::filesystem::exists(path_) || std::filesystem::file_size(path_, ec) == 0;
  if (path_.has_parent_path()) std::filesystem::create_directories(path_.parent_path(), ec);
  if (fresh && !json_) {
    std::FILE* f = std::fopen(path_.c_str(), "w");
    if (!f) fail(path_.string(), "cannot write the metrics file");
    std::fprintf(f, "event,epoch,step,loss,lr,samples_per_s");
    for (const std::string& c : columns_) std::fprintf(f, ",%s", c.c_str());
    std::fprintf(f, "\n");
    std::fclose(f);
  }
}

void MetricsLog::on_step(Trainer&, const StepInfo& s) {
  if (!writes_) return;
  const int64_t n = s.epoch * s.batches_per_epoch + s.batch + 1;
  if (n % every_ == 0) row("step", s.epoch + 1, s.step, s.loss, s.learning_rate, s.samples / std::max(s.seconds, 1e-9), {});
}

void MetricsLog::on_epoch_end(Trainer& t, const EpochInfo& e) {
  if (!writes_) return;
  row("epoch", e.epoch + 1, e.step, e.train_loss, t.session().learning_rate(), NAN, e.metrics);
}

void MetricsLog::row(const std::string& event, int64_t epoch, int64_t step, double loss, double lr, double rate,
                     const std::map<std::string, double>& metrics) {
  // Appending one line per event keeps the file complete up to the last event even if the process dies.
  std::FILE* f = std::fopen(path_.c_str(), "a");
  if (!f) fail(path_.string(), "cannot append to the metrics file");
  auto num = [](double v) { return std::isfinite(v) ? exact(v) : std::string(); };
  if (json_) {
    std::string s = "{\"event\": \"" + event + "\", \"epoch\": " + std::to_string(epoch) +
                    ", \"step\": " + std::to_string(step) + ", \"loss\": " + (std::isfinite(loss) ? exact(loss) : "null") +
                    ", \"lr\": " + exact(lr);
    if (std::isfinite(rate)) s += ", \"samples_per_s\": " + exact(rate);
    for (const auto& [k, v] : metrics) s += ", \"" + k + "\": " + (std::isfinite(v) ? exact(v) : "null");
    std::fprintf(f, "%s}\n", s.c_str());
  } else {
    std::fprintf(f, "%s,%lld,%lld,%s,%s,%s", event.c_str(), static_cast<long long>(epoch), static_cast<long long>(step),
                 num(loss).c_str(), num(lr).c_str(), num(rate).c_str());
    for (const std::string& c : columns_) {
      auto it = metrics.find(c);
      std::fprintf(f, ",%s", it == metrics.end() ? "" : num(it->second).c_str());
    }
    std::fprintf(f, "\n");
  }
  std::fclose(f);
}

}  // namespace onnxtrain
