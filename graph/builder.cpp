#include "graph/builder.h"

#include "graph/error.h"

namespace onnxtrain {

namespace {

// Subgraph names count too: a new outer value must not collide with (or be shadowed by) a nested one.
void collect_names(const Graph& g, std::unordered_set<std::string>& used) {
  for (const auto& v : g.inputs) used.insert(v.name);
  for (const auto& v : g.outputs) used.insert(v.name);
  for (const auto& [name, t] : g.initializers) used.insert(name);
  for (const auto& [name, t] : g.value_info) used.insert(name);
  for (const auto& n : g.nodes) {
    if (!n.name.empty()) used.insert(n.name);
    for (const auto& i : n.inputs) used.insert(i);
    for (const auto& o : n.outputs) used.insert(o);
    for (const auto& [k, a] : n.attributes)
      if (const auto* sub = std::get_if<std::shared_ptr<Graph>>(&a); sub && *sub) collect_names(**sub, used);
  }
  used.erase(std::string());
}

}  // namespace

GraphBuilder::GraphBuilder(Graph& g, std::string prefix) : g_(g), prefix_(std::move(prefix)) {
  collect_names(g_, used_);
}

std::string GraphBuilder::unique_name(std::string_view base) {
  const std::string stem = prefix_ + std::string(base);
  std::string name = stem;
  for (size_t k = 1; used_.count(name); ++k) name = stem + "_" + std::to_string(k);
  used_.insert(name);
  return name;
}

std::vector<std::string> GraphBuilder::add_node(std::string op_type, std::vector<std::string> inputs,
                                                size_t n_outputs, std::map<std::string, Attribute> attrs,
                                                std::string domain, std::vector<std::string> outputs) {
  if (op_type.empty()) throw Error("GraphBuilder::add_node: op_type is empty");
  Node n;
  n.name = unique_name(op_type);
  if (outputs.empty()) {
    // Outputs are named after the node so a value's producer is obvious in a dump.
    const std::string node_base = n.name.substr(prefix_.size());
    for (size_t i = 0; i < n_outputs; ++i)
      outputs.push_back(unique_name(node_base + (n_outputs == 1 ? "_out" : "_out" + std::to_string(i))));
  } else {
    for (const auto& o : outputs)
      if (!o.empty()) used_.insert(o);
  }
  for (const auto& i : inputs)
    if (!i.empty()) used_.insert(i);
  n.op_type = std::move(op_type);
  n.domain = std::move(domain);
  n.inputs = std::move(inputs);
  n.outputs = outputs;
  n.attributes = std::move(attrs);
  g_.nodes.push_back(std::move(n));
  return outputs;
}

std::string GraphBuilder::add(std::string op_type, std::vector<std::string> inputs,
                              std::map<std::string, Attribute> attrs, std::string domain) {
  return add_node(std::move(op_type), std::move(inputs), 1, std::move(attrs), std::move(domain))[0];
}

std::string GraphBuilder::constant(TensorData t, std::string_view base) {
  Shape s;
  for (int64_t d : t.dims) s.push_back(Dim::of(d));
  TypeInfo type{t.dtype, std::move(s)};
  const std::string out = unique_name(base);
  add_node("Constant", {}, 1, {{"value", std::move(t)}}, {}, {out});
  g_.value_info[out] = std::move(type);
  return out;
}

void GraphBuilder::add_input(const std::string& name, TypeInfo t) {
  used_.insert(name);
  g_.inputs.push_back(ValueInfo{name, std::move(t)});
}

void GraphBuilder::add_output(const std::string& name, TypeInfo t) {
  used_.insert(name);
  g_.outputs.push_back(ValueInfo{name, std::move(t)});
}

}  // namespace onnxtrain
