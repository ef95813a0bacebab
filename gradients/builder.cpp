#include "gradients/builder.h"

#include <onnx/defs/schema.h>

#include <algorithm>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "gradients/rules/util.h"
#include "gradients/subgraphs.h"
#include "graph/error.h"
#include "graph/inline.h"
#include "graph/shape_inference.h"
#include "graph/validate.h"

namespace onnxtrain {

namespace {

int64_t opset_for(const std::map<std::string, int64_t>& opsets, const std::string& domain) {
  const std::string d = domain == "ai.onnx" ? std::string() : domain;
  if (auto it = opsets.find(d); it != opsets.end()) return it->second;
  if (d.empty())
    if (auto it = opsets.find("ai.onnx"); it != opsets.end()) return it->second;
  return 1;
}

// The ONNX schema's differentiability tag for input i; inputs tagged NonDifferentiable (shapes, axes,
// indices) never receive a gradient. Ops without a schema (our own domain) count as differentiable.
bool schema_says_differentiable(const Node& n, size_t i, int64_t opset) {
  // Mod's divisor is tagged NonDifferentiable, yet fmod(A, B) is differentiable in B almost everywhere and
  // torch.fmod defines that gradient; we follow torch.
  if (n.domain.empty() && n.op_type == "Mod" && i == 1) return true;
  // The recurrent ops tag initial_h (and initial_c) NonDifferentiable, yet the outputs depend smoothly on them
  // (a learned initial state, or a state carried across sequences); torch differentiates h0 and c0, and so do we.
  if (n.domain.empty() && (n.op_type == "LSTM" || n.op_type == "GRU" || n.op_type == "RNN") && (i == 5 || i == 6))
    return true;
  // GridSample tags its grid NonDifferentiable, yet the output is piecewise smooth in it (spatial transformers
  // learn it); torch differentiates the grid, and so do we.
  if (n.domain.empty() && n.op_type == "GridSample" && i == 1) return true;
  const onnx::OpSchema* s = onnx::OpSchemaRegistry::Schema(n.op_type, static_cast<int>(opset), n.domain);
  if (!s || s->inputs().empty()) return true;
  const auto& params = s->inputs();
  const auto& p = i < params.size() ? params[i] : params.back();
  return p.GetDifferentiationCategory() != onnx::OpSchema::NonDifferentiable;
}

}  // namespace

namespace {

// Model-local function call sites without a rule of their own are replaced by their bodies; ONNX shape
// inference then types the body's values, which the rules need.
void inline_calls_without_rules(Graph& g, const std::map<std::string, int64_t>& opsets,
                                const std::vector<Function>& functions, const GradientRegistry& rules) {
  auto want = [&](const Node& n) { return rules.find(n.domain == "ai.onnx" ? "" : n.domain, n.op_type) == nullptr; };
  auto is_call = [&](const Node& n) {
    const std::string d = n.domain == "ai.onnx" ? std::string() : n.domain;
    return std::any_of(functions.begin(), functions.end(), [&](const Function& f) {
      return f.name == n.op_type && (f.domain == "ai.onnx" ? std::string() : f.domain) == d;
    });
  };
  if (std::none_of(g.nodes.begin(), g.nodes.end(), [&](const Node& n) { return is_call(n) && want(n); })) return;
  inline_functions(g, functions, want);
  Model m;
  m.opset_imports = opsets;
  m.graph = g;
  m.functions = functions;
  infer_shapes(m);
  for (auto& [name, t] : m.graph.value_info) g.value_info.try_emplace(name, t);
}

// Values a node's subgraphs (If, Loop, Scan bodies) read from the enclosing scope: a trainable tensor can
// reach a control-flow node that way without being one of its inputs (graph/validate.h).
std::vector<std::string> outer_references(const Node& n) { return subgraph_outer_references(n); }

bool is_control_flow(const Node& n) {
  return (n.domain.empty() || n.domain == "ai.onnx") && (n.op_type == "If" || n.op_type == "Loop" || n.op_type == "Scan");
}

}  // namespace

GradientResult build_gradients(Graph& g, const std::map<std::string, int64_t>& opsets, const GradientRequest& req,
                               const GradientRegistry& rules) {
  if (req.emit_yield && !req.output_grads.empty())
    fail("gradient request", "with emit_yield the seeds are the Yield's outputs; output_grads must be empty");
  if (!req.emit_yield && req.outputs.size() != req.output_grads.size())
    fail("gradient request", "needs one seed gradient per output");
  inline_calls_without_rules(g, opsets, req.functions, rules);
  std::vector<std::string> defined;
  for (const ValueInfo& v : g.inputs) defined.push_back(v.name);
  for (const auto& [name, t] : g.initializers) defined.push_back(name);
  const std::vector<size_t> order = topological_order(g, defined);
  const size_t n_forward = g.nodes.size();  // the builder appends; forward nodes keep their indices

  auto is_float = [&](const std::string& v) {
    const TypeInfo* t = g.type_of(v);
    return t && is_floating(t->dtype);
  };

  // Values that depend on a trainable tensor, and which trainable tensor (for error messages).
  std::unordered_map<std::string, std::string> from_wrt;
  for (const std::string& w : req.wrt) {
    if (!g.type_of(w)) fail("trainable tensor '" + w + "'", "is not a value of the graph");
    if (!is_float(w)) fail("trainable tensor '" + w + "'", "must be a floating-point tensor");
    from_wrt.emplace(w, w);
  }
  auto needs_input = [&](const Node& n, size_t i) {
    if (!n.has_input(i) || req.stop_gradients.count(n.inputs[i]) || !from_wrt.count(n.inputs[i])) return false;
    return is_float(n.inputs[i]) && schema_says_differentiable(n, i, opset_for(opsets, n.domain));
  };
  std::vector<bool> active(n_forward, false);
  for (size_t idx : order) {
    const Node& n = g.nodes[idx];
    if (is_non_differentiable_op(n.domain, n.op_type)) continue;
    std::optional<std::string> source;
    for (size_t i = 0; i < n.inputs.size() && !source; ++i)
      if (needs_input(n, i)) source = from_wrt.at(n.inputs[i]);
    if (!source)
      for (const std::string& v : outer_references(n))
        if (from_wrt.count(v) && !req.stop_gradients.count(v)) {
          source = from_wrt.at(v);
          break;
        }
    if (!source) continue;
    active[idx] = true;
    for (const std::string& o : n.outputs)
      if (!o.empty() && is_float(o)) from_wrt.emplace(o, *source);
  }

  // Values from which a differentiated output is reachable.
  std::unordered_set<std::string> to_output(req.outputs.begin(), req.outputs.end());
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const Node& n = g.nodes[*it];
    bool hit = std::any_of(n.outputs.begin(), n.outputs.end(), [&](const std::string& o) { return to_output.count(o); });
    if (hit)
      for (const std::string& in : n.inputs)
        if (!in.empty()) to_output.insert(in);
  }

