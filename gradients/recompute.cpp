#include "gradients/recompute.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <unordered_map>

#include "graph/builder.h"
#include "graph/validate.h"

namespace onnxtrain {

namespace {

bool has_subgraph(const Node& n) {
  return std::any_of(n.attributes.begin(), n.attributes.end(),
                     [](const auto& a) { return std::holds_alternative<std::shared_ptr<Graph>>(a.second); });
}

// What a node reads: its inputs and what its subgraphs read from the enclosing scope.
std::vector<std::string> reads_of(const Node& n) {
  std::vector<std::string> r;
  for (const std::string& in : n.inputs)
    if (!in.empty()) r.push_back(in);
  if (has_subgraph(n))
    for (const std::string& v : subgraph_outer_references(n)) r.push_back(v);
  return r;
}

// Bytes of a value by its inferred type; a symbolic dim counts as 1 (activations share the batch symbol, so
// their ratios stay right), an unknown rank as nothing.
double bytes_of(const Graph& g, const std::string& v) {
  const TypeInfo* t = g.type_of(v);
  if (!t || !t->shape) return 0;
  double n = static_cast<double>(dtype_size(t->dtype));
  for (const Dim& d : *t->shape) n *= d.known() ? static_cast<double>(d.value) : 1.0;
  return n;
}

// Known size of dim i of a value (negative i counts from the end); nullopt when unknown.
std::optional<int64_t> dim_of(const Graph& g, const std::string& v, int64_t i) {
  const TypeInfo* t = g.type_of(v);
  if (!t || !t->shape) return std::nullopt;
  const int64_t r = static_cast<int64_t>(t->shape->size());
  if (i < 0) i += r;
  if (i < 0 || i >= r || !(*t->shape)[static_cast<size_t>(i)].known()) return std::nullopt;
  return (*t->shape)[static_cast<size_t>(i)].value;
}

// A product (MatMul, Gemm, Conv) whose contraction is longer than its output's rows are wide (K > N): its output
// is smaller than the input it would be recomputed from, and recomputing it costs the most arithmetic per byte
// saved (2K flops per output element). Mode::Auto keeps such outputs (a transformer's FFN down-projection and
// attention-times-V, most convolutions) and recomputes the widening products and everything elementwise.
bool narrowing_product(const Graph& g, const Node& n) {
  if (!(n.domain.empty() || n.domain == "ai.onnx") || n.inputs.size() < 2 || n.outputs.empty()) return false;
  std::optional<int64_t> k, w;
  if (n.op_type == "MatMul") {
    k = dim_of(g, n.inputs[0], -1);
    const TypeInfo* b = g.type_of(n.inputs[1]);
    w = b && b->shape && b->shape->size() == 1 ? std::optional<int64_t>(1) : dim_of(g, n.outputs[0], -1);
  } else if (n.op_type == "Gemm") {
    k = dim_of(g, n.inputs[0], n.attr_int("transA", 0) ? 0 : 1);
    w = dim_of(g, n.outputs[0], 1);
  } else if (n.op_type == "Conv") {
    const TypeInfo* t = g.type_of(n.inputs[1]);
    if (!t || !t->shape || t->shape->size() < 2) return false;
    int64_t prod = 1;
    for (size_t i = 1; i < t->shape->size(); ++i) {
      if (!(*t->shape)[i].known()) return false;
      prod *= (*t->shape)[i].value;
    }
    k = prod;
    w = dim_of(g, n.inputs[1], 0);
  }
  return k && w && *k > *w;
}

// Mode::Auto's choice of forward nodes to recompute (see the header).
std::vector<bool> auto_selection(const Graph& g, size_t n_forward, size_t first_backward,
                                 const std::vector<size_t>& order, const std::unordered_set<std::string>& on_grad_path) {
  std::vector<bool> chosen(n_forward, false);
  std::unordered_map<std::string, size_t> pos_of_value;  // forward value -> position of its node in `order`
  for (size_t p = 0; p < order.size(); ++p)
    for (const std::string& o : g.nodes[order[p]].outputs)
      if (!o.empty()) pos_of_value[o] = p;
  std::unordered_map<std::string, size_t> last_read;  // forward value -> last position a forward node reads it
  for (size_t p = 0; p < order.size(); ++p)
    for (const std::string& v : reads_of(g.nodes[order[p]]))
      if (pos_of_value.count(v)) last_read[v] = std::max(last_read[v], p);
  std::unordered_set<std::string> backward_reads;
  for (size_t j = first_backward; j < g.nodes.size(); ++j)
    for (const std::string& v : reads_of(g.nodes[j]))
      if (pos_of_value.count(v) && on_grad_path.count(v)) backward_reads.insert(v);

  // live[p]: values on the gradient path made at or before p that a forward node after p still reads.
  std::vector<int> delta(order.size() + 1, 0);
  for (const auto& [v, last] : last_read) {
    const size_t made = pos_of_value.at(v);
    if (!on_grad_path.count(v) || last <= made) continue;
    ++delta[made];
    --delta[last];
  }
  std::vector<std::string> candidate(order.size());  // the boundary value a position makes, if any
  std::vector<double> sizes;
  int live = 0;
  for (size_t p = 0; p < order.size(); ++p) {
    live += delta[p];
    if (live != 1) continue;
    for (const std::string& o : g.nodes[order[p]].outputs)
      if (!o.empty() && on_grad_path.count(o) && last_read.count(o) && last_read.at(o) > p) candidate[p] = o;
    if (!candidate[p].empty()) sizes.push_back(bytes_of(g, candidate[p]));
  }
  if (sizes.empty()) return chosen;
  std::nth_element(sizes.begin(), sizes.begin() + static_cast<std::ptrdiff_t>(sizes.size() / 2), sizes.end());
  const double median = sizes[sizes.size() / 2];
  double total = 0;
  for (const std::string& v : backward_reads) total += bytes_of(g, v);
  const double budget = std::sqrt(total * median);

  // Walk the forward part, keeping a boundary once the bytes saved since the last one reach the budget.
  double since = 0;
  std::vector<bool> is_kept_node(order.size(), false);
  std::optional<size_t> last_kept;
  for (size_t p = 0; p < order.size(); ++p) {
    for (const std::string& o : g.nodes[order[p]].outputs)
      if (backward_reads.count(o)) since += bytes_of(g, o);
    if (!candidate[p].empty() && since >= budget) {
      is_kept_node[p] = true;
      last_kept = p;
      since = 0;
    }
  }
  if (!last_kept) return chosen;
  for (size_t p = 0; p < *last_kept; ++p) {
    const Node& n = g.nodes[order[p]];
    const bool on_path = std::any_of(n.outputs.begin(), n.outputs.end(), [&](const std::string& o) { return on_grad_path.count(o) > 0; });
    if (!is_kept_node[p] && on_path && recomputable(n) && !narrowing_product(g, n)) chosen[order[p]] = true;
  }
  return chosen;
}

}  // namespace

bool recomputable(const Node& n) {
  const bool std_domain = n.domain.empty() || n.domain == "ai.onnx";
  if (is_random_op(n) || (std_domain && n.op_type == "Dropout") || has_subgraph(n)) return false;
  return std::any_of(n.outputs.begin(), n.outputs.end(), [](const std::string& o) { return !o.empty(); });
}

RecomputeReport apply_recompute(Graph& g, size_t n_forward, size_t first_backward,
                                const std::unordered_set<std::string>& on_grad_path, const RecomputePolicy& policy) {
  RecomputeReport report;
  if (!policy.active()) return report;
  std::vector<size_t> order;  // forward nodes in the order the plan runs them
  for (size_t i : topological_order(g))
    if (i < n_forward) order.push_back(i);

  std::vector<bool> chosen(n_forward, false);
  if (policy.mode == RecomputePolicy::Mode::Auto) {
    chosen = auto_selection(g, n_forward, first_backward, order, on_grad_path);
  } else {
    for (size_t i = 0; i < n_forward; ++i)
      chosen[i] = policy.nodes.count(g.nodes[i].name) && recomputable(g.nodes[i]);
  }

  std::unordered_map<std::string, size_t> producer;  // outputs of chosen forward nodes
  for (size_t i = 0; i < n_forward; ++i)
    if (chosen[i])
      for (const std::string& o : g.nodes[i].outputs)
        if (!o.empty()) producer[o] = i;

  // The copies the backward part needs, transitively through chosen nodes.
  std::vector<bool> needed(n_forward, false);
  std::function<void(size_t)> need = [&](size_t i) {
    if (needed[i]) return;
    needed[i] = true;
    for (const std::string& in : g.nodes[i].inputs)
      if (auto it = producer.find(in); it != producer.end()) need(it->second);
  };
  for (size_t j = first_backward; j < g.nodes.size(); ++j)
    for (const std::string& in : g.nodes[j].inputs)
      if (auto it = producer.find(in); it != producer.end()) need(it->second);

  GraphBuilder names(g, "recompute/");
  std::unordered_map<std::string, std::string> copy_of;  // forward value -> its recomputed copy
  std::vector<Node> copies(n_forward);
  for (size_t i : order) {
    if (!needed[i]) continue;
    const Node& n = g.nodes[i];
    Node c = n;
    c.name = names.unique_name(n.name.empty() ? n.op_type : n.name);
    for (std::string& o : c.outputs) {
      if (o.empty()) continue;
      const std::string orig = o;
      o = names.unique_name(orig);
      if (const TypeInfo* t = g.type_of(orig)) g.value_info[o] = *t;
      copy_of[orig] = o;
    }
    copies[i] = std::move(c);
    report.recomputed.push_back(n.name.empty() ? n.outputs.front() : n.name);
  }
  auto rename_inputs = [&](Node& n) {
    for (std::string& in : n.inputs)
      if (auto it = copy_of.find(in); it != copy_of.end()) in = it->second;
  };
  for (size_t i = 0; i < n_forward; ++i)
    if (needed[i]) rename_inputs(copies[i]);

  // Each copy goes right before the first backward node that reads it (its own inputs' copies before it),
  // so a recomputed value lives only while the backward part of its segment runs.
  std::vector<Node> nodes(std::make_move_iterator(g.nodes.begin()),
                          std::make_move_iterator(g.nodes.begin() + static_cast<std::ptrdiff_t>(first_backward)));
  std::vector<bool> emitted(n_forward, false);
  std::function<void(size_t)> emit = [&](size_t i) {
    if (emitted[i]) return;
    emitted[i] = true;
    // The forward node, moved to the same index of `nodes`; its inputs copied, since emitting appends to `nodes`.
    const std::vector<std::string> inputs = nodes[i].inputs;
    for (const std::string& in : inputs)
      if (auto it = producer.find(in); it != producer.end()) emit(it->second);
    nodes.push_back(std::move(copies[i]));
  };
  for (size_t j = first_backward; j < g.nodes.size(); ++j) {
    Node n = std::move(g.nodes[j]);
    for (const std::string& in : n.inputs)
      if (auto it = producer.find(in); it != producer.end()) emit(it->second);
    rename_inputs(n);  // a control-flow node's subgraphs keep reading the forward values they name (kept)
    nodes.push_back(std::move(n));
  }
  g.nodes = std::move(nodes);

  std::unordered_set<std::string> forward_values;
  for (size_t i = 0; i < n_forward; ++i)
    for (const std::string& o : g.nodes[i].outputs)
      if (!o.empty()) forward_values.insert(o);
  for (size_t j = first_backward; j < g.nodes.size(); ++j)
    for (const std::string& v : reads_of(g.nodes[j]))
      if (forward_values.count(v) || g.is_initializer(v) || g.find_input(v)) report.kept.insert(v);
  return report;
}

}  // namespace onnxtrain
