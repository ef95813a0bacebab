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
#include <unordered_map>

#include "gradients/builder.h"
#include "gradients/rule.h"
#include "graph/error.h"
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

// The backward of one subgraph without inputs of its own (an If branch): a graph, also without inputs, that
// recomputes `body`, reads the incoming gradients `seeds` (one per body output; invalid where none flows) from
// the enclosing scope, and returns the gradient of every value in `wrt` (values of the enclosing scope), zeros
// for those the body does not read.
std::shared_ptr<Graph> backward_of_branch(RuleContext& c, const Graph& body, const std::string& label,
                                          const std::vector<std::string>& wrt, const std::vector<Expr>& seeds) {
  if (!body.inputs.empty()) c.fail("'" + label + "' declares inputs; an If branch takes none");
  const Graph& outer = c.builder().graph();
  const std::map<std::string, int64_t> opsets{{"", c.opset()}, {"onnxtrain", 1}};
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
  // Types of the branch's own values, which the rules need: shape inference on the branch as a model of its own.
  Model m;
  m.opset_imports = opsets;
  m.graph = g;
  infer_shapes(m);
  for (auto& [name, t] : m.graph.value_info) g.value_info.try_emplace(name, t);

  GradientRequest req;
  req.wrt = wrt;
  for (size_t k = 0; k < seeds.size() && k < g.outputs.size(); ++k)
    if (seeds[k].valid() && is_floating(seeds[k].dtype())) {
      req.outputs.push_back(g.outputs[k].name);
      req.output_grads.push_back(seeds[k].name);
    }
  const size_t n_forward = g.nodes.size();
  GradientResult r;
  try {
    r = build_gradients(g, opsets, req);
  } catch (const Error& e) {
    c.fail("differentiating '" + label + "': " + e.what());
  }
  g.inputs.clear();
  // The values the backward added get names unique in the enclosing graph too, so that none shadows (or is
  // shadowed by) a value outside the branch, which ONNX forbids.
  std::unordered_map<std::string, std::string> renamed;
  for (size_t i = n_forward; i < g.nodes.size(); ++i)
    for (std::string& o : g.nodes[i].outputs)
      if (!o.empty()) o = renamed[o] = c.builder().unique_name(c.node().name + "/" + label + "/" + o);
  for (size_t i = n_forward; i < g.nodes.size(); ++i)
    for (std::string& in : g.nodes[i].inputs)
      if (auto it = renamed.find(in); it != renamed.end()) in = it->second;
  for (const auto& [from, to] : renamed)
    if (auto it = g.value_info.find(from); it != g.value_info.end()) g.value_info[to] = it->second;
  g.outputs.clear();
  for (const std::string& w : wrt) {
    std::string grad = r.grads.at(w);
    if (auto it = renamed.find(grad); it != renamed.end()) grad = it->second;
    g.outputs.push_back({grad, *outer.type_of(w)});
  }
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

}  // namespace

void register_control_flow_rules(GradientRegistry& r) { r.add("If", if_rule); }

}  // namespace onnxtrain
