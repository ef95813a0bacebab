#include "gradients/fused_graph.h"

#include "gradients/fused.h"
#include "graph/error.h"

namespace onnxtrain {

Graph fused_op_graph(const std::string& op, std::map<std::string, Attribute> attrs,
                     const std::vector<std::string>& inputs, const std::map<std::string, TypeInfo>& input_types,
                     const std::vector<std::string>& outputs, DType out,
                     std::map<std::string, TensorData> initializers) {
  Graph g;
  Node n;
  n.name = "fused";
  n.op_type = op;
  n.domain = kFusedGradDomain;
  n.attributes = std::move(attrs);
  n.inputs = inputs;
  n.outputs = outputs;
  for (const std::string& in : inputs) {
    if (initializers.count(in)) continue;
    auto it = input_types.find(in);
    if (it == input_types.end()) fail(n.describe(), "input '" + in + "' has neither a type nor an initializer");
    g.inputs.push_back({in, it->second});
  }
  for (const std::string& o : outputs)
    if (!o.empty()) g.outputs.push_back({o, {out, std::nullopt}});
  g.initializers = std::move(initializers);
  g.nodes.push_back(std::move(n));
  return g;
}

TypeInfo static_type(DType t, const std::vector<int64_t>& dims) {
  Shape s;
  for (int64_t d : dims) s.push_back(Dim::of(d));
  return {t, s};
}

}  // namespace onnxtrain
