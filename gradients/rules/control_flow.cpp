// Gradients of control flow, emitted as ONNX control flow of its own so that the training graph stays standard
// ONNX. The engine (gradients/builder.cpp) lists the values a node's subgraphs read from the enclosing scope as
// extra inputs after the node's own, so X(i) past the node's own inputs are those outer references, and
// set_dX routes their gradients (the weights a branch body reads are the case that matters).
//
// If: dX = If(cond, then_grad, else_grad). Each backward branch is the forward branch differentiated by
// build_gradients (recursively, so nested control flow works the same way), with the branch's forward
// recomputed inside the backward branch. Recompute rather than save: a value computed inside a branch exists
// only in that branch's scope, and exporting it would need an extra If output per saved value of both
// branches (with matching shapes in both); recomputing keeps the graph standard, saves nothing beyond the
// values the branch reads from outside (which the backward If reads again), and costs one more run of the
// branch taken.
#include <algorithm>
#include <unordered_map>

#include "gradients/builder.h"
#include "gradients/rule.h"
#include "gradients/rules/util.h"
#include "graph/error.h"
#include "graph/expr.h"
#include "graph/shape_inference.h"
#include "graph/validate.h"

namespace onnxtrain {

namespace {

const Graph& graph_attr(const RuleContext& c, const std::string& name) {
  auto it = c.node().attributes.find(name);
  const auto* g = it == c.node().attributes.end() ? nullptr : std::get_if<std::shared_ptr<Graph>>(&it->second);
  if (!g || !*g) c.fail("attribute '" + name + "' (a graph) is required");
  return **g;
}

// Differentiates g, a subgraph whose inputs give the engine the types of everything it reads, as `req` asks:
// g's values are typed by shape inference on g as a model of its own (the rules need them), build_gradients
// appends the backward nodes, and the values they add get names unique in the enclosing graph (`prefix` + name),
// so that none shadows or is shadowed by a value outside, which ONNX forbids. Returns each wrt's gradient by its
// final name; `what` names the subgraph in errors.
std::map<std::string, std::string> differentiate_subgraph(RuleContext& c, Graph& g, const GradientRequest& req,
                                                          const std::string& prefix, const std::string& what) {
  const std::map<std::string, int64_t> opsets{{"", c.opset()}, {"onnxtrain", 1}};
  {
    Model m;
    m.opset_imports = opsets;
    m.graph = g;
    infer_shapes(m);
    for (auto& [name, t] : m.graph.value_info) g.value_info.try_emplace(name, t);
  }
  const size_t n_forward = g.nodes.size();
  GradientResult r;
  try {
    r = build_gradients(g, opsets, req);
  } catch (const Error& e) {
    c.fail("differentiating " + what + ": " + e.what());
  }
  std::unordered_map<std::string, std::string> renamed;
  for (size_t i = n_forward; i < g.nodes.size(); ++i)
    for (std::string& o : g.nodes[i].outputs)
      if (!o.empty()) o = renamed[o] = c.builder().unique_name(prefix + o);
  for (size_t i = n_forward; i < g.nodes.size(); ++i)
    for (std::string& in : g.nodes[i].inputs)
      if (auto it = renamed.find(in); it != renamed.end()) in = it->second;
  for (const auto& [from, to] : renamed)
    if (auto it = g.value_info.find(from); it != g.value_info.end()) g.value_info[to] = it->second;
  std::map<std::string, std::string> grads;
  for (const std::string& w : req.wrt) {
    const std::string& name = r.grads.at(w);
    auto it = renamed.find(name);
    grads[w] = it == renamed.end() ? name : it->second;
  }
  return grads;
}

// The backward of one subgraph without inputs of its own (an If branch): a graph, also without inputs, that
// recomputes `body`, reads the incoming gradients `seeds` (one per body output; invalid where none flows) from
// the enclosing scope, and returns the gradient of every value in `wrt` (values of the enclosing scope), zeros
// for those the body does not read.
std::shared_ptr<Graph> backward_of_branch(RuleContext& c, const Graph& body, const std::string& label,
                                          const std::vector<std::string>& wrt, const std::vector<Expr>& seeds) {
  if (!body.inputs.empty()) c.fail("'" + label + "' declares inputs; an If branch takes none");
  const Graph& outer = c.builder().graph();
  Graph g = body;
  // While the engine works on the branch, the enclosing values it reads (and the seeds, and every wrt) are
  // inputs of it, which gives the engine their types; they become outer references again afterwards.
  Node probe;
  probe.attributes["g"] = std::make_shared<Graph>(body);
  std::vector<std::string> outside = subgraph_outer_references(probe);
  for (const std::string& w : wrt) outside.push_back(w);
  for (const Expr& s : seeds)
    if (s.valid()) outside.push_back(s.name);
  std::unordered_map<std::string, bool> added;
  for (const std::string& v : outside) {
    if (added[v]) continue;
    added[v] = true;
    const TypeInfo* t = outer.type_of(v);
    if (!t) c.fail("'" + label + "' reads '" + v + "', whose type is unknown; run shape inference first");
    g.inputs.push_back({v, *t});
  }
  GradientRequest req;
  req.wrt = wrt;
  for (size_t k = 0; k < seeds.size() && k < g.outputs.size(); ++k)
    if (seeds[k].valid() && is_floating(seeds[k].dtype())) {
      req.outputs.push_back(g.outputs[k].name);
      req.output_grads.push_back(seeds[k].name);
    }
  const std::map<std::string, std::string> grads =
      differentiate_subgraph(c, g, req, c.node().name + "/" + label + "/", "'" + label + "'");
  g.inputs.clear();
  g.outputs.clear();
  for (const std::string& w : wrt) g.outputs.push_back({grads.at(w), *outer.type_of(w)});
  g.name = body.name + "_grad";
  return std::make_shared<Graph>(std::move(g));
}

void if_rule(RuleContext& c) {
  // Inputs past cond are the branches' outer references; cond itself takes no gradient.
  std::vector<size_t> targets;
  std::vector<std::string> wrt;
  for (size_t i = 1; i < c.num_inputs(); ++i)
    if (c.needs_dX(i)) {
      targets.push_back(i);
      wrt.push_back(c.X(i).name);
    }
  if (targets.empty()) return;
  // The backward branches read (recompute from) every value the forward branches read: the memory planner and
  // the Yield split must keep them.
  for (size_t i = 1; i < c.num_inputs(); ++i)
    if (c.has_input(i) && c.builder().graph().type_of(c.node().inputs[i])) c.X(i);
  std::vector<Expr> seeds;
  for (size_t k = 0; k < c.num_outputs(); ++k) seeds.push_back(c.dY(k));
  auto then_grad = backward_of_branch(c, graph_attr(c, "then_branch"), "then_branch", wrt, seeds);
  auto else_grad = backward_of_branch(c, graph_attr(c, "else_branch"), "else_branch", wrt, seeds);
  GraphBuilder& b = c.builder();
  std::vector<std::string> outs = b.add_node("If", {c.X(0).name}, targets.size(),
                                             {{"then_branch", then_grad}, {"else_branch", else_grad}});
  for (size_t j = 0; j < targets.size(); ++j) {
    const TypeInfo t = c.X(targets[j]).type;
    b.set_type(outs[j], t);
    c.set_dX(targets[j], value(b, outs[j], t));
  }
}

// ---- Scan ----
//
// Forward: states s (N), scan inputs x (M), per iteration the body B(s, x_t) -> (s', y_t) (K scan outputs),
// reading outer values O. Backward: a Scan over the iterations in reverse whose body recomputes one forward
// step from the state that entered it and differentiates it (build_gradients on B):
//   carried: ds (the gradient of the state leaving the step; starts as dY of the final states) and one
//            accumulator per outer value needing a gradient (starts at zero);
//   scanned: the states entering each step, x_t, dy_t;
//   outputs: ds for the step before, accumulators plus this step's dO, and dx_t as scan outputs.
// The states entering each step are recomputed, not saved: a second forward Scan (in the backward graph) whose
// body also emits its incoming states as scan outputs. A rule sees a copy of the forward node and cannot give
// it extra outputs, and recomputing leaves the forward graph as written; the cost is one more forward pass,
// and the stacked states (L times the state size) live only in the backward graph.

// n's inputs are its own, then its subgraphs' outer references (the engine's copy): how many are its own.
size_t own_inputs(const RuleContext& c) { return c.num_inputs() - subgraph_outer_references(c.node()).size(); }

std::vector<int64_t> ints_or(const Node& n, const std::string& a, size_t count, int64_t fill) {
  return n.attr_ints(a, std::vector<int64_t>(count, fill));
}

TypeInfo without_dim(TypeInfo t, int64_t axis) {
  if (t.shape) t.shape->erase(t.shape->begin() + axis);
  return t;
}

int64_t normalized(int64_t axis, const TypeInfo& t) {
  const int64_t r = t.shape ? static_cast<int64_t>(t.shape->size()) : 0;
  return axis < 0 ? axis + r : axis;
}

void scan_rule(RuleContext& c) {
  if (c.opset() < 9) c.fail("the gradient of Scan needs opset 9 or later (opset 8's batch axis is not supported)");
  const Node& n = c.node();
  const Graph& body = graph_attr(c, "body");
  const size_t own = own_inputs(c);
  const size_t M = static_cast<size_t>(n.attr_int("num_scan_inputs", 0));
  if (M < 1 || M > own) c.fail("num_scan_inputs must be between 1 and the number of inputs");
  const size_t N = own - M, K = c.num_outputs() - N;
  if (body.inputs.size() != N + M || body.outputs.size() != N + K)
    c.fail("the body's inputs and outputs do not match the node's states, scan inputs and scan outputs");
  for (size_t i = 0; i < own; ++i)
    if (!c.has_input(i) || !c.X(i).valid() || !c.X(i).shape())
      c.fail("the gradient of Scan needs every state and scan input with a known type and rank; input " +
             std::to_string(i) + " has none");
  // States, scan inputs and scan outputs that are not floating-point (an int counter, Loop's iteration numbers
  // below) take no gradient: they are recomputed with the rest, and no gradient is carried or scanned for them.
  std::vector<size_t> float_states, float_scans, float_outs;
  for (size_t i = 0; i < N; ++i)
    if (is_floating(c.X(i).dtype())) float_states.push_back(i);
  for (size_t j = 0; j < M; ++j)
    if (is_floating(c.X(N + j).dtype())) float_scans.push_back(j);
  for (size_t k = 0; k < K; ++k)
    if (!c.Y(N + k).valid() || is_floating(c.Y(N + k).dtype())) float_outs.push_back(k);
  std::vector<size_t> outer_targets;  // indices of the outer references that need a gradient
  for (size_t i = own; i < c.num_inputs(); ++i)
    if (c.needs_dX(i) && is_floating(c.X(i).dtype())) outer_targets.push_back(i);
  for (size_t i = own; i < c.num_inputs(); ++i)
    if (c.has_input(i) && c.builder().graph().type_of(n.inputs[i])) c.X(i);  // recomputed from: saved
  const std::vector<int64_t> in_axes = ints_or(n, "scan_input_axes", M, 0);
  const std::vector<int64_t> in_dirs = ints_or(n, "scan_input_directions", M, 0);
  const std::vector<int64_t> out_axes = ints_or(n, "scan_output_axes", K, 0);
  const std::vector<int64_t> out_dirs = ints_or(n, "scan_output_directions", K, 0);
  GraphBuilder& b = c.builder();
  const std::string tag = (n.name.empty() ? std::string("scan") : n.name) + "/";

  // 1. The states entering every step, recomputed by a Scan whose body also emits its incoming states.
  auto replay = std::make_shared<Graph>(body);
  replay->name = body.name + "_states";
  std::vector<int64_t> replay_axes = out_axes, replay_dirs = out_dirs;
  for (size_t i = 0; i < N; ++i) {
    const std::string copy = b.unique_name(tag + "state_in_" + std::to_string(i));
    Node id;
    id.name = copy;
    id.op_type = "Identity";
    id.inputs = {body.inputs[i].name};
    id.outputs = {copy};
    replay->nodes.push_back(id);
    replay->outputs.push_back({copy, c.X(i).type});
    replay_axes.push_back(0);
    replay_dirs.push_back(0);
  }
  std::map<std::string, Attribute> replay_attrs = n.attributes;
  replay_attrs["body"] = replay;
  replay_attrs["scan_output_axes"] = replay_axes;
  replay_attrs["scan_output_directions"] = replay_dirs;
  std::vector<std::string> replay_in(n.inputs.begin(), n.inputs.begin() + static_cast<std::ptrdiff_t>(own));
  for (size_t i = 0; i < own; ++i) c.X(i);
  std::vector<std::string> replay_out = b.add_node("Scan", replay_in, N + K + N, replay_attrs);
  std::vector<std::string> states_seq(replay_out.begin() + static_cast<std::ptrdiff_t>(N + K), replay_out.end());

  // 2. The backward body: one forward step recomputed and differentiated.
  Graph g = body;
  g.name = body.name + "_grad";
  // Types: the node's, which are concrete (the body may declare looser ones).
  const int64_t len_axis = normalized(in_axes[0], c.X(N).type);
  for (size_t i = 0; i < N; ++i) g.inputs[i].type = c.X(i).type;
  for (size_t j = 0; j < M; ++j) g.inputs[N + j].type = without_dim(c.X(N + j).type, normalized(in_axes[j], c.X(N + j).type));
  (void)len_axis;
  std::vector<std::string> ds_in, acc_in, dy_in;  // per entry of float_states, outer_targets, float_outs
  std::vector<ValueInfo> carried_inputs, scanned_extra;
  for (size_t i : float_states) {
    ds_in.push_back(b.unique_name(tag + "d_state_" + std::to_string(i)));
    carried_inputs.push_back({ds_in.back(), c.X(i).type});
  }
  for (size_t p : outer_targets) {
    acc_in.push_back(b.unique_name(tag + "d_" + n.inputs[p] + "_acc"));
    carried_inputs.push_back({acc_in.back(), c.X(p).type});
  }
  for (size_t k : float_outs) {
    dy_in.push_back(b.unique_name(tag + "d_out_" + std::to_string(k)));
    const Expr y = c.Y(N + k);
    if (!y.valid()) c.fail("scan output " + std::to_string(k) + " has no known type");
    scanned_extra.push_back({dy_in.back(), without_dim(y.type, normalized(out_axes[k], y.type))});
  }
  // While the engine works on it: the step's inputs, the seeds and the outer values as graph inputs.
  std::vector<ValueInfo> step_inputs = g.inputs;
  g.inputs.insert(g.inputs.begin(), carried_inputs.begin(), carried_inputs.end());
  for (const ValueInfo& v : scanned_extra) g.inputs.push_back(v);
  Node probe;
  probe.attributes["g"] = std::make_shared<Graph>(body);
  std::vector<ValueInfo> outer_inputs;
  for (const std::string& v : subgraph_outer_references(probe)) {
    const TypeInfo* t = b.graph().type_of(v);
    if (!t) c.fail("the body reads '" + v + "', whose type is unknown; run shape inference first");
    outer_inputs.push_back({v, *t});
  }
  for (size_t p : outer_targets)
    if (std::none_of(outer_inputs.begin(), outer_inputs.end(), [&](const ValueInfo& v) { return v.name == n.inputs[p]; }))
      outer_inputs.push_back({n.inputs[p], c.X(p).type});
  const size_t declared = g.inputs.size();
  for (const ValueInfo& v : outer_inputs) g.inputs.push_back(v);
  GradientRequest req;
  for (size_t i : float_states) req.wrt.push_back(body.inputs[i].name);
  for (size_t j : float_scans) req.wrt.push_back(body.inputs[N + j].name);
  for (size_t p : outer_targets) req.wrt.push_back(n.inputs[p]);
  for (size_t q = 0; q < float_states.size(); ++q) {
    req.outputs.push_back(body.outputs[float_states[q]].name);
    req.output_grads.push_back(ds_in[q]);
  }
  for (size_t q = 0; q < float_outs.size(); ++q) {
    req.outputs.push_back(body.outputs[N + float_outs[q]].name);
    req.output_grads.push_back(dy_in[q]);
  }
  const std::map<std::string, std::string> grads = differentiate_subgraph(c, g, req, tag + "body_grad/", "the body");
  g.inputs.resize(declared);  // the outer values are outer references again
  auto grad_of = [&](const std::string& w) { return grads.at(w); };
  g.outputs.clear();
  for (size_t i : float_states) g.outputs.push_back({grad_of(body.inputs[i].name), c.X(i).type});
  for (size_t q = 0; q < outer_targets.size(); ++q) {
    const std::string sum = b.unique_name(tag + "d_" + n.inputs[outer_targets[q]] + "_acc_next");
    Node add;
    add.name = sum;
    add.op_type = "Add";
    add.inputs = {acc_in[q], grad_of(n.inputs[outer_targets[q]])};
    add.outputs = {sum};
    g.nodes.push_back(add);
    g.outputs.push_back({sum, c.X(outer_targets[q]).type});
  }
  for (size_t j : float_scans) g.outputs.push_back({grad_of(body.inputs[N + j].name), step_inputs[N + j].type});

  // 3. The reverse Scan: every sequence is read in the opposite direction of its forward pass, so its step t'
  // is the forward step L-1-t'.
  std::vector<std::string> bwd_in;
  for (size_t i : float_states) bwd_in.push_back(c.dY(i).name);
  for (size_t p : outer_targets) bwd_in.push_back(zeros_like(c.X(p)).name);
  std::vector<int64_t> bwd_in_axes, bwd_in_dirs, bwd_out_axes, bwd_out_dirs;
  for (size_t i = 0; i < N; ++i) {
    bwd_in.push_back(states_seq[i]);
    b.set_type(states_seq[i], TypeInfo{c.X(i).dtype(), std::nullopt});
    bwd_in_axes.push_back(0);
    bwd_in_dirs.push_back(1);
  }
  for (size_t j = 0; j < M; ++j) {
    bwd_in.push_back(n.inputs[N + j]);
    bwd_in_axes.push_back(in_axes[j]);
    bwd_in_dirs.push_back(1 - in_dirs[j]);
  }
  for (size_t j : float_scans) {
    bwd_out_axes.push_back(in_axes[j]);
    bwd_out_dirs.push_back(1 - in_dirs[j]);
  }
  for (size_t k : float_outs) {
    bwd_in.push_back(c.dY(N + k).name);
    bwd_in_axes.push_back(out_axes[k]);
    bwd_in_dirs.push_back(1 - out_dirs[k]);
  }
  // The backward body takes the saved states and x_t under the forward body's own input names, after ds and the
  // accumulators: reorder its declared inputs to [ds, acc, states, x, dy] (they already are).
  auto bwd_body = std::make_shared<Graph>(std::move(g));
  std::map<std::string, Attribute> attrs{{"body", bwd_body},
                                         {"num_scan_inputs", static_cast<int64_t>(N + M + float_outs.size())},
                                         {"scan_input_axes", bwd_in_axes},
                                         {"scan_input_directions", bwd_in_dirs},
                                         {"scan_output_axes", bwd_out_axes},
                                         {"scan_output_directions", bwd_out_dirs}};
  const size_t S = float_states.size();
  std::vector<std::string> outs = b.add_node("Scan", bwd_in, S + outer_targets.size() + float_scans.size(), attrs);
  auto emit = [&](size_t input, const std::string& name) {
    b.set_type(name, c.X(input).type);
    c.set_dX(input, value(b, name, c.X(input).type));
  };
  for (size_t q = 0; q < S; ++q) emit(float_states[q], outs[q]);
  for (size_t q = 0; q < outer_targets.size(); ++q) emit(outer_targets[q], outs[S + q]);
  for (size_t q = 0; q < float_scans.size(); ++q) emit(N + float_scans[q], outs[S + outer_targets.size() + q]);
}

// ---- Loop ----
//
// Loop(M, cond, v) runs body(i, cond_i, v_i) -> (cond_{i+1}, v_{i+1}, y_i) while i < M and the condition holds. Every
// iteration that runs does so with its condition true, so a recomputed step takes the constant true there. Two
// backward passes, by what the executor can know when it plans the step (it plans static shapes, folding values
// computed from constants and shapes: executor/plan.cpp):
//
// - The number of iterations is M, and M is known at plan time: no cond input (whereupon ONNX ignores the body's
//   condition), or a constant true one that the body passes through or keeps true, and M a constant or computed
//   from shapes (torch's `for _ in range(x.size(0))` with a dynamic axis). Then Loop(M, cond, v) is the Scan over
//   the iteration numbers Range(0, M) with the carried values as states: body'(v, i) = body(i, true, v) without
//   the condition output, its scan outputs stacked on axis 0 like Loop's. Its gradient is that Scan's (above): a
//   Scan that recomputes and stacks the states entering each step (saved for the backward, L times one state),
//   and the reverse Scan. One extra forward run.
// - Otherwise (a condition that can end the loop early, a trip count computed from data) the number of
//   iterations L is known only when the loop has run, and so would be the length of any stack of saved states.
//   See loop_by_recomputation below: nothing there has a length of L.

// True when the body's condition output is, through Identity nodes, its condition input or a constant true (a
// Constant or initializer of the body, or a constant of the enclosing graph `outer`: torch's export writes
// Identity of an outer Constant): the loop cannot end before its trip count.
bool passes_condition_through(const Graph& body, const Graph& outer) {
  if (body.inputs.size() < 2 || body.outputs.empty()) return false;
  std::string out = body.outputs[0].name;
  for (int hops = 0; hops < 8 && out != body.inputs[1].name; ++hops) {
    auto it = std::find_if(body.nodes.begin(), body.nodes.end(), [&](const Node& n) {
      return std::find(n.outputs.begin(), n.outputs.end(), out) != n.outputs.end();
    });
    if (it == body.nodes.end() || it->op_type != "Identity") break;
    out = it->inputs.at(0);
  }
  if (out == body.inputs[1].name) return true;
  const TensorData* t = rules::constant_tensor(body, out);
  const bool local = t || std::any_of(body.nodes.begin(), body.nodes.end(), [&](const Node& n) {
    return std::find(n.outputs.begin(), n.outputs.end(), out) != n.outputs.end();
  });
  if (!t && !local) t = rules::constant_tensor(outer, out);
  return t && t->dtype == DType::Bool && t->numel() == 1 && t->as<bool>()[0];
}

// True when value v of g is computed from constants and shapes alone, so that the executor folds it when it plans
// the step (executor/plan.cpp folds every node whose inputs it knows, and Shape and Size of any value). A graph
// input is fed at run time; random ops and control flow are never folded.
bool known_when_planned(const Graph& g, const std::string& v, int depth = 0) {
  if (g.initializers.count(v)) return true;
  if (depth > 64 || g.find_input(v)) return false;
  auto it = std::find_if(g.nodes.begin(), g.nodes.end(), [&](const Node& n) {
    return std::find(n.outputs.begin(), n.outputs.end(), v) != n.outputs.end();
  });
  if (it == g.nodes.end()) return false;
  const Node& p = *it;
  if (p.op_type == "Constant" || p.op_type == "Shape" || p.op_type == "Size") return p.domain.empty();
  if (!p.domain.empty() || p.op_type.starts_with("Random") || p.op_type == "Bernoulli" || p.op_type == "Multinomial" ||
      p.op_type == "Dropout" || p.op_type == "If" || p.op_type == "Loop" || p.op_type == "Scan")
    return false;
  return std::all_of(p.inputs.begin(), p.inputs.end(),
                     [&](const std::string& in) { return in.empty() || known_when_planned(g, in, depth + 1); });
}

Node make_node(const std::string& name, const std::string& op, std::vector<std::string> inputs, std::string output,
               std::map<std::string, Attribute> attrs = {}) {
  Node k;
  k.name = name;
  k.op_type = op;
  k.inputs = std::move(inputs);
  k.outputs = {std::move(output)};
  k.attributes = std::move(attrs);
  return k;
}

// Renames, in g and in the subgraphs of its nodes (copied, since the original shares them), every value in `to`.
void rename_values(Graph& g, const std::unordered_map<std::string, std::string>& to) {
  auto fix = [&](std::string& v) {
    if (auto it = to.find(v); it != to.end()) v = it->second;
  };
  for (ValueInfo& v : g.inputs) fix(v.name);
  for (ValueInfo& v : g.outputs) fix(v.name);
  std::map<std::string, TensorData> inits;
  for (auto& [name, t] : g.initializers) inits[to.count(name) ? to.at(name) : name] = std::move(t);
  g.initializers = std::move(inits);
  std::map<std::string, TypeInfo> infos;
  for (auto& [name, t] : g.value_info) infos[to.count(name) ? to.at(name) : name] = std::move(t);
  g.value_info = std::move(infos);
  for (Node& n : g.nodes) {
    for (std::string& v : n.inputs) fix(v);
    for (std::string& v : n.outputs) fix(v);
    for (auto& [key, a] : n.attributes)
      if (auto* sub = std::get_if<std::shared_ptr<Graph>>(&a); sub && *sub) {
        auto copy = std::make_shared<Graph>(**sub);
        rename_values(*copy, to);
        a = copy;
      }
  }
}

// A copy of `body` whose own values (inputs, node outputs, initializers) have fresh names, also where its nested
// subgraphs read them: it can then sit inside a graph that defines the originals, which ONNX forbids a subgraph
// to redefine.
std::shared_ptr<Graph> with_fresh_names(GraphBuilder& b, const Graph& body, const std::string& tag) {
  std::unordered_map<std::string, std::string> to;
  auto fresh = [&](const std::string& v) {
    if (!v.empty() && !to.count(v)) to[v] = b.unique_name(tag + v);
  };
  for (const ValueInfo& v : body.inputs) fresh(v.name);
  for (const auto& [name, t] : body.initializers) fresh(name);
  for (const Node& n : body.nodes)
    for (const std::string& o : n.outputs) fresh(o);
  auto g = std::make_shared<Graph>(body);
  rename_values(*g, to);
  return g;
}

// The Loop whose number of iterations L is only known when it runs:
//   1. a replay Loop, the body with its scan outputs dropped and a counter carried along, gives L;
//   2. the backward Loop runs L iterations, k = 0..L-1, each for the forward step t = L-1-k: an inner Loop of t
//      iterations (no condition: all of them ran) recomputes the state v_t entering step t from the initial
//      values, and step t, recomputed from v_t, is differentiated (build_gradients on the body) with the carried
//      gradient of its state output and slice t of each scan output's gradient. It carries dv and one accumulator
//      per outer value that needs a gradient.
// Recompute rather than save: every value keeps a shape the plan knows, and memory stays that of one state, at
// the cost of L(L+1)/2 + 2L body runs instead of 2L. That suits loops that run until a condition holds (a few to
// tens of iterations); loops whose trip count the plan knows take the Scan path, linear in L.
void loop_by_recomputation(RuleContext& c, const Graph& body) {
  const Node& n = c.node();
  GraphBuilder& b = c.builder();
  const size_t own = own_inputs(c), N = own - 2, K = c.num_outputs() - N;
  const std::string tag = (n.name.empty() ? std::string("loop") : n.name) + "/";
  const TypeInfo i64{DType::Int64, Shape{}}, boolean{DType::Bool, Shape{}};
  for (size_t i = 2; i < own; ++i)
    if (!c.X(i).valid() || !c.X(i).shape())
      c.fail("the gradient of Loop needs every loop-carried value with a known type and rank; input " +
             std::to_string(i) + " has none");
  // Carried values and scan outputs that are not floating-point (an int counter, a flag) take no gradient: they
  // are recomputed with the rest, and no gradient is carried for them.
  std::vector<size_t> fs, fk;  // floating-point carried values and scan outputs
  for (size_t j = 0; j < N; ++j)
    if (is_floating(c.X(2 + j).dtype())) fs.push_back(j);
  for (size_t k = 0; k < K; ++k)
    if (c.Y(N + k).valid() && is_floating(c.Y(N + k).dtype())) fk.push_back(k);
  std::vector<size_t> outer_targets;
  for (size_t i = own; i < c.num_inputs(); ++i)
    if (c.needs_dX(i) && is_floating(c.X(i).dtype())) outer_targets.push_back(i);
  for (size_t i = 0; i < c.num_inputs(); ++i)  // the replays read every input again: saved
    if (c.has_input(i) && b.graph().type_of(n.inputs[i])) c.X(i);

  Graph stepper = body;  // what the replays run: the body without its scan outputs
  stepper.outputs.resize(1 + N);

  // 1. L: the forward loop again, counting.
  auto counting = std::make_shared<Graph>(stepper);
  counting->name = body.name + "_count";
  const std::string count = b.unique_name(tag + "count"), one = b.unique_name(tag + "count_one"),
                    next = b.unique_name(tag + "count_next");
  counting->inputs.push_back({count, i64});
  counting->nodes.push_back(make_node(one, "Constant", {}, one, {{"value", TensorData::scalar<int64_t>(1)}}));
  counting->nodes.push_back(make_node(next, "Add", {count, one}, next));
  counting->outputs.push_back({next, i64});
  std::vector<std::string> count_in(n.inputs.begin(), n.inputs.begin() + static_cast<std::ptrdiff_t>(own));
  count_in.push_back(b.constant(TensorData::scalar<int64_t>(0), tag + "count_from"));
  const std::vector<std::string> counted = b.add_node("Loop", count_in, N + 1, {{"body", counting}});
  for (size_t j = 0; j < N; ++j) b.set_type(counted[j], c.X(2 + j).type);
  const std::string L = counted[N];
  b.set_type(L, i64);

  // 2. One step, differentiated: while the engine works on it, the step's inputs, the incoming gradients and the
  // outer values are inputs of it (as in the Scan rule).
  Graph g = body;
  g.name = body.name + "_grad";
  g.inputs[0].type = i64;
  g.inputs[1].type = boolean;
  for (size_t j = 0; j < N; ++j) g.inputs[2 + j].type = c.X(2 + j).type;
  std::vector<std::string> ds_in, dy_in, acc_in;  // per entry of fs, fk and outer_targets
  for (size_t j : fs) {
    ds_in.push_back(b.unique_name(tag + "d_state_" + std::to_string(j)));
    g.inputs.push_back({ds_in.back(), c.X(2 + j).type});
  }
  for (size_t k : fk) {
    const Expr y = c.Y(N + k);
    if (!y.shape()) c.fail("scan output " + std::to_string(k) + " has no known rank");
    dy_in.push_back(b.unique_name(tag + "d_out_" + std::to_string(k)));
    g.inputs.push_back({dy_in.back(), without_dim(y.type, 0)});
  }
  Node probe;
  probe.attributes["g"] = std::make_shared<Graph>(body);
  for (const std::string& v : subgraph_outer_references(probe)) {
    const TypeInfo* t = b.graph().type_of(v);
    if (!t) c.fail("the body reads '" + v + "', whose type is unknown; run shape inference first");
    g.inputs.push_back({v, *t});
  }
  GradientRequest req;
  for (size_t j : fs) req.wrt.push_back(body.inputs[2 + j].name);
  for (size_t p : outer_targets) req.wrt.push_back(n.inputs[p]);
  for (size_t q = 0; q < fs.size(); ++q) {
    req.outputs.push_back(body.outputs[1 + fs[q]].name);
    req.output_grads.push_back(ds_in[q]);
  }
  for (size_t q = 0; q < fk.size(); ++q) {
    req.outputs.push_back(body.outputs[1 + N + fk[q]].name);
    req.output_grads.push_back(dy_in[q]);
  }
  const std::map<std::string, std::string> grads = differentiate_subgraph(c, g, req, tag + "body_grad/", "the body");
  auto grad_of = [&](const std::string& w) { return grads.at(w); };

  // The step's inputs now come from the backward iteration: t = L-1-k, i = t, the condition true, v_t recomputed
  // by the inner Loop, slice t of each scan output's gradient.
  const std::string k_in = b.unique_name(tag + "k"), k_cond = b.unique_name(tag + "k_cond");
  g.inputs = {{k_in, i64}, {k_cond, boolean}};
  for (size_t q = 0; q < fs.size(); ++q) g.inputs.push_back({ds_in[q], c.X(2 + fs[q]).type});
  for (size_t p : outer_targets) {
    acc_in.push_back(b.unique_name(tag + "d_" + n.inputs[p] + "_acc"));
    g.inputs.push_back({acc_in.back(), c.X(p).type});
  }
  std::vector<Node> prelude;
  const std::string last = b.unique_name(tag + "last"), t = b.unique_name(tag + "t"), t_one = b.unique_name(tag + "one");
  prelude.push_back(make_node(t_one, "Constant", {}, t_one, {{"value", TensorData::scalar<int64_t>(1)}}));
  prelude.push_back(make_node(last, "Sub", {L, t_one}, last));
  prelude.push_back(make_node(t, "Sub", {last, k_in}, t));
  prelude.push_back(make_node(body.inputs[0].name, "Identity", {t}, body.inputs[0].name));
  prelude.push_back(make_node(body.inputs[1].name, "Constant", {}, body.inputs[1].name,
                              {{"value", TensorData::scalar<bool>(true)}}));
  if (N > 0) {
    Node replay;
    replay.name = b.unique_name(tag + "state_at_t");
    replay.op_type = "Loop";
    replay.inputs = {t, ""};
    for (size_t j = 0; j < N; ++j) {
      replay.inputs.push_back(n.inputs[2 + j]);
      replay.outputs.push_back(body.inputs[2 + j].name);
    }
    auto inner = with_fresh_names(b, stepper, tag + "replay/");
    inner->name = body.name + "_replay";
    replay.attributes["body"] = inner;
    prelude.push_back(replay);
  }
  for (size_t q = 0; q < fk.size(); ++q)
    prelude.push_back(make_node(dy_in[q], "Gather", {c.dY(N + fk[q]).name, t}, dy_in[q], {{"axis", int64_t{0}}}));
  g.nodes.insert(g.nodes.begin(), prelude.begin(), prelude.end());
  const std::string keep_going = b.unique_name(tag + "k_cond_out");
  g.nodes.push_back(make_node(keep_going, "Constant", {}, keep_going, {{"value", TensorData::scalar<bool>(true)}}));
  g.outputs = {{keep_going, boolean}};
  for (size_t j : fs) g.outputs.push_back({grad_of(body.inputs[2 + j].name), c.X(2 + j).type});
  for (size_t q = 0; q < outer_targets.size(); ++q) {
    const std::string sum = b.unique_name(tag + "d_" + n.inputs[outer_targets[q]] + "_acc_next");
    g.nodes.push_back(make_node(sum, "Add", {acc_in[q], grad_of(n.inputs[outer_targets[q]])}, sum));
    g.outputs.push_back({sum, c.X(outer_targets[q]).type});
  }

  std::vector<std::string> bwd_in{L, ""};
  for (size_t j : fs) bwd_in.push_back(c.dY(j).name);
  for (size_t p : outer_targets) bwd_in.push_back(zeros_like(c.X(p)).name);
  std::vector<std::string> outs =
      b.add_node("Loop", bwd_in, fs.size() + outer_targets.size(), {{"body", std::make_shared<Graph>(std::move(g))}});
  auto emit = [&](size_t input, const std::string& name) {
    b.set_type(name, c.X(input).type);
    c.set_dX(input, value(b, name, c.X(input).type));
  };
  for (size_t q = 0; q < fs.size(); ++q) emit(2 + fs[q], outs[q]);
  for (size_t q = 0; q < outer_targets.size(); ++q) emit(outer_targets[q], outs[fs.size() + q]);
}

void loop_rule(RuleContext& c) {
  const Node& n = c.node();
  const Graph& body = graph_attr(c, "body");
  GraphBuilder& b = c.builder();
  const size_t own = own_inputs(c);
  if (own < 2 || body.inputs.size() != own || body.outputs.size() != 1 + c.num_outputs())
    c.fail("the body's inputs and outputs do not match the node's");
  const size_t N = own - 2;
  std::optional<std::vector<int64_t>> trips = c.has_input(0) ? rules::constant_int64s(b.graph(), n.inputs[0]) : std::nullopt;
  const TensorData* cond = c.has_input(1) ? rules::constant_tensor(b.graph(), n.inputs[1]) : nullptr;
  const bool starts = !c.has_input(1) || (cond && cond->dtype == DType::Bool && cond->numel() == 1 && cond->as<bool>()[0]);
  // Without the cond input ONNX ignores the body's condition: M iterations run.
  const bool runs_m = starts && (!c.has_input(1) || passes_condition_through(body, b.graph()));
  const bool m_planned = c.has_input(0) && (trips ? trips->size() == 1 : known_when_planned(b.graph(), n.inputs[0]));
  if (!runs_m || !m_planned) return loop_by_recomputation(c, body);

  // The iteration numbers 0..M-1: a constant, or Range(0, M) that the plan folds.
  std::string iters;
  TypeInfo iters_type;
  if (trips) {
    const int64_t T = std::max<int64_t>(0, (*trips)[0]);
    std::vector<int64_t> iota(static_cast<size_t>(T));
    for (int64_t i = 0; i < T; ++i) iota[static_cast<size_t>(i)] = i;
    iters = b.constant(TensorData::from<int64_t>({T}, std::span<const int64_t>(iota)), n.name + "_iterations");
    iters_type = {DType::Int64, Shape{Dim::of(T)}};
  } else {
    const Expr m = reshape(c.X(0), int64s(b, {}), Shape{});
    const std::string from = b.constant(TensorData::scalar<int64_t>(0), n.name + "_first_iteration");
    const std::string step = b.constant(TensorData::scalar<int64_t>(1), n.name + "_iteration_step");
    iters = b.add("Range", {from, m.name, step});
    iters_type = {DType::Int64, Shape{Dim{}}};
  }
  b.set_type(iters, iters_type);

  // body'(v..., i) -> (v'..., scan outputs...), the condition a constant true inside.
  auto scan_body = std::make_shared<Graph>(body);
  scan_body->inputs.clear();
  for (size_t i = 0; i < N; ++i) scan_body->inputs.push_back(body.inputs[2 + i]);
  scan_body->inputs.push_back({body.inputs[0].name, {DType::Int64, Shape{}}});
  Node t;
  t.name = body.inputs[1].name;
  t.op_type = "Constant";
  t.outputs = {body.inputs[1].name};
  t.attributes["value"] = TensorData::scalar<bool>(true);
  scan_body->nodes.insert(scan_body->nodes.begin(), t);
  scan_body->outputs.erase(scan_body->outputs.begin());

  Node scan;
  scan.name = n.name;
  scan.op_type = "Scan";
  scan.attributes["body"] = scan_body;
  scan.attributes["num_scan_inputs"] = int64_t{1};
  std::vector<Expr> xs, ys, dys;
  std::vector<bool> needs;
  for (size_t i = 0; i < N; ++i) {
    scan.inputs.push_back(n.inputs[2 + i]);
    xs.push_back(c.X(2 + i));
    needs.push_back(c.needs_dX(2 + i));
  }
  scan.inputs.push_back(iters);
  xs.push_back(value(b, iters, iters_type));
  needs.push_back(false);
  std::unordered_map<std::string, size_t> loop_input;  // outer reference -> its index among the Loop's inputs
  for (size_t i = own; i < c.num_inputs(); ++i) loop_input[n.inputs[i]] = i;
  for (const std::string& v : subgraph_outer_references(scan)) {
    scan.inputs.push_back(v);
    auto it = loop_input.find(v);
    const bool typed = it != loop_input.end() && b.graph().type_of(v);
    xs.push_back(typed ? c.X(it->second) : Expr{});
    needs.push_back(typed && c.needs_dX(it->second));
  }
  scan.outputs = n.outputs;
  for (size_t o = 0; o < c.num_outputs(); ++o) {
    ys.push_back(c.Y(o));
    // A value that is not floating-point (an int counter) has no incoming gradient; a carried one's type is its
    // initial value's, which torch's export declares where it may leave the output untyped.
    const Expr typed = o < N ? c.X(2 + o) : c.Y(o);
    dys.push_back(typed.valid() && !is_floating(typed.dtype()) ? Expr{} : c.dY(o));
  }
  RuleContext as_scan(b, scan, c.opset(), xs, ys, dys, needs);
  scan_rule(as_scan);
  const auto& dx = as_scan.results();
  for (size_t i = 0; i < N; ++i)
    if (i < dx.size() && dx[i]) c.set_dX(2 + i, *dx[i]);
  for (size_t k = N + 1; k < scan.inputs.size() && k < dx.size(); ++k)
    if (dx[k]) c.set_dX(loop_input.at(scan.inputs[k]), *dx[k]);
}

}  // namespace

void register_control_flow_rules(GradientRegistry& r) {
  r.add("If", if_rule);
  r.add("Scan", scan_rule);
  r.add("Loop", loop_rule);
}

}  // namespace onnxtrain
