#pragma once
// TrainingSession: the C++ API. From an inference model it builds three graphs that share one weight store:
//   inference  = the model as given;
//   gradients  = model + loss + backward (outputs: loss and "<weight>_grad" per trainable weight);
//   train step = gradients graph + optimizer, whose updates the executor writes back in place.
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "executor/executor.h"
#include "graph/ir.h"
#include "losses/loss.h"
#include "optimizers/optimizer.h"

namespace onnxtrain {

struct TrainingConfig {
  std::vector<std::string> trainable;  // initializer names; empty = every floating-point initializer
  std::string prediction;              // the model output the loss reads; empty = the first output
  LossSpec loss;
  OptimizerSpec optimizer;
  Device device = Device::CPU;
};

using Feeds = std::map<std::string, Tensor>;

class TrainingSession {
 public:
  TrainingSession(Model model, TrainingConfig config);
  static TrainingSession from_file(const std::filesystem::path& model, TrainingConfig config);

  // One step on a batch: the model's inputs plus the loss target (target_name()). Returns the loss before
  // the update.
  float train_step(const Feeds& feeds);
  // The model's outputs, in order.
  std::vector<Tensor> infer(const Feeds& inputs);
  // Loss and the gradient of every trainable weight, without updating anything.
  struct Gradients {
    float loss = 0;
    std::map<std::string, Tensor> grads;
  };
  Gradients gradients(const Feeds& feeds);

  const std::vector<std::string>& trainable() const { return trainable_; }
  const std::string& target_name() const { return target_; }
  Tensor get_weight(const std::string& name) const;  // a copy
  std::map<std::string, Tensor> weights() const;     // copies of every trainable weight
  void set_weight(const std::string& name, const Tensor& value);
  float learning_rate() const;
  void set_learning_rate(float lr);
  // The inference model with the current weights.
  Model export_inference() const;
  // A standard ONNX model of the gradients graph with the current weights: inputs are the model's plus the
  // target, outputs are the loss and "<weight>_grad" per trainable weight. Fused gradient ops ship as
  // model-local functions with standard-op bodies, so any ONNX runtime can run it.
  Model export_gradient_model() const;
  // The full training-step graph (for inspection and for portable export).
  const Graph& training_graph() const { return train_->graph(); }
  const Graph& gradient_graph() const { return grad_->graph(); }

 private:
  std::span<const Tensor* const> order_feeds(Executor& ex, const Feeds& feeds);

  Model model_;
  TrainingConfig config_;
  std::vector<std::string> trainable_;
  std::string target_, loss_, lr_name_;
  std::map<std::string, std::string> grad_names_;
  std::shared_ptr<TensorStore> store_;
  std::unique_ptr<Executor> infer_, grad_, train_;
  std::vector<const Tensor*> feed_ptrs_;
};

}  // namespace onnxtrain
