#pragma once
// Loss subgraphs. A loss reads (prediction, target) and produces a scalar; it is appended to the forward graph
// with ordinary ONNX ops, so the gradient engine differentiates it like the rest of the model.
#include <string>
#include <vector>

#include "graph/ir.h"

namespace onnxtrain {

struct LossSpec {
  std::string kind = "mse";        // the foundation has "mse"; the losses issue adds the rest
  std::string reduction = "mean";  // "mean" or "sum"
  bool half = false;               // mse: 0.5 * (p - t)^2, the convention of scikit-learn's squared error
};

struct LossGraph {
  std::string loss;    // scalar loss value
  std::string target;  // graph input added for the target
};

// Appends the loss of `prediction` to g and a graph input "target" (a fresh name if taken) with the
// prediction's type. Throws Error naming the key for an unknown kind or reduction.
LossGraph append_loss(Graph& g, const std::string& prediction, const LossSpec& spec);

// Every loss kind, for error messages, tests and docs.
const std::vector<std::string>& loss_kinds();

}  // namespace onnxtrain
