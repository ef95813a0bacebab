#include "training/forward_backward.h"
#include "training/fold_shapes.h"
#include "training/weights.h"

#include <algorithm>
#include <cstring>

#include "graph/error.h"
#include "graph/model_io.h"
#include "graph/shape_inference.h"

namespace onnxtrain {

ForwardBackwardSession ForwardBackwardSession::from_file(const std::filesystem::path& model,
                                                         std::vector<std::string> trainable,
                                                         std::vector<std::string> inputs_requiring_grad) {
  return ForwardBackwardSession(load_model(model), std::move(trainable), std::move(inputs_requiring_grad));
}

ForwardBackwardSession::ForwardBackwardSession(Model model, std::vector<std::string> trainable,
                                               std::vector<std::string> inputs_requiring_grad, Device device,
                                               std::shared_ptr<TensorStore> store, RecomputePolicy recompute)
    : model_(std::move(model)),
      trainable_(std::move(trainable)),
      inputs_requiring_grad_(std::move(inputs_requiring_grad)),
      store_(store ? std::move(store) : std::make_shared<TensorStore>()) {
  // Models built in memory may arrive without types; the gradient engine needs them.
  if (model_.graph.value_info.empty() && !model_.graph.nodes.empty()) infer_shapes(model_);
  fold_static_shapes(model_);  // exported slice bounds and pads become the constants rules need
  const Graph& g = model_.graph;
  if (g.outputs.empty()) fail("model", "has no outputs to differentiate");
  if (trainable_.empty())
    for (const auto& [name, t] : g.initializers)
      if (is_floating(t.dtype)) trainable_.push_back(name);
  for (const std::string& w : trainable_) {
    auto it = g.initializers.find(w);
    if (it == g.initializers.end()) fail("trainable '" + w + "'", "is not an initializer of the model");
    if (!is_floating(it->second.dtype))
      fail("trainable '" + w + "'", "is " + dtype_name(it->second.dtype) + "; only floating-point weights train");
  }
  for (const std::string& x : inputs_requiring_grad_) {
    const ValueInfo* v = g.find_input(x);
    if (!v || g.is_initializer(x)) fail("input '" + x + "'", "requires grad but is not an input of the model");
    if (!is_floating(v->type.dtype))
      fail("input '" + x + "'", "requires grad but is " + dtype_name(v->type.dtype) + "; only floating-point inputs can");
  }

  GradientRequest req;
  req.wrt = trainable_;
  req.wrt.insert(req.wrt.end(), inputs_requiring_grad_.begin(), inputs_requiring_grad_.end());
  req.emit_yield = true;
  for (const ValueInfo& o : g.outputs) {
    output_names_.push_back(o.name);
    const TypeInfo* t = g.type_of(o.name);
    output_types_.push_back(t ? *t : o.type);
    output_differentiable_.push_back(is_floating(output_types_.back().dtype));
    if (output_differentiable_.back()) req.outputs.push_back(o.name);
  }
  if (req.outputs.empty()) fail("model", "has no floating-point output to take a gradient");

  req.functions = model_.functions;
  req.recompute = std::move(recompute);
  yield_graph_ = g;
  GradientResult gr = build_gradients(yield_graph_, model_.opset_imports, req);
  grad_names_ = gr.grads;
  for (const std::string& w : req.wrt) yield_graph_.outputs.push_back({grad_names_.at(w), *yield_graph_.type_of(grad_names_.at(w))});

  YieldSplit split = split_at_yield(yield_graph_);
  split_saved_ = split.saved;
  yield_inputs_ = split.yield_inputs;
  yield_outputs_ = split.yield_outputs;

  auto opsets = model_.opset_imports;
  opsets.emplace("onnxtrain", 1);  // fused gradient ops (ReluGrad, ...)
  ExecutorOptions eo;
  eo.device = device;
  eo.variables.insert(trainable_.begin(), trainable_.end());
  forward_ = std::make_unique<Executor>(std::move(split.forward), opsets, store_, eo);
  backward_ = std::make_unique<Executor>(std::move(split.backward), opsets, store_, eo);
}

std::vector<Tensor> ForwardBackwardSession::run_forward(const std::map<std::string, Tensor>& inputs) {
  have_forward_ = false;  // a failed run must not leave the previous activations looking current
  std::vector<Tensor> out = forward_->run(inputs);
  const auto& names = forward_->output_names();
  std::map<std::string, Tensor> by_name;
  for (size_t i = 0; i < names.size(); ++i) by_name[names[i]] = std::move(out[i]);
  saved_.clear();
  for (const std::string& s : split_saved_) {
    if (auto it = by_name.find(s); it != by_name.end()) {
      saved_[s] = it->second;  // shares the owning copy
      continue;
    }
    // A graph input the backward part reads: copied, since the caller's buffer may change before backward.
    auto in = inputs.find(s);
    if (in == inputs.end()) fail("saved value '" + s + "'", "is neither a forward output nor a given input");
    saved_[s] = in->second.clone();
  }
  outputs_.clear();
  std::vector<Tensor> result;
  for (const std::string& o : output_names_) {
    auto it = by_name.find(o);
    if (it == by_name.end()) fail("output '" + o + "'", "was not produced by the forward graph");
    outputs_[o] = it->second;
    // A caller that edits an output in place must not corrupt the copy the backward pass reads.
    result.push_back(saved_.count(o) ? it->second.clone() : it->second);
  }
  have_forward_ = true;
  return result;
}

std::map<std::string, Tensor> ForwardBackwardSession::run_backward(const std::vector<std::optional<Tensor>>& output_grads) {
  if (!have_forward_) fail("run_backward", "called before run_forward; there are no saved activations");
  if (output_grads.size() != output_names_.size()) {
    std::string all;
    for (const std::string& n : output_names_) all += (all.empty() ? "" : ", ") + n;
    fail("run_backward", "expected " + std::to_string(output_names_.size()) + " output gradients (one per output: " +
                             all + "), got " + std::to_string(output_grads.size()));
  }
  std::map<std::string, Tensor> feeds = saved_;  // shallow: tensors share their buffers
  for (size_t i = 0; i < output_names_.size(); ++i) {
    const std::string& name = output_names_[i];
    const Tensor& y = outputs_.at(name);
    const std::optional<Tensor>& dy = output_grads[i];
    if (!output_differentiable_[i]) {
      if (dy) fail("gradient of output '" + name + "'", "given, but the output is " + dtype_name(y.dtype) +
                                                          " and takes no gradient; pass nullopt");
      continue;
    }
    auto seed = std::find(yield_inputs_.begin(), yield_inputs_.end(), name) - yield_inputs_.begin();
    const std::string& seed_name = yield_outputs_.at(static_cast<size_t>(seed));
    if (!dy) {
      // Missing gradient: zeros of the output's type, as autograd treats an unused output.
      Tensor z = Tensor::empty(y.dtype, y.shape);
      std::memset(z.data, 0, z.nbytes());
      feeds[seed_name] = std::move(z);
      continue;
    }
    if (dy->dtype != y.dtype || dy->shape != y.shape)
      fail("gradient of output '" + name + "'", "expected " + y.describe() + " (the output's type), got " + dy->describe());
    feeds[seed_name] = *dy;
  }
  std::vector<Tensor> out = backward_->run(feeds);
  const auto& names = backward_->output_names();
  std::map<std::string, Tensor> by_value;
  for (size_t i = 0; i < names.size(); ++i) by_value[names[i]] = std::move(out[i]);
  std::map<std::string, Tensor> result;
  for (const auto& [w, gname] : grad_names_) result[w] = by_value.at(gname);
  return result;
}

Tensor ForwardBackwardSession::get_weight(const std::string& name) const { return get_trainable(*store_, trainable_, name); }

std::map<std::string, Tensor> ForwardBackwardSession::weights() const { return copy_trainable(*store_, trainable_); }

void ForwardBackwardSession::set_weight(const std::string& name, const Tensor& value) {
  set_trainable(*store_, trainable_, name, value);
}

}  // namespace onnxtrain