  // Subgraphs differentiated as a whole (gradients/subgraphs.h): the match's last node takes the rule, its
  // other nodes get none. Taken only when the input needs a gradient and no stop edge touches the inside.
  std::unordered_map<std::string, int> readers;
  for (size_t i = 0; i < n_forward; ++i) {
    for (const std::string& in : g.nodes[i].inputs)
      if (!in.empty()) ++readers[in];
    for (const std::string& v : outer_references(g.nodes[i])) ++readers[v];
  }
  for (const ValueInfo& v : g.outputs) ++readers[v.name];
  const std::vector<SubgraphMatch> subgraphs = match_subgraphs(g, readers);
  std::unordered_map<size_t, const SubgraphMatch*> subgraph_at;
  std::unordered_set<size_t> inside_subgraph;
  // The fused gradient has x's shape and reads dY in it. The rules' constants have one element, so y has x's
  // shape unless a constant of higher rank added leading 1s.
  auto same_shape = [&](const std::string& a, const std::string& c) {
    const TypeInfo* ta = g.type_of(a);
    const TypeInfo* tc = g.type_of(c);
    return ta && tc && ta->shape && tc->shape && ta->shape->size() == tc->shape->size();
  };
  for (const SubgraphMatch& m : subgraphs) {
    const bool usable = same_shape(m.input, m.output) && from_wrt.count(m.input) && !req.stop_gradients.count(m.input) &&
                        !req.stop_gradients.count(m.output) &&
                        std::none_of(m.interior.begin(), m.interior.end(), [&](const std::string& v) { return req.stop_gradients.count(v) > 0; }) &&
                        std::all_of(m.nodes.begin(), m.nodes.end(), [&](size_t i) { return active[i]; });
    if (!usable) continue;
    subgraph_at[m.nodes.back()] = &m;
    inside_subgraph.insert(m.nodes.begin(), m.nodes.end() - 1);
  }

