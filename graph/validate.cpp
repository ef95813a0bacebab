#include "graph/validate.h"

#include <onnx/checker.h>

#include <algorithm>
#include <functional>
#include <queue>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "graph/error.h"
#include "graph/proto.h"

namespace onnxtrain {

namespace {

using NameSet = std::unordered_set<std::string>;

// describe() cannot know a node's position; here we do, which names even a node without name or outputs.
std::string label(const Graph& g, size_t i) {
  const Node& n = g.nodes[i];
  bool has_name = !n.name.empty() || std::any_of(n.outputs.begin(), n.outputs.end(), [](auto& o) { return !o.empty(); });
  if (has_name) return n.describe();
  return "node #" + std::to_string(i) + " (" + n.op_type + ")";
}

std::string graph_label(const Graph& g) { return g.name.empty() ? std::string("graph") : "graph '" + g.name + "'"; }

// Names a subgraph reads from enclosing scopes: these are inputs of the node that owns it, for ordering.
void outer_references(const Graph& sub, NameSet& out) {
  NameSet defined;
  for (const auto& v : sub.inputs) defined.insert(v.name);
  for (const auto& [name, t] : sub.initializers) defined.insert(name);
  for (const auto& n : sub.nodes)
    for (const auto& o : n.outputs) defined.insert(o);
  for (const auto& n : sub.nodes) {
    for (const auto& i : n.inputs)
      if (!i.empty() && !defined.count(i)) out.insert(i);
    for (const auto& [k, a] : n.attributes)
      if (const auto* g = std::get_if<std::shared_ptr<Graph>>(&a); g && *g) {
        NameSet inner;
        outer_references(**g, inner);
        for (const auto& v : inner)
          if (!defined.count(v)) out.insert(v);
      }
  }
  for (const auto& o : sub.outputs)
    if (!defined.count(o.name)) out.insert(o.name);
}

// Every value a node reads, explicit inputs first, then what its subgraphs read from this scope.
std::vector<std::string> reads(const Node& n) {
  std::vector<std::string> r;
  for (const auto& i : n.inputs)
    if (!i.empty()) r.push_back(i);
  NameSet implicit;
  for (const auto& [k, a] : n.attributes)
    if (const auto* g = std::get_if<std::shared_ptr<Graph>>(&a); g && *g) outer_references(**g, implicit);
  std::vector<std::string> sorted(implicit.begin(), implicit.end());
  std::sort(sorted.begin(), sorted.end());
  for (auto& v : sorted)
    if (std::find(r.begin(), r.end(), v) == r.end()) r.push_back(std::move(v));
  return r;
}

// Value -> producing node index; a value with two producers, or a node output that shadows a graph input or
// initializer, breaks single assignment and is reported with both definitions.
std::unordered_map<std::string, size_t> producers(const Graph& g) {
  std::unordered_map<std::string, size_t> prod;
  NameSet declared;
  for (const auto& v : g.inputs) declared.insert(v.name);
  for (const auto& [name, t] : g.initializers) declared.insert(name);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    for (const auto& o : g.nodes[i].outputs) {
      if (o.empty()) continue;
      if (auto it = prod.find(o); it != prod.end()) {
        if (it->second == i) fail(label(g, i), "output '" + o + "' is listed twice");
        fail(label(g, i), "output '" + o + "' is also produced by " + label(g, it->second) +
                              " (each value must have exactly one producer)");
      }
      if (declared.count(o))
        fail(label(g, i), "output '" + o + "' is also a graph input or initializer (each value must have exactly " +
                              "one producer)");
      prod.emplace(o, i);
    }
  }
  return prod;
}

std::vector<size_t> kahn(const Graph& g, const NameSet& available) {
  const size_t n = g.nodes.size();
  const auto prod = producers(g);
  std::vector<std::vector<size_t>> succ(n);
  std::vector<std::vector<std::pair<size_t, std::string>>> pred(n);  // (producer, value) for cycle reports
  std::vector<size_t> indeg(n, 0);
  for (size_t i = 0; i < n; ++i) {
    std::set<size_t> seen;
    for (const auto& v : reads(g.nodes[i])) {
      if (auto it = prod.find(v); it != prod.end()) {
        if (seen.insert(it->second).second) {
          succ[it->second].push_back(i);
          pred[i].emplace_back(it->second, v);
          ++indeg[i];
        }
      } else if (!available.count(v)) {
        fail(label(g, i), "input '" + v + "' is not produced by any node and is not a graph input, initializer " +
                              "or value of an enclosing graph");
      }
    }
  }
  // A min-heap on the index makes the order stable: an already sorted graph comes back unchanged.
  std::priority_queue<size_t, std::vector<size_t>, std::greater<>> ready;
  for (size_t i = 0; i < n; ++i)
    if (indeg[i] == 0) ready.push(i);
  std::vector<size_t> order;
  order.reserve(n);
  while (!ready.empty()) {
    size_t i = ready.top();
    ready.pop();
    order.push_back(i);
    for (size_t s : succ[i])
      if (--indeg[s] == 0) ready.push(s);
  }
  if (order.size() == n) return order;

  // Every node left has a predecessor that is also left, so walking predecessors must revisit a node.
  size_t start = 0;
  while (indeg[start] == 0) ++start;
  std::vector<size_t> path;
  std::vector<std::string> via;
  std::unordered_map<size_t, size_t> pos;
  size_t cur = start;
  while (!pos.count(cur)) {
    pos[cur] = path.size();
    path.push_back(cur);
    for (const auto& [p, v] : pred[cur])
      if (indeg[p] > 0) {
        via.push_back(v);
        cur = p;
        break;
      }
  }
  std::string msg = "the nodes form a cycle: ";
  for (size_t k = pos[cur]; k < path.size(); ++k)
    msg += (k == pos[cur] ? label(g, path[k]) : ", which") + " reads '" + via[k] + "' from " +
           (k + 1 == path.size() ? label(g, cur) : label(g, path[k + 1]));
  fail(graph_label(g), msg);
}

void check_scope(const Graph& g, const std::string& where, const NameSet& outer) {
  NameSet defined = outer;
  for (const auto& v : g.inputs) {
    if (v.name.empty()) fail(where, "a graph input has no name");
    defined.insert(v.name);
  }
  for (const auto& [name, t] : g.initializers) defined.insert(name);
  const NameSet available = defined;  // what a node may read without a producer in this graph
  try {
    producers(g);
  } catch (const Error& e) {
    fail(where, e.what());
  }
  NameSet produced;
  for (const auto& n : g.nodes)
    for (const auto& o : n.outputs)
      if (!o.empty()) produced.insert(o);

  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (n.op_type.empty()) fail(where, label(g, i) + " has no op_type");
    for (const auto& v : n.inputs) {
      if (v.empty() || defined.count(v)) continue;
      if (!produced.count(v))
        fail(where, label(g, i) + ": input '" + v + "' is not produced by any node and is not a graph input, " +
                        "initializer or value of an enclosing graph");
      // Produced later: a cycle gets the more useful message; otherwise the order itself is the fault.
      try {
        kahn(g, available);
      } catch (const Error& e) {
        fail(where, e.what());
      }
      fail(where, label(g, i) + " reads '" + v + "' before the node producing it; nodes must be in topological " +
                      "order (sort_topologically fixes this)");
    }
    for (const auto& [k, a] : n.attributes)
      if (const auto* sub = std::get_if<std::shared_ptr<Graph>>(&a); sub && *sub)
        check_scope(**sub, where + ", " + graph_label(**sub) + " in attribute '" + k + "' of " + label(g, i),
                    defined);
    for (const auto& o : n.outputs)
      if (!o.empty()) defined.insert(o);
  }
  for (const auto& o : g.outputs)
    if (!defined.count(o.name))
      fail(where, "graph output '" + o.name + "' is not produced by any node and is not a graph input or initializer");
}

}  // namespace

