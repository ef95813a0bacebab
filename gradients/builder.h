#pragma once
// The gradient engine: appends the backward graph of `outputs` with respect to `wrt` to a graph.
#include <map>
#include <set>
#include <string>
#include <vector>

#include "gradients/recompute.h"
#include "gradients/rule.h"
#include "graph/ir.h"

namespace onnxtrain {

struct GradientRequest {
  std::vector<std::string> wrt;           // trainable initializers (or inputs) to differentiate
  std::vector<std::string> outputs;       // values whose gradients are seeded
  std::vector<std::string> output_grads;  // seed value per output (already defined in the graph)
  std::set<std::string> stop_gradients;   // explicit stop edges: no gradient flows into these values
  // Emit an `onnxtrain.Yield` node (docs/yield.md): its inputs are `outputs`, its outputs their incoming
  // gradients ("<output>_grad_in"), which seed the backward pass. output_grads must then be empty.
  bool emit_yield = false;
  // The model's local functions. A call site of one that has no gradient rule is inlined (in g) before
  // differentiating, so the gradient flows through the function's body.
  std::vector<Function> functions;
  // Activation recomputation (gradients/recompute.h, docs/memory.md): the backward part reads copies of these
  // forward nodes instead of their saved outputs.
  RecomputePolicy recompute;
};

struct GradientResult {
  // wrt name -> gradient value name. A wrt without a path to any output gets a zeros tensor.
  std::map<std::string, std::string> grads;
  std::set<std::string> saved_forward_values;  // forward values the backward graph reads
  std::vector<std::string> yield_outputs;      // with emit_yield: the seed per output, in request order
  std::vector<std::string> recomputed;         // with a recompute policy: the forward nodes copied into the backward part
};

// The graph's value_info must hold types (infer_shapes). Throws Error naming the op, the node and the
// trainable tensor whose path needs it when a rule is missing.
GradientResult build_gradients(Graph& g, const std::map<std::string, int64_t>& opsets, const GradientRequest& req,
                               const GradientRegistry& rules = default_rules());

// The two halves of a graph holding one `onnxtrain.Yield` node, each a plain graph the Executor runs; they
// share the initializers (weights) through one TensorStore.
struct YieldSplit {
  // Inputs: the model's inputs. Outputs: the original graph's outputs that forward nodes produce, then
  // every forward-node value the backward part reads (the saved activations).
  Graph forward;
  // Inputs: saved values (forward-node outputs and graph inputs the backward part reads), then the Yield's
  // outputs. Outputs: the original graph's outputs that backward nodes produce (the gradients).
  Graph backward;
  std::vector<std::string> yield_inputs;   // the forward values whose gradients come in
  std::vector<std::string> yield_outputs;  // their incoming gradients
  std::vector<std::string> saved;          // backward inputs taken from the forward pass, in backward input order
};

// Splits at the Yield: nodes listed before it are forward, after it backward (the order build_gradients
// emits). Throws Error when there is not exactly one Yield or a forward node reads a backward value.
YieldSplit split_at_yield(const Graph& g);

}  // namespace onnxtrain
