#include "training/training_info_runner.h"

#include <variant>

#include "executor/transfer.h"
#include "gradients/builder.h"
#include "gradients/fused.h"
#include "graph/error.h"
#include "graph/model_io.h"
#include "graph/shape_inference.h"
#include "graph/validate.h"

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
