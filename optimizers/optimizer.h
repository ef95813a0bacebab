#pragma once
// Optimizer subgraphs: read each weight, its gradient and its state, and produce the new values. The
// executor writes them back in place through the returned update bindings.
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "graph/ir.h"

namespace onnxtrain {

struct OptimizerSpec {
  std::string kind = "sgd";  // the foundation has "sgd"; the optimizers issue adds the rest
  double learning_rate = 0.01;
};

struct OptimizerGraph {
  std::string learning_rate;  // float32 scalar initializer; schedules write it between steps
  std::vector<std::pair<std::string, std::string>> updates;  // (new value, state to overwrite)
};

// grads maps each trainable weight to its gradient value. Throws Error naming the key on a bad spec.
OptimizerGraph append_optimizer(Graph& g, const std::map<std::string, std::string>& grads, const OptimizerSpec& spec);

const std::vector<std::string>& optimizer_kinds();

}  // namespace onnxtrain
