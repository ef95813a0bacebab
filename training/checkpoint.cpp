#include "training/checkpoint.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <set>
#include <variant>
#include <random>
#include <climits>
#include <cerrno>
#include <fcntl.h>
#include <unistd.h>

#include "executor/transfer.h"
#include "graph/proto.h"

#include "gradients/builder.h"
#include "gradients/fused.h"
#include "graph/builder.h"
#include "graph/expr.h"
#include "graph/shape_inference.h"
#include "graph/validate.h"
#include "graph/error.h"
#include "graph/model_io.h"
#include "training/checksums.h"
#include "training/config_schema.h"

namespace onnxtrain {

namespace fs = std::filesystem;

namespace {

// One table (training/config_schema.h) drives both directions, so the writer and the reader cannot drift
// apart. The visitor sees (metadata key, field&) for every option the schema stores in checkpoints.
template <class V, class T> void visit_field(V& v, const std::string& key, T& field) { v(key, field); }

// optimizer.groups: the group count, then each group's fields under "optimizer.group.<i>.".
template <class V> void visit_field(V& v, const std::string& key, std::vector<ParamGroup>& groups) {
  int64_t ngroups = static_cast<int64_t>(groups.size());
  v(key, ngroups);
  if (ngroups < 0 || ngroups > 100000) v.bad(key, "expected a group count in [0, 100000]");
  groups.resize(static_cast<size_t>(ngroups));
  for (size_t i = 0; i < groups.size(); ++i) {
    const std::string k = "optimizer.group." + std::to_string(i) + ".";
    v(k + "match", groups[i].match);
    v(k + "learning_rate", groups[i].learning_rate);
    v(k + "weight_decay", groups[i].weight_decay);
  }
}

template <class V> void visit_config(TrainingConfig& c, V& v) {
  for (const ConfigOption& o : config_options())
    if (o.applies_to(kWayCheckpoint))
      std::visit([&](auto* field) { visit_field(v, o.checkpoint_key(), *field); }, o.field(c));
}

// Shortest text that reads back to the same double (std::to_chars round-trips exactly).
std::string num(double x) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, x);
  return std::string(buf, r.ptr);
}

struct Writer {
  Metadata out;
  void put(const std::string& k, std::string v) { out.emplace_back(kCheckpointKeyPrefix + k, std::move(v)); }
  void operator()(const std::string& k, std::string& x) { put(k, x); }
  void operator()(const std::string& k, double& x) { put(k, num(x)); }
  void operator()(const std::string& k, int64_t& x) { put(k, std::to_string(x)); }
  void operator()(const std::string& k, int& x) { put(k, std::to_string(x)); }
  void operator()(const std::string& k, size_t& x) { put(k, std::to_string(x)); }
  void operator()(const std::string& k, bool& x) { put(k, x ? "true" : "false"); }
  // Unset optionals are written as "" so the reader restores "unset", not the default.
  void operator()(const std::string& k, std::optional<double>& x) { put(k, x ? num(*x) : ""); }
  void operator()(const std::string& k, std::optional<int64_t>& x) { put(k, x ? std::to_string(*x) : ""); }
  void operator()(const std::string& k, std::vector<double>& x) {
    std::string s;
    for (size_t i = 0; i < x.size(); ++i) s += (i ? "," : "") + num(x[i]);
    put(k, s);
  }
  // Names (weights, glob patterns) may hold commas; a newline cannot appear in an ONNX value name we accept.
  void operator()(const std::string& k, std::vector<std::string>& x) {
    std::string s;
    for (size_t i = 0; i < x.size(); ++i) s += (i ? "\n" : "") + x[i];
    put(k, s);
  }
  [[noreturn]] void bad(const std::string& k, const std::string& why) { fail("checkpoint key '" + k + "'", why); }
};

