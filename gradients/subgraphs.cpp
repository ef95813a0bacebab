#include "gradients/subgraphs.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <unordered_set>

#include "gradients/fused.h"
#include "gradients/rules/util.h"

namespace onnxtrain {

const std::vector<SubgraphRule>& subgraph_rules() {
  static const std::vector<SubgraphRule> rules = {
      {"gelu_erf",
       "GELU as exported below opset 20: `x * 0.5 * (1 + Erf(x / sqrt(2)))`, the three factors multiplied in any "
       "order, the division also written as `x * (1 / sqrt(2))`",
       "GeluGrad"},
      {"gelu_tanh",
       "GELU's tanh approximation: `x * 0.5 * (1 + Tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))`, the outer factors "
       "in any order, `x^3` as `Pow(x, 3)` or two Muls",
       "GeluTanhGrad"},
  };
  return rules;
}

namespace {

bool is_op(const Node& n, const char* op) { return (n.domain.empty() || n.domain == "ai.onnx") && n.op_type == op; }

// A one-element float constant (initializer or Constant node).
std::optional<double> scalar_constant(const Graph& g, const std::string& v) {
  const TensorData* t = rules::constant_tensor(g, v);
  if (!t || t->numel() != 1) return std::nullopt;
  if (t->dtype == DType::Float32) return t->as<float>()[0];
  if (t->dtype == DType::Float64) return t->as<double>()[0];
  return std::nullopt;
}

// Constants are stored in the model's float type: float32's rounding of sqrt(2) is 1.4142135.
bool near(std::optional<double> v, double want) { return v && std::abs(*v - want) <= 1e-6 * std::abs(want); }

class Matcher {
 public:
  Matcher(const Graph& g, const std::unordered_map<std::string, int>& readers) : g_(g), readers_(readers) {
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      for (const std::string& o : g.nodes[i].outputs)
        if (!o.empty()) producer_[o] = i;
      for (const std::string& in : g.nodes[i].inputs)
        if (!in.empty()) consumers_[in].push_back(i);
    }
  }

  // The node that reads v, when v has exactly one reader and that is a node input.
  std::optional<size_t> sole_reader(const std::string& v) const {
    auto r = readers_.find(v);
    auto c = consumers_.find(v);
    if (r == readers_.end() || r->second != 1 || c == consumers_.end() || c->second.size() != 1) return std::nullopt;
    return c->second.front();
  }
  std::optional<size_t> producer(const std::string& v) const {
    auto it = producer_.find(v);
    return it == producer_.end() ? std::nullopt : std::optional<size_t>(it->second);
  }
  const Node& node(size_t i) const { return g_.nodes[i]; }
  // The operand of binary node n that is not `v`.
  static const std::string& other(const Node& n, const std::string& v) { return n.inputs[0] == v ? n.inputs[1] : n.inputs[0]; }
  std::optional<double> constant(const std::string& v) const { return scalar_constant(g_, v); }
  bool is_float(const std::string& v) const {
    const TypeInfo* t = g_.type_of(v);
    return t && (t->dtype == DType::Float32 || t->dtype == DType::Float64);
  }

  // The leaves of the product tree rooted at node `root` (a Mul), expanding operands made by a Mul that only
  // this tree reads; `muls` collects the tree's nodes.
  void product_leaves(size_t root, std::vector<std::string>& leaves, std::vector<size_t>& muls) const {
    muls.push_back(root);
    if (muls.size() > 2) return;  // no rule has more than two; a long chain of Muls is not walked to its end
    for (const std::string& in : node(root).inputs) {
      auto p = producer(in);
      if (p && is_op(node(*p), "Mul") && node(*p).inputs.size() == 2 && sole_reader(in) == root)
        product_leaves(*p, leaves, muls);
      else
        leaves.push_back(in);
    }
  }