  GradientResult result;
  std::vector<std::string> seeds = req.output_grads;
  if (req.emit_yield) {
    // Appended after every forward node and before any backward node, so split_at_yield can cut there.
    GraphBuilder named(g);
    for (const std::string& o : req.outputs) {
      const TypeInfo* t = g.type_of(o);
      if (!t) fail("output '" + o + "'", "has no type; run shape inference before building gradients");
      if (!is_floating(t->dtype)) fail("output '" + o + "'", "is " + dtype_name(t->dtype) + "; only floating-point outputs take a gradient");
      seeds.push_back(named.unique_name(o + "_grad_in"));
      named.set_type(seeds.back(), *t);
    }
    named.add_node("Yield", req.outputs, seeds.size(), {}, "onnxtrain", seeds);
    result.yield_outputs = seeds;
  }

  GraphBuilder b(g, "grad/");
  std::unordered_map<std::string, std::vector<Expr>> pending;  // value -> gradient contributions
  for (size_t i = 0; i < req.outputs.size(); ++i)
    pending[req.outputs[i]].push_back(value(b, seeds[i]));
  auto total = [&](const std::string& v) -> std::optional<Expr> {
    auto it = pending.find(v);
    if (it == pending.end() || it->second.empty()) return std::nullopt;
    if (it->second.size() == 1) return it->second.front();
    return sum(it->second);
  };

  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const size_t idx = *it;
    if (!active[idx] || inside_subgraph.count(idx)) continue;
    if (auto s = subgraph_at.find(idx); s != subgraph_at.end()) {
      const SubgraphMatch& m = *s->second;
      if (std::optional<Expr> dy = total(m.output)) {
        pending[m.input].push_back(subgraph_gradient(b, m, value(b, m.input), *dy));
        result.saved_forward_values.insert(m.input);
      }
      continue;
    }
    // Copy: emitting appends to g.nodes, which may move the node. A control-flow node's copy lists what its
    // subgraphs read from this scope as extra inputs after its own (as the executor plans it), so its rule sees
    // them as X(i) and their gradients are routed like any input's; the graph's node keeps its ONNX inputs.
    Node n = g.nodes[idx];
    const size_t n_own = n.inputs.size();
    if (is_control_flow(n))
      for (const std::string& v : outer_references(n)) n.inputs.push_back(v);
    // Outer references carry no schema tag: every floating-point one that depends on a trainable tensor needs one.
    auto needs = [&](size_t i) {
      if (i < n_own) return needs_input(n, i);
      return !req.stop_gradients.count(n.inputs[i]) && from_wrt.count(n.inputs[i]) && is_float(n.inputs[i]);
    };
    std::vector<std::optional<Expr>> dys;
    bool any = false;
    for (const std::string& o : n.outputs) {
      dys.push_back(o.empty() ? std::nullopt : total(o));
      any = any || dys.back().has_value();
    }
    if (!any) continue;
    const GradientRule* rule = rules.find(n.domain == "ai.onnx" ? "" : n.domain, n.op_type);
    if (!rule) {
      std::string w;
      for (const std::string& in : n.inputs)
        if (from_wrt.count(in)) { w = from_wrt.at(in); break; }
      if (w.empty())
        for (const std::string& in : outer_references(n))
          if (from_wrt.count(in)) { w = from_wrt.at(in); break; }
      if (is_control_flow(n))
        fail(n.describe(), "control flow (" + n.op_type + ") cannot be differentiated yet, and trainable '" + w +
                               "' reaches '" + req.outputs.front() + "' through it (as an input or read by its body)");
      fail(n.describe(), "no gradient rule for op '" + n.op_type + "', needed on the path from trainable '" + w +
                             "' to '" + req.outputs.front() + "'");
    }
    std::vector<Expr> xs, ys, dy;
    std::vector<bool> needs_dx;
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      const bool untyped_outer = i >= n_own && !g.type_of(n.inputs[i]);  // an outer int read, say: no gradient
      xs.push_back(n.inputs[i].empty() || untyped_outer ? Expr{} : value(b, n.inputs[i]));
      needs_dx.push_back(!untyped_outer && needs(i));
    }
    for (size_t o = 0; o < n.outputs.size(); ++o) {
      ys.push_back(n.outputs[o].empty() || !g.type_of(n.outputs[o]) ? Expr{} : value(b, n.outputs[o]));
      dy.push_back(dys[o] ? *dys[o] : (ys[o].valid() && is_floating(ys[o].dtype()) ? zeros_like(ys[o]) : Expr{}));
    }
    RuleContext ctx(b, n, opset_for(opsets, n.domain), xs, ys, dy, needs_dx);
    (*rule)(ctx);
    for (const std::string& r : ctx.reads()) result.saved_forward_values.insert(r);
    const auto& dx = ctx.results();
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      if (!needs_dx[i] || i >= dx.size() || !dx[i]) continue;
      pending[n.inputs[i]].push_back(rules::sum_to_shape(*dx[i], xs[i], n, opset_for(opsets, "")));
    }
  }

  std::vector<std::pair<std::string, Expr>> finals;
  for (const std::string& w : req.wrt) {
    std::optional<Expr> gw = total(w);
    finals.emplace_back(w, gw ? *gw : zeros_like(value(b, w)));
  }
  // Gradients get the conventional readable names "<weight>_grad", outside the "grad/" prefix.
  GraphBuilder named(g);
  for (const auto& [w, src] : finals) {
    std::string name = named.unique_name(w + "_grad");
    named.add_node("Identity", {src.name}, 1, {}, {}, {name});
    named.set_type(name, src.type);
    result.grads[w] = name;
  }
  if (req.recompute.active()) {
    std::unordered_set<std::string> on_grad_path;
    for (const auto& [v, w] : from_wrt) on_grad_path.insert(v);
    RecomputeReport rr = apply_recompute(g, n_forward, n_forward + (req.emit_yield ? 1 : 0), on_grad_path, req.recompute);
    result.recomputed = std::move(rr.recomputed);
    result.saved_forward_values = std::move(rr.kept);
  }
  return result;
}