void validate_model(const Model& m, const std::string& source) {
  const onnx::ModelProto p = to_proto(m);
  try {
    // Custom domains (onnxtrain) are allowed; full_check is off because our own shape inference runs later
    // and tolerates ops ONNX does not know.
    onnx::checker::check_model(p, /*full_check=*/false, /*skip_opset_compatibility_check=*/false,
                               /*check_custom_domain=*/false);
  } catch (const std::exception& e) {
    // The checker's messages span several lines (node dumps); one line reads better in logs and exceptions.
    std::string msg;
    for (const char* c = e.what(); *c; ++c) {
      if (*c == '\n') {
        if (!msg.empty() && msg.back() != ' ') msg += ' ';
      } else if (!(*c == ' ' && !msg.empty() && msg.back() == ' ')) {
        msg += *c;
      }
    }
    while (!msg.empty() && msg.back() == ' ') msg.pop_back();
    // The checker reports a cycle or an undefined input as "not topologically sorted"; our own check names
    // the cycle or the missing value, so it speaks first when it finds a fault.
    check_graph(m.graph, source);
    fail(source, "ONNX checker: " + msg);
  }
  check_graph(m.graph, source);
}

void check_graph(const Graph& g, const std::string& source) { check_scope(g, source, {}); }

std::string function_error_at_opset(const Function& f, int64_t opset) {
  Function at = f;
  at.opset_imports[""] = opset;
  onnx::FunctionProto p;
  function_to_proto(at, &p);
  onnx::checker::CheckerContext ctx;
  ctx.set_ir_version(onnx::IR_VERSION);
  std::unordered_map<std::string, int> imports;
  for (const auto& [domain, version] : at.opset_imports) imports[domain] = static_cast<int>(version);
  imports.try_emplace(f.domain, 1);
  ctx.set_opset_imports(imports);
  ctx.set_schema_registry(onnx::OpSchemaRegistry::Instance());
  ctx.set_is_main_graph(false);
  onnx::checker::LexicalScopeContext scope;
  try {
    onnx::checker::check_function(p, ctx, scope);
  } catch (const std::exception& e) {
    std::string msg;  // one line, as in validate_model
    for (const char* c = e.what(); *c; ++c)
      if (*c != '\n') msg += *c;
      else if (!msg.empty() && msg.back() != ' ') msg += ' ';
    return msg;
  }
  return "";
}

