#pragma once
// Inlining of model-local functions: a node that calls a function is replaced by the function's body, with
// the body's internal values renamed so they cannot collide with the caller's.
#include <functional>
#include <vector>

#include "graph/ir.h"

namespace onnxtrain {

// Inlines (recursively) every node of g whose (domain, op) names one of `functions` and for which `want`
// returns true (all of them when `want` is empty). The body's ai.onnx opset must not exceed the model's;
// errors name the node and the function.
void inline_functions(Graph& g, const std::vector<Function>& functions,
                      const std::function<bool(const Node&)>& want = {});

}  // namespace onnxtrain
