#pragma once
// GraphBuilder: appends nodes to a graph with fresh, unique value and node names. Gradients, losses and
// optimizers all emit through it (or through Expr, expr.h, which wraps it).
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "graph/ir.h"

namespace onnxtrain {

class GraphBuilder {
 public:
  // prefix goes before every generated name ("grad/", "loss/") so generated parts are easy to read.
  explicit GraphBuilder(Graph& g, std::string prefix = {});

  Graph& graph() { return g_; }
  // A name not yet used by any value, node or initializer of the graph: base, base_1, base_2, ...
  std::string unique_name(std::string_view base);

  // Appends a node; returns its output names (fresh unless given in outputs).
  std::vector<std::string> add_node(std::string op_type, std::vector<std::string> inputs, size_t n_outputs = 1,
                                    std::map<std::string, Attribute> attrs = {}, std::string domain = {},
                                    std::vector<std::string> outputs = {});
  // Single-output shorthand.
  std::string add(std::string op_type, std::vector<std::string> inputs, std::map<std::string, Attribute> attrs = {},
                  std::string domain = {});
  // A Constant node holding t.
  std::string constant(TensorData t, std::string_view base = "const");
  void set_type(const std::string& value, TypeInfo t) { g_.value_info[value] = std::move(t); }
  void add_input(const std::string& name, TypeInfo t);
  void add_output(const std::string& name, TypeInfo t);

 private:
  Graph& g_;
  std::string prefix_;
  std::unordered_set<std::string> used_;
};

}  // namespace onnxtrain
