#pragma once
// The one-line node the executor and graph tests build graphs from: an op with inputs and outputs, named after its
// first output (so errors and profiles say "node 'y' (Mul)").
#include <string>
#include <utility>
#include <vector>

#include "graph/ir.h"

namespace onnxtrain::test {

inline Node node(std::string op, std::vector<std::string> in, std::vector<std::string> out, std::string domain = "") {
  Node n;
  n.op_type = std::move(op);
  n.domain = std::move(domain);
  n.inputs = std::move(in);
  n.name = out.front();
  n.outputs = std::move(out);
  return n;
}

// A node with a name of its own, for graphs whose nodes are named apart from their outputs (control-flow bodies).
inline Node named_node(std::string name, std::string op, std::vector<std::string> in, std::vector<std::string> out) {
  Node n;
  n.name = std::move(name);
  n.op_type = std::move(op);
  n.inputs = std::move(in);
  n.outputs = std::move(out);
  return n;
}

// A tensor type with static dims.
inline TypeInfo static_type(DType t, const std::vector<int64_t>& dims) {
  Shape s;
  for (int64_t d : dims) s.push_back(Dim::of(d));
  return {t, s};
}

}  // namespace onnxtrain::test