std::vector<size_t> topological_order(const Graph& g, const std::vector<std::string>& outer_scope) {
  NameSet available(outer_scope.begin(), outer_scope.end());
  for (const auto& v : g.inputs) available.insert(v.name);
  for (const auto& [name, t] : g.initializers) available.insert(name);
  return kahn(g, available);
}

std::vector<std::string> subgraph_outer_references(const Node& n) {
  NameSet implicit;
  for (const auto& [k, a] : n.attributes)
    if (const auto* g = std::get_if<std::shared_ptr<Graph>>(&a); g && *g) outer_references(**g, implicit);
  implicit.erase(std::string());
  std::vector<std::string> sorted(implicit.begin(), implicit.end());
  std::sort(sorted.begin(), sorted.end());
  return sorted;
}

void sort_topologically(Graph& g) {
  const auto order = topological_order(g);
  std::vector<Node> sorted;
  sorted.reserve(g.nodes.size());
  for (size_t i : order) sorted.push_back(std::move(g.nodes[i]));
  g.nodes = std::move(sorted);
}

bool is_random_op(const Node& n) {
  return (n.domain.empty() || n.domain == "ai.onnx") &&
         (n.op_type.starts_with("Random") || n.op_type == "Bernoulli" || n.op_type == "Multinomial");
}

}  // namespace onnxtrain