struct Reader {
  const std::map<std::string, std::string>& in;
  std::string source;
  [[noreturn]] void bad(const std::string& k, const std::string& why) {
    fail(source, "metadata key '" + std::string(kCheckpointKeyPrefix) + k + "': " + why);
  }
  const std::string* get(const std::string& k) {
    auto it = in.find(kCheckpointKeyPrefix + k);
    return it == in.end() ? nullptr : &it->second;
  }
  double to_double(const std::string& k, const std::string& s) {
    double x = 0;
    auto r = std::from_chars(s.data(), s.data() + s.size(), x);
    if (r.ec != std::errc() || r.ptr != s.data() + s.size()) bad(k, "expected a number, got '" + s + "'");
    return x;
  }
  int64_t to_int(const std::string& k, const std::string& s) {
    int64_t x = 0;
    auto r = std::from_chars(s.data(), s.data() + s.size(), x);
    if (r.ec != std::errc() || r.ptr != s.data() + s.size()) bad(k, "expected an integer, got '" + s + "'");
    return x;
  }
  void operator()(const std::string& k, std::string& x) {
    if (auto* s = get(k)) x = *s;
  }
  void operator()(const std::string& k, double& x) {
    if (auto* s = get(k)) x = to_double(k, *s);
  }
  void operator()(const std::string& k, int64_t& x) {
    if (auto* s = get(k)) x = to_int(k, *s);
  }
  void operator()(const std::string& k, int& x) {
    if (auto* s = get(k)) {
      int64_t v = to_int(k, *s);
      if (v < INT32_MIN || v > INT32_MAX) bad(k, "value " + *s + " is out of range");
      x = static_cast<int>(v);
    }
  }
  void operator()(const std::string& k, size_t& x) {
    if (auto* s = get(k)) {
      int64_t v = to_int(k, *s);
      if (v < 0) bad(k, "value " + *s + " is out of range");
      x = static_cast<size_t>(v);
    }
  }
  void operator()(const std::string& k, bool& x) {
    if (auto* s = get(k)) {
      if (*s != "true" && *s != "false") bad(k, "expected true or false, got '" + *s + "'");
      x = *s == "true";
    }
  }
  void operator()(const std::string& k, std::optional<double>& x) {
    if (auto* s = get(k)) x = s->empty() ? std::nullopt : std::optional<double>(to_double(k, *s));
  }
  void operator()(const std::string& k, std::optional<int64_t>& x) {
    if (auto* s = get(k)) x = s->empty() ? std::nullopt : std::optional<int64_t>(to_int(k, *s));
  }
  template <class T, class F> void split(const std::string& k, std::vector<T>& x, char sep, F conv) {
    const std::string* s = get(k);
    if (!s) return;
    x.clear();
    if (s->empty()) return;
    size_t start = 0;
    while (true) {
      size_t end = s->find(sep, start);
      x.push_back(conv(s->substr(start, end == std::string::npos ? std::string::npos : end - start)));
      if (end == std::string::npos) break;
      start = end + 1;
    }
  }
  void operator()(const std::string& k, std::vector<double>& x) {
    split(k, x, ',', [&](const std::string& p) { return to_double(k, p); });
  }
  void operator()(const std::string& k, std::vector<std::string>& x) {
    split(k, x, '\n', [](const std::string& p) { return p; });
  }
};

bool is_ours(const std::string& key) { return key.rfind(kCheckpointKeyPrefix, 0) == 0; }

const std::string kAlgorithmName = "onnxtrain_training_step";
const std::string kInitializationName = "onnxtrain_initialization";

// The initial value of a state tensor as a compact node: a filled tensor becomes ConstantOfShape, so a
// checkpoint does not carry a second copy of every moment buffer.
void emit_initial_value(Graph& g, const std::string& out, const TensorData& t) {
  const size_t es = dtype_size(t.dtype);
  bool uniform = !t.dims.empty() && t.numel() > 0;
  for (size_t i = es; uniform && i < t.bytes.size(); i += es)
    uniform = std::memcmp(t.bytes.data(), t.bytes.data() + i, es) == 0;
  Node n;
  n.name = out;
  n.outputs = {out};
  if (uniform) {
    const std::string shape_name = out + "/shape";
    g.initializers[shape_name] = TensorData::from<int64_t>({static_cast<int64_t>(t.dims.size())}, t.dims);
    TensorData one{t.dtype, {1}, std::vector<std::byte>(t.bytes.begin(), t.bytes.begin() + es)};
    n.op_type = "ConstantOfShape";
    n.inputs = {shape_name};
    n.attributes["value"] = std::move(one);
  } else {
    n.op_type = "Constant";
    n.attributes["value"] = t;
  }
  g.nodes.push_back(std::move(n));
}

