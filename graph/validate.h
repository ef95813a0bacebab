#pragma once
#include <string>
#include <vector>

#include "graph/ir.h"

namespace onnxtrain {

// Runs the ONNX checker (full_check when shapes are to be trusted), then our checks: every input defined
// before use, one producer per value, no cycles, declared outputs produced. Throws Error naming the
// source, the node and the problem.
void validate_model(const Model& m, const std::string& source);

// Our structural checks only, for graphs built in memory (no checker); same errors.
void check_graph(const Graph& g, const std::string& source);

// Why function f's body is not valid ONNX when it imports ai.onnx opset `opset` (an op that opset lacks, an
// attribute or input its version of an op does not take), as the ONNX checker says it; "" when it is valid. A
// model-local function must import its model's opset of a domain, so this says whether a body written for one
// opset can travel with a model of another.
std::string function_error_at_opset(const Function& f, int64_t opset);

// Indices of g.nodes in a topological order; throws Error naming a node on a cycle or with an undefined
// input. outer_scope lists names visible from an enclosing graph.
std::vector<size_t> topological_order(const Graph& g, const std::vector<std::string>& outer_scope = {});
void sort_topologically(Graph& g);

// The values a node's subgraphs (If branches, Loop and Scan bodies, nested at any depth) read from the scope
// around the node, sorted and each once: inputs of the node that its attributes hide. The executor plans them
// as extra inputs of a control-flow step and the gradient engine routes gradients to them.
std::vector<std::string> subgraph_outer_references(const Node& n);

// A random-sampling op (RandomNormal[Like], RandomUniform[Like], Bernoulli, Multinomial): its value differs
// from run to run, so it is never computed ahead (folded, or recomputed in place of a saved value).
bool is_random_op(const Node& n);

}  // namespace onnxtrain
