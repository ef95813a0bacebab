#pragma once
// A fused gradient op alone in a graph: how the tests and benchmarks/bench_fused run one natively and through
// its inlined body on the same inputs.
#include <map>
#include <string>
#include <vector>

#include "graph/ir.h"

namespace onnxtrain {

// One node calling the fused op `op` (domain onnxtrain) with `attrs`. Each of its `inputs` is an initializer
// when `initializers` holds it, else a graph input of the type `input_types` gives it (an Error names an input
// with neither). Each named output is a graph output of element type `out` ("" leaves an optional one out).
Graph fused_op_graph(const std::string& op, std::map<std::string, Attribute> attrs,
                     const std::vector<std::string>& inputs, const std::map<std::string, TypeInfo>& input_types,
                     const std::vector<std::string>& outputs, DType out,
                     std::map<std::string, TensorData> initializers = {});

// The type of a tensor of static shape `dims`.
TypeInfo static_type(DType t, const std::vector<int64_t>& dims);

}  // namespace onnxtrain
