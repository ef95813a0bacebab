#pragma once
// The gradient engine: appends the backward graph of `outputs` with respect to `wrt` to a graph.
#include <map>
#include <set>
#include <string>
#include <vector>

#include "gradients/rule.h"
#include "graph/ir.h"

namespace onnxtrain {

struct GradientRequest {
  std::vector<std::string> wrt;           // trainable initializers (or inputs) to differentiate
  std::vector<std::string> outputs;       // values whose gradients are seeded
  std::vector<std::string> output_grads;  // seed value per output (already defined in the graph)
  std::set<std::string> stop_gradients;   // explicit stop edges: no gradient flows into these values
};

struct GradientResult {
  // wrt name -> gradient value name. A wrt without a path to any output gets a zeros tensor.
  std::map<std::string, std::string> grads;
  std::set<std::string> saved_forward_values;  // forward values the backward graph reads
};

// The graph's value_info must hold types (infer_shapes). Throws Error naming the op, the node and the
// trainable tensor whose path needs it when a rule is missing.
GradientResult build_gradients(Graph& g, const std::map<std::string, int64_t>& opsets, const GradientRequest& req,
                               const GradientRegistry& rules = default_rules());

}  // namespace onnxtrain