Shape shape_of(const std::vector<int64_t>& dims) {
  Shape s;
  for (int64_t d : dims) s.push_back(Dim::of(d));
  return s;
}

}  // namespace

Metadata config_to_metadata(const TrainingConfig& config) {
  TrainingConfig c = config;
  Writer w;
  visit_config(c, w);
  return std::move(w.out);
}

namespace {
// A model's metadata as a map; every reader of our keys goes through this, so a key given twice is an
// error everywhere rather than a silent pick of one of them.
std::map<std::string, std::string> metadata_map(const Metadata& metadata, const std::string& source) {
  std::map<std::string, std::string> in;
  for (const auto& [k, v] : metadata)
    if (!in.emplace(k, v).second) fail(source, "metadata key '" + k + "' is given twice");
  return in;
}

TrainingConfig read_config(Reader& r) {
  TrainingConfig c;
  visit_config(c, r);
  return c;
}
}  // namespace

TrainingConfig config_from_metadata(const Metadata& metadata, const std::string& source) {
  const std::map<std::string, std::string> in = metadata_map(metadata, source);
  Reader r{in, source};
  return read_config(r);
}

Graph initialization_graph(const Graph& training_graph, const std::vector<std::string>& state_names) {
  Graph init;
  init.name = kInitializationName;
  for (const std::string& name : state_names) {
    const TensorData& t0 = training_graph.initializers.at(name);
    const std::string out = "init/" + name;
    emit_initial_value(init, out, t0);
    init.outputs.push_back({out, TypeInfo{t0.dtype, shape_of(t0.dims)}});
  }
  return init;
}

Model TrainingSession::checkpoint() const {
  Model m = checkpoint_shell();
  auto fill = [&](Graph& g) {
    for (auto& [name, t] : g.initializers)
      if (is_hollow(t)) t = store_->at(name).to_data();
  };
  fill(m.graph);
  fill(m.training_info[0].algorithm);
  return m;
}

