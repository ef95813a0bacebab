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

}  // namespace onnxtrain::test
