#include "cli/setup.h"

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "distributed/mpi.h"
#include "training/replicas.h"
#include "graph/error.h"
#include "graph/model_io.h"
#include "optimizers/optimizer.h"

namespace onnxtrain::cli {

std::string where_of(const RunConfig& cfg, const std::string& key) {
  for (std::string k = key; !k.empty(); k.resize(k.rfind('.') == std::string::npos ? 0 : k.rfind('.')))
    if (auto it = cfg.locations.find(k); it != cfg.locations.end()) return it->second + ": " + key;
  return cfg.source.string() + ": " + key;
}

namespace {

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

std::map<std::string, Tensor> make_feeds(const RunConfig& cfg, const Session& s, const Dataset& data,
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

int64_t planned_steps(const RunConfig& cfg, int64_t train_rows, int world_size) {
  // Each rank's share of an epoch, as DistributedSampler pads (or, with drop_last, drops) it.
  const int64_t rows = cfg.data.drop_last ? train_rows / world_size : (train_rows + world_size - 1) / world_size;
  const int64_t batches = cfg.data.drop_last ? rows / cfg.batch_size : (rows + cfg.batch_size - 1) / cfg.batch_size;
  const int64_t by_epochs = cfg.epochs * batches / std::max(1, cfg.training.optimizer.gradient_accumulation);
  return cfg.max_steps > 0 ? std::min(cfg.max_steps, by_epochs) : by_epochs;
}

namespace {

std::shared_ptr<Communicator> g_world;

// Before any session is built: its kernels size their thread teams from OpenMP's setting.
void apply_threads(const RunConfig& cfg) {
  if (cfg.threads > 0) omp_set_num_threads(static_cast<int>(cfg.threads));
}

// `comm`: a replica's (replicas) or the job's (MPI ranks, or this process alone).
TrainingSession session_for(const RunConfig& cfg, Model model, int64_t train_rows, std::shared_ptr<Communicator> comm) {
  TrainingConfig tc = cfg.training;
  // With adapters the session trains them; `trainable` then names extra weights only (a fresh head).
  if (!tc.adapter.active() || !cfg.trainable.empty()) tc.trainable = select_trainable(model, cfg);
  tc.parallel.communicator = std::move(comm);
  if ((tc.schedule.kind == "cosine" || tc.schedule.kind == "linear") && tc.schedule.total_steps == 0)
    tc.schedule.total_steps = std::max<int64_t>(1, planned_steps(cfg, train_rows, world()->size()));
  return TrainingSession(std::move(model), std::move(tc));
}

// `replicas:` copies made by `make`, one per replica. Replicas split one process's batches; MPI ranks each run
// their own process. Both at once is not supported.
std::unique_ptr<Session> replicated(const RunConfig& cfg, const ReplicatedSession::Factory& make) {
  if (world()->size() > 1)
    fail(cfg.source.string() + ": replicas", std::to_string(cfg.replicas) + " replicas cannot be combined with " +
                                                 std::to_string(world()->size()) + " MPI ranks; use one or the other");
  if (!replicas_run_on(cfg.device))
    fail(cfg.source.string() + ": replicas", "replicas run on the CPU; device is '" + cfg.device + "'");
  return std::make_unique<ReplicatedSession>(static_cast<int>(cfg.replicas), make);
}

}  // namespace

const std::shared_ptr<Communicator>& world() {
  if (!g_world) g_world = communicator_from_environment();
  return g_world;
}

Communicator* world_if_made() { return g_world.get(); }

const std::string* metadata_value(const Model& m, const std::string& key) {
  for (const auto& [k, v] : m.metadata)
    if (k == key) return &v;
  return nullptr;
}

std::unique_ptr<Session> build_session(const RunConfig& cfg, const RunData& data) {
  apply_threads(cfg);
  Model model = load_model(cfg.resolve(cfg.model));
  if (cfg.replicas > 1)
    return replicated(cfg, [&](const DataParallelSpec& spec) {
      return session_for(cfg, model, data.train_rows, spec.communicator);
    });
  return std::make_unique<TrainingSession>(session_for(cfg, std::move(model), data.train_rows, world()));
}

std::unique_ptr<Session> restore_session(const RunConfig& cfg, const Model& checkpoint, const std::string& path) {
  apply_threads(cfg);
  if (cfg.replicas > 1)
    return replicated(cfg, [&](const DataParallelSpec& spec) {
      return TrainingSession::from_checkpoint(checkpoint, path, spec, cfg.device);
    });
  DataParallelSpec spec = cfg.training.parallel;  // the distributed.* keys
  spec.communicator = world();
  return std::make_unique<TrainingSession>(TrainingSession::from_checkpoint(checkpoint, path, spec, cfg.device));
}

TrainingSession evaluation_session(const RunConfig& cfg, const std::string& model_path) {
  apply_threads(cfg);
  Model m = load_model(model_path);
  if (metadata_value(m, "onnxtrain.format"))
    return TrainingSession::from_checkpoint(m, model_path, {}, cfg.device);
  return session_for(cfg, std::move(m), 1, world());
}

}  // namespace onnxtrain::cli