Model TrainingSession::checkpoint_shell() const {
  Model m = export_shell();
  // The training step starts with the graph the session computes: with mixed precision, the rewritten model.
  if (config_.mixed_precision.active()) apply_mixed_precision(m.graph, half_dtype(config_.mixed_precision));
  const Graph& main = m.graph;
  const Graph& tg = train_->graph();

  // The ONNX training step is "main graph, then algorithm graph": the algorithm carries only what the
  // session appended to the model (loss, backward, optimizer). That holds because every pass appends.
  if (tg.nodes.size() < main.nodes.size()) fail("checkpoint", "the training graph is smaller than the model");
  for (size_t i = 0; i < main.nodes.size(); ++i) {
    const Node& a = main.nodes[i];
    const Node& b = tg.nodes[i];
    if (a.op_type != b.op_type || a.domain != b.domain || a.inputs != b.inputs || a.outputs != b.outputs)
      fail("checkpoint", "the training graph changed the model's " + a.describe() +
                             "; it cannot be stored as a TrainingInfoProto algorithm");
  }
  TrainingInfo ti;
  Graph& alg = ti.algorithm;
  alg.name = kAlgorithmName;
  alg.nodes.assign(tg.nodes.begin() + static_cast<std::ptrdiff_t>(main.nodes.size()), tg.nodes.end());
  for (const ValueInfo& in : tg.inputs)
    if (!main.find_input(in.name) && !tg.is_initializer(in.name)) alg.inputs.push_back(in);
  // Optimizer state and loss constants: the current values, not the ones the session started with.
  for (const auto& [name, t] : tg.initializers) {
    if (main.is_initializer(name)) continue;
    auto it = store_->find(name);
    alg.initializers[name] = it != store_->end() ? stored_or_hollow(name) : t;
  }
  std::set<std::string> main_values;
  for (const Node& n : main.nodes) main_values.insert(n.outputs.begin(), n.outputs.end());
  for (const auto& [name, t] : tg.value_info)
    if (!main_values.count(name) && !main.value_info.count(name)) alg.value_info[name] = t;
  alg.outputs.push_back(tg.outputs.front());  // the loss
  std::set<std::string> outs{tg.outputs.front().name};
  for (const auto& [fresh, state] : updates_) {
    const Tensor& s = store_->at(state);
    if (outs.insert(fresh).second) alg.outputs.push_back({fresh, TypeInfo{s.dtype, shape_of(s.shape)}});
    ti.update_binding.emplace_back(state, fresh);
  }
  remove_allreduce(alg);  // a data-parallel session stores the single-process step

  // Initialization resets the optimizer state (not the weights) to what a new session starts from.
  // Built with the session (initialization_graph): the state's initial values are gone from its graphs.
  ti.initialization = initialization_;
  for (const std::string& name : state_names_) ti.initialization_binding.emplace_back(name, "init/" + name);

  // Fused gradient ops travel as functions with standard-op bodies, as in export_gradient_model.
  const int64_t onnx_opset = std::max<int64_t>(m.opset(""), 13);
  m.opset_imports[""] = onnx_opset;
  for (Function f : fused_grad_functions()) {
    bool used = std::any_of(alg.nodes.begin(), alg.nodes.end(), [&](const Node& n) {
      return n.op_type == f.name && n.domain == f.domain;
    });
    if (!used || m.find_function(f.domain, f.name)) continue;
    f.opset_imports[""] = onnx_opset;
    m.opset_imports[f.domain] = 1;
    m.functions.push_back(std::move(f));
  }
  // Any other domain the algorithm uses must be imported by the model.
  for (const Node& n : alg.nodes)
    if (!n.domain.empty() && !m.opset_imports.count(n.domain)) m.opset_imports[n.domain] = 1;
  m.training_info.push_back(std::move(ti));

  Metadata meta;
  for (const auto& kv : m.metadata)
    if (!is_ours(kv.first)) meta.push_back(kv);
  meta.emplace_back(std::string(kCheckpointKeyPrefix) + "version", ONNXTRAIN_VERSION);
  meta.emplace_back(std::string(kCheckpointKeyPrefix) + "format", kCheckpointFormat);
  for (auto& kv : config_to_metadata(config_)) meta.push_back(std::move(kv));
  meta.emplace_back(std::string(kCheckpointKeyPrefix) + "step", std::to_string(step()));
  meta.emplace_back(std::string(kCheckpointKeyPrefix) + "micro_batches", std::to_string(micro_));
  // The non-finite policy's counters. Readers that predate them ignore the keys (format stays 1).
  meta.emplace_back(std::string(kCheckpointKeyPrefix) + "skipped_steps", std::to_string(skipped_steps_));
  meta.emplace_back(std::string(kCheckpointKeyPrefix) + "train_step_calls", std::to_string(step_calls_));
  if (schedule_) {
    std::vector<double> st = schedule_->state();
    if (!st.empty()) {
      Writer w;
      w("schedule_state", st);
      for (auto& kv : w.out) meta.push_back(std::move(kv));
    }
  }
  m.metadata = std::move(meta);
  return m;
}

void TrainingSession::save_checkpoint(const std::filesystem::path& path) const {
  if (writes_files()) save_model_large(checkpoint_shell(), path, {}, stored_bytes());
}

TrainingSession TrainingSession::from_checkpoint(const std::filesystem::path& path, DataParallelSpec parallel,
                                                 std::string device) {
  // load_model names the file in its errors (unreadable, truncated, not a model); ours do too.
  return resume(load_model(path), path.string(), std::move(parallel), std::move(device));
}

TrainingSession TrainingSession::from_checkpoint(const Model& checkpoint, const std::string& source,
                                                 DataParallelSpec parallel, std::string device) {
  return resume(Model(checkpoint), source, std::move(parallel), std::move(device));
}

