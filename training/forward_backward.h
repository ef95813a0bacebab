#pragma once
// ForwardBackwardSession: the model's forward and backward as two calls, for an outside autograd (PyTorch)
// that supplies the gradients of the model's outputs. Built on the onnxtrain.Yield boundary (docs/yield.md):
// forward + Yield + backward is one graph, split at the Yield into two executors sharing one weight store.
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "executor/executor.h"
#include "gradients/builder.h"
#include "graph/ir.h"

namespace onnxtrain {

class ForwardBackwardSession {
 public:
  // trainable: initializer names; empty = every floating-point initializer. inputs_requiring_grad: graph
  // inputs whose gradients run_backward also returns. store: the weight store to run on, shared with other
  // executors (a TrainingSession's, so its train_step and this backward see the same weights); null = a new one.
  // Initializers missing from a shared store are added to it, as by any Executor. recompute: activation
  // recomputation (docs/memory.md): the backward graph recomputes those forward values from the kept ones, so
  // run_forward keeps fewer activations (saved_names()).
  ForwardBackwardSession(Model model, std::vector<std::string> trainable = {},
                         std::vector<std::string> inputs_requiring_grad = {}, Device device = Device::CPU,
                         std::shared_ptr<TensorStore> store = nullptr, RecomputePolicy recompute = {});
  static ForwardBackwardSession from_file(const std::filesystem::path& model, std::vector<std::string> trainable = {},
                                          std::vector<std::string> inputs_requiring_grad = {});

  // The model's outputs, in order. Keeps (owning copies of) the activations the backward pass reads, until
  // the next run_forward.
  std::vector<Tensor> run_forward(const std::map<std::string, Tensor>& inputs);
  // One entry per model output, in order; nullopt means zeros. Returns the gradient of every trainable
  // weight and every input requiring grad, by name. May be called again for the same forward pass.
  std::map<std::string, Tensor> run_backward(const std::vector<std::optional<Tensor>>& output_grads);

  const std::vector<std::string>& trainable() const { return trainable_; }
  const std::vector<std::string>& inputs_requiring_grad() const { return inputs_requiring_grad_; }
  const std::vector<std::string>& output_names() const { return output_names_; }
  Tensor get_weight(const std::string& name) const;  // a copy
  std::map<std::string, Tensor> weights() const;     // copies of every trainable weight
  void set_weight(const std::string& name, const Tensor& value);

  const Graph& yield_graph() const { return yield_graph_; }  // forward + Yield + backward
  const Graph& forward_graph() const { return forward_->graph(); }
  const Graph& backward_graph() const { return backward_->graph(); }
  const std::vector<std::string>& saved_names() const { return split_saved_; }

 private:
  Model model_;
  std::vector<std::string> trainable_, inputs_requiring_grad_, output_names_;
  std::vector<TypeInfo> output_types_;
  std::vector<bool> output_differentiable_;  // floating-point outputs take a gradient
  Graph yield_graph_;
  std::vector<std::string> split_saved_, yield_inputs_, yield_outputs_;
  std::map<std::string, std::string> grad_names_;  // trainable or input -> gradient value
  std::shared_ptr<TensorStore> store_;
  std::unique_ptr<Executor> forward_, backward_;
  bool have_forward_ = false;
  std::map<std::string, Tensor> saved_;     // saved activation values of the last forward pass
  std::map<std::string, Tensor> outputs_;   // the last forward pass's outputs, by name (for shapes)
};

}  // namespace onnxtrain
