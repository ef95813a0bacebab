#include "graph/inline.h"

#include <unordered_map>

#include "graph/builder.h"
#include "graph/error.h"

namespace onnxtrain {

namespace {

const Function* find(const std::vector<Function>& fs, const Node& n) {
  const std::string dom = n.domain == "ai.onnx" ? std::string() : n.domain;
  for (const Function& f : fs)
    if (f.name == n.op_type && (f.domain == "ai.onnx" ? std::string() : f.domain) == dom) return &f;
  return nullptr;
}

void expand(const Node& call, const Function& f, const std::vector<Function>& fs, GraphBuilder& b,
            std::vector<Node>& out, int depth) {
  if (depth > 32) fail(call.describe(), "function '" + f.name + "' calls itself (more than 32 nested calls)");
  if (call.inputs.size() > f.inputs.size() || call.outputs.size() > f.outputs.size())
    fail(call.describe(), "calls function '" + f.name + "' with more inputs or outputs than it declares");
  std::unordered_map<std::string, std::string> rename;
  for (size_t i = 0; i < f.inputs.size(); ++i) rename[f.inputs[i]] = i < call.inputs.size() ? call.inputs[i] : "";
  for (size_t i = 0; i < f.outputs.size(); ++i)
    if (i < call.outputs.size()) rename[f.outputs[i]] = call.outputs[i];
  const std::string scope = (call.name.empty() ? call.op_type : call.name) + "/";
  auto map = [&](const std::string& v) {
    if (v.empty()) return v;
    auto it = rename.find(v);
    if (it != rename.end()) return it->second;
    return rename[v] = b.unique_name(scope + v);
  };
  for (const Node& inner : f.nodes) {
    Node n = inner;
    n.name = b.unique_name(scope + (inner.name.empty() ? inner.op_type : inner.name));
    // References take the caller's attribute value; one the caller does not set is left out (no defaults).
    for (const auto& [attr, ref] : inner.attribute_refs) {
      auto it = call.attributes.find(ref.caller);
      if (it != call.attributes.end()) n.attributes[attr] = it->second;
    }
    n.attribute_refs.clear();
    for (std::string& v : n.inputs) v = map(v);
    for (std::string& v : n.outputs) v = map(v);
    if (const Function* g = find(fs, n)) expand(n, *g, fs, b, out, depth + 1);
    else out.push_back(std::move(n));
  }
}

}  // namespace

void inline_functions(Graph& g, const std::vector<Function>& functions, const std::function<bool(const Node&)>& want) {
  if (functions.empty()) return;
  GraphBuilder b(g);
  std::vector<Node> out;
  out.reserve(g.nodes.size());
  for (Node& n : g.nodes) {
    const Function* f = find(functions, n);
    if (f && (!want || want(n))) expand(n, *f, functions, b, out, 0);
    else out.push_back(std::move(n));
  }
  g.nodes = std::move(out);
}

}  // namespace onnxtrain