TrainingSession TrainingSession::resume(Model&& ckpt, const std::string& source, DataParallelSpec parallel,
                                        std::string device) {
  // First: a corrupt tensor or metadata value would otherwise surface as a wrong config or silently wrong state.
  verify_checksums(ckpt, std::string(kCheckpointKeyPrefix) + "checksums", source);
  const std::map<std::string, std::string> meta = metadata_map(ckpt.metadata, source);
  Reader r{meta, source};
  const std::string* format = r.get("format");
  if (!format)
    fail(source, "is an ONNX model but not an onnxtrain checkpoint (no '" + std::string(kCheckpointKeyPrefix) +
                     "format' metadata)");
  if (*format != kCheckpointFormat)
    fail(source, "checkpoint format '" + *format + "' is not supported (this build reads format " +
                     kCheckpointFormat + ")");
  if (ckpt.training_info.size() != 1 || ckpt.training_info[0].algorithm.name != kAlgorithmName)
    fail(source, "checkpoint has no onnxtrain training step (training_info[0].algorithm '" + kAlgorithmName + "')");
  TrainingConfig config = read_config(r);
  config.parallel = std::move(parallel);
  config.device = std::move(device);

  // The inference model as the session first saw it: our metadata, functions and training info removed. Moved,
  // not copied: the session keeps the weights, and each state tensor is freed once copied in (large models).
  Graph alg = std::move(ckpt.training_info[0].algorithm);
  Model model = std::move(ckpt);
  model.training_info.clear();
  std::erase_if(model.metadata, [](const auto& kv) { return is_ours(kv.first); });
  std::erase_if(model.functions, [](const Function& f) { return f.domain == kFusedGradDomain; });
  strip_mixed_precision(model.graph);  // the session re-applies it from the configuration
  if (std::none_of(model.graph.nodes.begin(), model.graph.nodes.end(),
                   [](const Node& n) { return n.domain == kFusedGradDomain; }))
    model.opset_imports.erase(kFusedGradDomain);

  TrainingSession s = [&] {
    try {
      return TrainingSession(std::move(model), std::move(config));
    } catch (const Error& e) {
      fail(source, std::string("rebuilding the training session failed: ") + e.what());
    }
  }();
  // The training graph is rebuilt from the model, so the stored state only has to be copied in.
  for (const std::string& name : s.state_names_) {
    auto it = alg.initializers.find(name);
    if (it == alg.initializers.end())
      fail(source, "optimizer state '" + name + "' is missing from the checkpoint's training step");
    Tensor& dst = s.store_->at(name);
    const TensorData& src = it->second;
    if (src.dtype != dst.dtype || src.dims != dst.shape)
      fail(source, "optimizer state '" + name + "' is " + dtype_name(src.dtype) + " " + to_string(shape_of(src.dims)) +
                       ", expected " + dst.describe());
    copy_into(dst, src, source + ": optimizer state '" + name + "'");
    std::vector<std::byte>().swap(it->second.bytes);
  }
  if (r.get("micro_batches")) {
    int64_t micro = 0;
    r("micro_batches", micro);
    if (micro < 0 || micro >= std::max(1, s.config_.optimizer.gradient_accumulation))
      r.bad("micro_batches", "expected 0 <= value < gradient_accumulation, got " + std::to_string(micro));
    s.micro_ = static_cast<int>(micro);
  }
  // Checkpoints from before these counters: no step was skipped, and every call so far was an update or one
  // of the micro-batches accumulated.
  s.step_calls_ = s.step() * std::max(1, s.config_.optimizer.gradient_accumulation) + s.micro_;
  for (auto [key, field] : {std::pair<const char*, int64_t*>{"skipped_steps", &s.skipped_steps_},
                            std::pair<const char*, int64_t*>{"train_step_calls", &s.step_calls_}}) {
    if (!r.get(key)) continue;
    int64_t v = 0;
    r(key, v);
    if (v < 0) r.bad(key, "expected an integer >= 0, got " + std::to_string(v));
    *field = v;
  }
  if (s.skipped_steps_ > s.step_calls_)
    r.bad("skipped_steps", "is " + std::to_string(s.skipped_steps_) + ", more than the train_step calls (" +
                               std::to_string(s.step_calls_) + ")");
  if (s.schedule_) {
    std::vector<double> st;
    r("schedule_state", st);
    if (!st.empty()) s.schedule_->set_state(st);
  }
  return s;
}

}  // namespace onnxtrain