 private:
  const Graph& g_;
  const std::unordered_map<std::string, int>& readers_;
  std::unordered_map<std::string, size_t> producer_;
  std::unordered_map<std::string, std::vector<size_t>> consumers_;
};

// The shared tail of both GELU forms, from the activation's output `act`: a = act + 1, then y = x * a * 0.5
// over two Muls in any order. Appends the nodes (the product's root last) and interior values to r.
bool match_gelu_tail(const Matcher& m, const std::string& act, const std::string& x, SubgraphMatch& r) {
  auto add = m.sole_reader(act);
  if (!add || !is_op(m.node(*add), "Add") || m.node(*add).inputs.size() != 2) return false;
  if (!near(m.constant(Matcher::other(m.node(*add), act)), 1.0)) return false;
  const std::string& a = m.node(*add).outputs[0];
  auto first_mul = m.sole_reader(a);
  if (!first_mul || !is_op(m.node(*first_mul), "Mul")) return false;
  // The product's root is the first Mul or the Mul that alone reads it.
  std::vector<size_t> roots = {*first_mul};
  if (auto up = m.sole_reader(m.node(*first_mul).outputs[0]); up && is_op(m.node(*up), "Mul")) roots.insert(roots.begin(), *up);
  for (size_t root : roots) {
    std::vector<std::string> leaves;
    std::vector<size_t> muls;
    m.product_leaves(root, leaves, muls);
    if (muls.size() != 2 || leaves.size() != 3) continue;
    auto once = [&](auto pred) { return std::count_if(leaves.begin(), leaves.end(), pred) == 1; };
    if (!once([&](const std::string& l) { return l == x; }) || !once([&](const std::string& l) { return l == a; }) ||
        !once([&](const std::string& l) { return near(m.constant(l), 0.5); }))
      continue;
    // muls[0] is the root; the other Mul comes before it.
    r.nodes.insert(r.nodes.end(), {*add, muls[1], muls[0]});
    r.interior.insert(r.interior.end(), {act, a, m.node(muls[1]).outputs[0]});
    r.output = m.node(root).outputs[0];
    return true;
  }
  return false;
}

// x from `v` = x * c or c * x (Div: x / c), c near `want`; the node index through `at`.
std::optional<std::string> scaled_input(const Matcher& m, const std::string& v, const char* op, double want, size_t& at) {
  auto p = m.producer(v);
  if (!p || !is_op(m.node(*p), op) || m.node(*p).inputs.size() != 2) return std::nullopt;
  const Node& n = m.node(*p);
  at = *p;
  if (near(m.constant(n.inputs[1]), want)) return n.inputs[0];
  if (std::string(op) == "Mul" && near(m.constant(n.inputs[0]), want)) return n.inputs[1];
  return std::nullopt;
}

// From an Erf node: z = x / sqrt(2) (or x * (1/sqrt(2))), then the GELU tail.
std::optional<SubgraphMatch> match_gelu_erf(const Matcher& m, size_t erf) {
  const Node& e = m.node(erf);
  if (e.inputs.size() != 1 || e.outputs.size() != 1 || m.sole_reader(e.inputs[0]) != erf) return std::nullopt;
  const std::string& z = e.inputs[0];
  size_t scale = 0;
  std::optional<std::string> x = scaled_input(m, z, "Div", std::sqrt(2.0), scale);
  if (!x) x = scaled_input(m, z, "Mul", std::sqrt(0.5), scale);
  if (!x || !m.is_float(*x)) return std::nullopt;
  SubgraphMatch r{"gelu_erf", {scale, erf}, *x, "", {z}};
  if (!match_gelu_tail(m, e.outputs[0], *x, r)) return std::nullopt;
  return r;
}

// From a Tanh node: u = sqrt(2/pi) * (x + 0.044715 * x^3), x^3 as Pow(x, 3) or two Muls, then the GELU tail.
std::optional<SubgraphMatch> match_gelu_tanh(const Matcher& m, size_t tanh) {
  const Node& t = m.node(tanh);
  if (t.inputs.size() != 1 || t.outputs.size() != 1 || m.sole_reader(t.inputs[0]) != tanh) return std::nullopt;
  SubgraphMatch r{"gelu_tanh", {}, "", "", {t.inputs[0]}};
  size_t at = 0;
  std::optional<std::string> inner = scaled_input(m, t.inputs[0], "Mul", std::sqrt(2.0 / 3.14159265358979323846), at);
  if (!inner || m.sole_reader(*inner) != at) return std::nullopt;
  r.nodes.push_back(at);
  r.interior.push_back(*inner);
  // inner = x + c3 (either order), c3 = 0.044715 * x^3 (either order).
  auto sum = m.producer(*inner);
  if (!sum || !is_op(m.node(*sum), "Add") || m.node(*sum).inputs.size() != 2) return std::nullopt;
  for (int side = 0; side < 2 && r.input.empty(); ++side) {
    const std::string& x = m.node(*sum).inputs[side];
    const std::string& c3 = m.node(*sum).inputs[1 - side];
    size_t cubic_at = 0;
    std::optional<std::string> cube = scaled_input(m, c3, "Mul", 0.044715, cubic_at);
    if (!cube || m.sole_reader(c3) != *sum || m.sole_reader(*cube) != cubic_at) continue;
    auto pc = m.producer(*cube);
    if (!pc) continue;
    const Node& cn = m.node(*pc);
    std::vector<size_t> cube_nodes = {*pc};
    std::vector<std::string> cube_interior;
    bool ok = false;
    if (is_op(cn, "Pow") && cn.inputs.size() == 2 && cn.inputs[0] == x) {
      ok = near(m.constant(cn.inputs[1]), 3.0);
    } else if (is_op(cn, "Mul") && cn.inputs.size() == 2) {
      // x * (x * x) or (x * x) * x
      for (int k = 0; k < 2 && !ok; ++k) {
        auto sq = m.producer(cn.inputs[1 - k]);
        if (cn.inputs[k] != x || !sq || m.sole_reader(cn.inputs[1 - k]) != *pc) continue;
        const Node& sn = m.node(*sq);
        if (is_op(sn, "Mul") && sn.inputs.size() == 2 && sn.inputs[0] == x && sn.inputs[1] == x) {
          ok = true;
          cube_nodes.insert(cube_nodes.begin(), *sq);
          cube_interior.push_back(sn.outputs[0]);
        }
      }
    }
    if (!ok || !m.is_float(x)) continue;
    r.input = x;
    r.nodes.insert(r.nodes.begin(), cube_nodes.begin(), cube_nodes.end());
    r.nodes.insert(r.nodes.begin() + static_cast<std::ptrdiff_t>(cube_nodes.size()), {cubic_at, *sum});
    r.interior.insert(r.interior.end(), cube_interior.begin(), cube_interior.end());
    r.interior.insert(r.interior.end(), {*cube, c3});
  }
  if (r.input.empty()) return std::nullopt;
  r.nodes.push_back(tanh);
  if (!match_gelu_tail(m, t.outputs[0], r.input, r)) return std::nullopt;
  return r;
}

}  // namespace

std::vector<SubgraphMatch> match_subgraphs(const Graph& g, const std::unordered_map<std::string, int>& readers) {
  const Matcher m(g, readers);
  std::vector<SubgraphMatch> out;
  std::unordered_set<size_t> taken;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    std::optional<SubgraphMatch> r;
    if (is_op(g.nodes[i], "Erf")) r = match_gelu_erf(m, i);
    else if (is_op(g.nodes[i], "Tanh")) r = match_gelu_tanh(m, i);
    if (!r || std::any_of(r->nodes.begin(), r->nodes.end(), [&](size_t n) { return taken.count(n); })) continue;
    taken.insert(r->nodes.begin(), r->nodes.end());
    out.push_back(std::move(*r));
  }
  return out;
}

Expr subgraph_gradient(GraphBuilder& b, const SubgraphMatch& m, const Expr& x, const Expr& dy) {
  const auto& rules = subgraph_rules();
  auto rule = std::find_if(rules.begin(), rules.end(), [&](const SubgraphRule& r) { return r.name == m.rule; });
  return apply(b, rule->fused_op, {dy, x}, dy.type, {}, kFusedGradDomain);
}

}  // namespace onnxtrain