YieldSplit split_at_yield(const Graph& g) {
  std::optional<size_t> at;
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (g.nodes[i].op_type == "Yield" && g.nodes[i].domain == "onnxtrain") {
      if (at) fail(g.nodes[i].describe(), "is a second onnxtrain.Yield; a graph splits at exactly one");
      at = i;
    }
  if (!at) fail("graph '" + g.name + "'", "has no onnxtrain.Yield node to split at");
  const Node& yield = g.nodes[*at];

  YieldSplit r;
  r.yield_inputs = yield.inputs;
  r.yield_outputs = yield.outputs;
  std::unordered_set<std::string> fwd_values, bwd_values(yield.outputs.begin(), yield.outputs.end());
  for (const ValueInfo& v : g.inputs) fwd_values.insert(v.name);
  for (size_t i = 0; i < *at; ++i)
    for (const std::string& o : g.nodes[i].outputs)
      if (!o.empty()) fwd_values.insert(o);
  for (size_t i = *at + 1; i < g.nodes.size(); ++i)
    for (const std::string& o : g.nodes[i].outputs)
      if (!o.empty()) bwd_values.insert(o);
  for (size_t i = 0; i < *at; ++i)
    for (const std::string& in : g.nodes[i].inputs)
      if (bwd_values.count(in))
        fail(g.nodes[i].describe(), "comes before the Yield but reads '" + in + "', which the backward part computes");

  auto type_of = [&](const std::string& v) {
    const TypeInfo* t = g.type_of(v);
    if (!t) fail("value '" + v + "'", "crosses the Yield boundary but has no type; run shape inference first");
    return *t;
  };
  // Initializers stay initializers on both sides: the Executor puts them in the shared store once.
  auto used_initializers = [&](const std::vector<Node>& nodes, Graph& out) {
    for (const Node& n : nodes) {
      std::vector<std::string> reads = n.inputs;
      for (const std::string& v : outer_references(n)) reads.push_back(v);  // weights a branch body reads
      for (const std::string& in : reads)
        if (auto it = g.initializers.find(in); it != g.initializers.end()) out.initializers.emplace(*it);
    }
  };

  // Forward values computed from Constant nodes alone (an axis, a Concat of constant scales): the backward part
  // recomputes them rather than receiving them as saved activations, so its plan knows their values (kernels
  // such as CumSum and Resize need them at plan time) and the caller never holds them.
  std::unordered_set<std::string> constants;
  std::vector<size_t> constant_nodes;
  for (size_t i = 0; i < *at; ++i) {
    const Node& n = g.nodes[i];
    const bool std_domain = n.domain.empty() || n.domain == "ai.onnx";
    if (!std_domain || is_random_op(n) || n.outputs.empty() || is_control_flow(n)) continue;
    if (!std::all_of(n.inputs.begin(), n.inputs.end(), [&](const std::string& in) { return in.empty() || constants.count(in); }))
      continue;
    for (const std::string& o : n.outputs)
      if (!o.empty()) constants.insert(o);
    constant_nodes.push_back(i);
  }

  // Saved values: whatever a backward node reads that the forward part defines (initializers and constants
  // excepted).
  std::set<std::string> seen, recomputed;
  for (size_t i = *at + 1; i < g.nodes.size(); ++i) {
    // What a backward control-flow node's subgraphs read (the recomputed forward of an If branch) counts too.
    std::vector<std::string> reads = g.nodes[i].inputs;
    for (const std::string& v : outer_references(g.nodes[i])) reads.push_back(v);
    for (const std::string& in : reads) {
      if (in.empty() || g.initializers.count(in) || bwd_values.count(in) || !fwd_values.count(in)) continue;
      if (constants.count(in)) {
        recomputed.insert(in);
        continue;
      }
      if (seen.insert(in).second) r.saved.push_back(in);
    }
  }
  // The constant nodes the recomputed values need, transitively, in forward order.
  std::vector<Node> recompute;
  for (auto it = constant_nodes.rbegin(); it != constant_nodes.rend(); ++it) {
    const Node& n = g.nodes[*it];
    if (std::none_of(n.outputs.begin(), n.outputs.end(), [&](const std::string& o) { return recomputed.count(o); }))
      continue;
    for (const std::string& in : n.inputs)
      if (!in.empty()) recomputed.insert(in);
    recompute.insert(recompute.begin(), n);
  }

  Graph& f = r.forward;
  f.name = g.name + "_forward";
  f.inputs = g.inputs;
  f.nodes.assign(g.nodes.begin(), g.nodes.begin() + static_cast<std::ptrdiff_t>(*at));
  std::set<std::string> fwd_outputs;
  auto is_graph_input = [&](const std::string& v) { return g.find_input(v) != nullptr; };
  for (const std::string& v : r.yield_inputs)
    if (fwd_outputs.insert(v).second) f.outputs.push_back({v, type_of(v)});
  for (const ValueInfo& o : g.outputs)
    if (fwd_values.count(o.name) && !is_graph_input(o.name) && fwd_outputs.insert(o.name).second) f.outputs.push_back(o);
  // Saved graph inputs are not routed through the forward graph: the caller already holds them.
  for (const std::string& v : r.saved)
    if (!is_graph_input(v) && fwd_outputs.insert(v).second) f.outputs.push_back({v, type_of(v)});
  used_initializers(f.nodes, f);
  for (const auto& [name, t] : g.value_info) f.value_info.emplace(name, t);

  Graph& b = r.backward;
  b.name = g.name + "_backward";
  for (const std::string& v : r.saved) b.inputs.push_back({v, type_of(v)});
  for (const std::string& v : r.yield_outputs) b.inputs.push_back({v, type_of(v)});
  b.nodes = std::move(recompute);
  b.nodes.insert(b.nodes.end(), g.nodes.begin() + static_cast<std::ptrdiff_t>(*at) + 1, g.nodes.end());
  for (const ValueInfo& o : g.outputs)
    if (bwd_values.count(o.name)) b.outputs.push_back(o);
  used_initializers(b.nodes, b);
  for (const auto& [name, t] : g.value_info) b.value_info.emplace(name, t);
  return r;
}

}  // namespace onnxtrain