// ---- TrainingInfoRunner ----

namespace onnxtrain {

namespace {

constexpr const char* kPreviewTraining = "ai.onnx.preview.training";

std::vector<std::string> strings_attr(const Node& n, const std::string& a) {
  auto it = n.attributes.find(a);
  if (it == n.attributes.end()) return {};
  if (auto* v = std::get_if<std::vector<std::string>>(&it->second)) return *v;
  if (auto* s = std::get_if<std::string>(&it->second)) return {*s};
  fail(n.describe(), "attribute '" + a + "' must be a list of strings");
}

// Replaces every ai.onnx.preview.training Gradient node by the backward graph our engine builds for it. The
// nodes before the Gradient compute its y; the backward nodes go right after them, then the nodes after.
void expand_gradient_ops(Model& m) {
  Graph& g = m.graph;
  for (size_t idx = 0; idx < g.nodes.size(); ++idx) {
    if (g.nodes[idx].op_type != "Gradient" || g.nodes[idx].domain != kPreviewTraining) continue;
    const Node grad_node = g.nodes[idx];
    const std::vector<std::string> xs = strings_attr(grad_node, "xs");
    const std::vector<std::string> y = strings_attr(grad_node, "y");
    const std::vector<std::string> zs = strings_attr(grad_node, "zs");
    if (xs.empty() || y.size() != 1)
      fail(grad_node.describe(), "needs attributes xs (at least one name) and y (one name)");
    if (grad_node.outputs.size() != xs.size())
      fail(grad_node.describe(), "has " + std::to_string(grad_node.outputs.size()) + " outputs for " +
                                     std::to_string(xs.size()) + " names in xs; expected one gradient per x");
    std::vector<Node> suffix(g.nodes.begin() + static_cast<std::ptrdiff_t>(idx) + 1, g.nodes.end());
    g.nodes.resize(idx);
    // Types for the gradient rules: inferred on the nodes that lead up to the Gradient.
    Model prefix = m;
    prefix.graph.outputs.clear();
    try {
      infer_shapes(prefix);
    } catch (const Error& e) {
      fail(grad_node.describe(), std::string("inferring types before expanding it: ") + e.what());
    }
    g.value_info = prefix.graph.value_info;
    GraphBuilder b(g, grad_node.name.empty() ? "gradient" + std::to_string(idx) + "/" : grad_node.name + "/");
    Expr yv = value(b, y[0]);
    Expr seed = scalar(b, yv.dtype(), 1.0);
    GradientRequest req;
    req.wrt = xs;
    req.outputs = {y[0]};
    req.output_grads = {seed.name};
    req.stop_gradients.insert(zs.begin(), zs.end());  // zs are inputs held constant (onnx Gradient spec)
    req.functions = m.functions;
    GradientResult gr;
    try {
      gr = build_gradients(g, m.opset_imports, req);
    } catch (const Error& e) {
      fail(grad_node.describe(), e.what());
    }
    for (size_t k = 0; k < xs.size(); ++k) {
      if (grad_node.outputs[k].empty()) continue;
      Node id;
      id.name = grad_node.name + "/out" + std::to_string(k);
      id.op_type = "Identity";
      id.inputs = {gr.grads.at(xs[k])};
      id.outputs = {grad_node.outputs[k]};
      g.nodes.push_back(std::move(id));
    }
    const size_t next = g.nodes.size();
    g.nodes.insert(g.nodes.end(), suffix.begin(), suffix.end());
    idx = next - 1;
  }
}

}  // namespace

TrainingInfoRunner::TrainingInfoRunner(const Model& model, size_t index)
    : model_(model), index_(index), store_(std::make_shared<TensorStore>()) {
  if (index_ >= model_.training_info.size())
    fail("model", "has " + std::to_string(model_.training_info.size()) + " training_info entries; index " +
                      std::to_string(index_) + " does not exist");
  const TrainingInfo& ti = model_.training_info[index_];
  // The training step is the main graph followed by the algorithm, lists concatenated in that order.
  Model step = model_;
  step.training_info.clear();
  Graph& g = step.graph;
  const Graph& alg = ti.algorithm;
  g.name = alg.name.empty() ? g.name + "_training" : alg.name;
  g.nodes.insert(g.nodes.end(), alg.nodes.begin(), alg.nodes.end());
  g.inputs.insert(g.inputs.end(), alg.inputs.begin(), alg.inputs.end());
  for (const auto& [k, v] : alg.initializers)
    if (!g.initializers.emplace(k, v).second)
      fail("training_info[" + std::to_string(index_) + "].algorithm",
           "initializer '" + k + "' is also an initializer of the main graph");
  for (const auto& [k, v] : alg.value_info) g.value_info.emplace(k, v);
  g.outputs = alg.outputs;
  ExecutorOptions eo;
  for (const auto& binding : ti.update_binding) {
    // Not a structured binding: clang 14 (the fuzz/sanitizer compiler) cannot capture one in a lambda.
    const std::string& key = binding.first;
    const std::string& val = binding.second;
    if (!g.is_initializer(key))
      fail("update_binding '" + key + "'", "is not an initializer of the main graph or of the algorithm");
    if (std::none_of(g.outputs.begin(), g.outputs.end(), [&](const ValueInfo& o) { return o.name == val; }) &&
        std::none_of(model_.graph.outputs.begin(), model_.graph.outputs.end(),
                     [&](const ValueInfo& o) { return o.name == val; }))
      fail("update_binding '" + key + "'", "value '" + val + "' is not an output of the algorithm or the model");
    eo.updates.emplace_back(val, key);
    eo.variables.insert(key);
  }
  for (const auto& [key, val] : ti.initialization_binding) {
    if (!g.is_initializer(key))
      fail("initialization_binding '" + key + "'", "is not an initializer of the main graph or of the algorithm");
    eo.variables.insert(key);
  }
  expand_gradient_ops(step);
  sort_topologically(g);
  eo.functions = step.functions;
  algorithm_ = std::make_unique<Executor>(std::move(g), step.opset_imports, store_, eo);
}

void TrainingInfoRunner::initialize() {
  const TrainingInfo& ti = model_.training_info[index_];
  if (ti.initialization_binding.empty()) return;
  ExecutorOptions eo;
  eo.functions = model_.functions;
  // Its own store: the initialization graph has no inputs and must not read the training state.
  Executor init(ti.initialization, model_.opset_imports, std::make_shared<TensorStore>(), eo);
  if (!init.feed_names().empty())
    fail("training_info initialization", "has input '" + init.feed_names()[0] + "'; it must have none");
  std::vector<Tensor> out = init.run(std::map<std::string, Tensor>{});
  for (const auto& [key, val] : ti.initialization_binding) {
    const auto& names = init.output_names();
    auto it = std::find(names.begin(), names.end(), val);
    if (it == names.end())
      fail("initialization_binding '" + key + "'", "value '" + val + "' is not an output of the initialization graph");
    const Tensor& src = out[static_cast<size_t>(it - names.begin())];
    Tensor& dst = store_->at(key);
    if (src.dtype != dst.dtype || src.shape != dst.shape)
      fail("initialization_binding '" + key + "'", "initialization produced " + src.describe() + ", expected " +
                                                      dst.describe());
    copy_into(dst, src, "initialization_binding '" + key + "'");
  }
}

std::vector<Tensor> TrainingInfoRunner::step(const std::map<std::string, Tensor>& feeds) {
  return algorithm_->run(feeds);
}

Tensor TrainingInfoRunner::value(const std::string& name) const {
  auto it = store_->find(name);
  if (it == store_->end()) fail("initializer '" + name + "'", "is not part of this training step");
  return it->second.clone();
}

Model TrainingInfoRunner::model() const {
  Model m = model_;
  for (auto& [name, t] : m.graph.initializers)
    if (store_->count(name)) t = store_->at(name).to_data();
  for (auto& [name, t] : m.training_info[index_].algorithm.initializers)
    if (store_->count(name)) t = store_->at(name).to_data();
  return m;
}

const Graph& TrainingInfoRunner::training_graph() const { return algorithm_->graph(); }

}  // namespace onnxtrain
