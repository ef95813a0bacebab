#pragma once
// Subgraph rules: forms that exporters write as several nodes for one function (GELU at opsets below 20 is
// `x * 0.5 * (1 + Erf(x / sqrt(2)))`) are differentiated as a whole. Node by node, the backward pass keeps
// every intermediate value of the formula alive until it runs, and spends one pass per derivative factor;
// as a whole it keeps only the input and runs one fused op. A subgraph is taken only when its intermediate
// values feed nothing outside it and no stop-gradient edge touches them, so the result is the same function
// of the same values.
#include <string>
#include <unordered_map>
#include <vector>

#include "graph/expr.h"

namespace onnxtrain {

struct SubgraphRule {
  std::string name;      // "gelu_erf"
  std::string formula;   // what it matches, for `onnxtrain ops` and docs/ops.md
  std::string fused_op;  // the onnxtrain-domain op it emits (gradients/fused.h)
};

// Every subgraph rule. `onnxtrain ops` (docs/ops.md) and the tests enumerate this list.
const std::vector<SubgraphRule>& subgraph_rules();

struct SubgraphMatch {
  std::string rule;                   // SubgraphRule::name
  std::vector<size_t> nodes;          // forward node indices; the last one produces `output`
  std::string input, output;          // x and y of y = f(x)
  std::vector<std::string> interior;  // values made and read only inside the match
};

// Non-overlapping matches among g's nodes. `readers` counts, per value, the nodes that read it (as an input
// or from a subgraph body) plus one if it is a graph output; interior values must have exactly one reader.
std::vector<SubgraphMatch> match_subgraphs(const Graph& g, const std::unordered_map<std::string, int>& readers);

// dX of the match's input from dY of its output, x being the input's value.
Expr subgraph_gradient(GraphBuilder& b, const SubgraphMatch& m, const Expr& x, const Expr& dy);

}  // namespace onnxtrain
