#pragma once
// Runs the training step stored in any ONNX model's TrainingInfoProto, ours or another tool's: the proof that a
// checkpoint is a standard trainable model and not only something onnxtrain reads back (docs/checkpoint.md).
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "executor/executor.h"
#include "graph/ir.h"

namespace onnxtrain {

// Executes any conforming TrainingInfoProto as the ONNX IR describes it (onnx/docs/IR.md, onnx.proto): the
// initialization graph once with its initialization_binding, then steps of "main graph followed by the
// algorithm graph" with update_binding applied after each. Gradient ops of ai.onnx.preview.training are
// expanded with our gradient builder; Momentum, Adam and Adagrad of that domain run as CPU kernels; model-local
// functions are inlined where no kernel exists.
class TrainingInfoRunner {
 public:
  explicit TrainingInfoRunner(const Model& model, size_t index = 0);
  // Runs the initialization graph and writes its outputs into the bound initializers.
  void initialize();
  // One algorithm step on these feeds (main-graph inputs plus algorithm inputs). Returns the algorithm's
  // outputs in order, as computed before the update_binding was applied.
  std::vector<Tensor> step(const std::map<std::string, Tensor>& feeds);
  // The current value of an initializer (main graph or algorithm).
  Tensor value(const std::string& name) const;
  // The model with every initializer replaced by its current value.
  Model model() const;
  // The expanded training graph (main + algorithm, Gradient ops replaced by backward nodes), for inspection.
  const Graph& training_graph() const;

 private:
  Model model_;
  size_t index_;
  std::shared_ptr<TensorStore> store_;
  std::unique_ptr<Executor> algorithm_;
};

}  // namespace onnxtrain
