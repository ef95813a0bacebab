#include "training/checkpoint.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "executor/transfer.h"
#include "gradients/fused.h"
#include "graph/error.h"
#include "graph/model_io.h"
#include "graph/validate.h"
#include "optimizers/optimizer.h"
#include "training/checkpoint_format.h"
#include "training/checksums.h"

namespace onnxtrain {

namespace fs = std::filesystem;

using namespace checkpoint_format;

namespace {

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

  // Fused gradient ops travel as functions with standard-op bodies, as in export_gradient_model. Where a body
  // would not compute what the kernel computes for some node (fused_body_refusal: an RNN with Relu activations, say),
  // the checkpoint carries no body for that op rather than a wrong one: export_gradient_model refuses such a
  // graph, but a checkpoint must still be written, and onnxtrain resumes it with its own kernels.
  const int64_t onnx_opset = std::max<int64_t>(m.opset(""), 13);
  m.opset_imports[""] = onnx_opset;
  // The main graph is searched too: with adapter dropout it is the training forward, holding DropoutMask nodes.
  // The optimizer's update ops (optimizers/optimizer.h) travel the same way, from their own list.
  std::vector<Function> bodies = fused_grad_functions();
  for (Function& f : optimizer_update_functions()) bodies.push_back(std::move(f));
  for (Function f : bodies) {
    bool used = false, refused = false;
    for (const std::vector<Node>* nodes : {&m.graph.nodes, &alg.nodes})
      for (const Node& n : *nodes) {
        if (n.op_type != f.name || n.domain != f.domain) continue;
        used = true;
        refused = refused || !fused_body_refusal(n).empty();
      }
    // A body that is not valid at the model's opset (most need CastLike, opset 15) stays out too: the checkpoint
    // must pass the ONNX checker, and a function has to import its model's opset.
    if (!used || refused || m.find_function(f.domain, f.name) || !function_error_at_opset(f, onnx_opset).empty())
      continue;
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
