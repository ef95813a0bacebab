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

// From an Erf node: z = x / sqrt(2) (or x * (1/sqrt(2))), a = Erf(z) + 1, y = x * a * 0.5 over two Muls.
std::optional<SubgraphMatch> match_gelu_erf(const Matcher& m, size_t erf) {
  const Node& e = m.node(erf);
  if (e.inputs.size() != 1 || e.outputs.size() != 1) return std::nullopt;
  const std::string& z = e.inputs[0];
  auto scale = m.producer(z);
  if (!scale || m.sole_reader(z) != erf) return std::nullopt;
  const Node& s = m.node(*scale);
  if (s.inputs.size() != 2) return std::nullopt;
  std::string x;
  if (is_op(s, "Div") && near(m.constant(s.inputs[1]), std::sqrt(2.0))) x = s.inputs[0];
  else if (is_op(s, "Mul") && near(m.constant(s.inputs[1]), std::sqrt(0.5))) x = s.inputs[0];
  else if (is_op(s, "Mul") && near(m.constant(s.inputs[0]), std::sqrt(0.5))) x = s.inputs[1];
  if (x.empty() || !m.is_float(x)) return std::nullopt;

  auto add = m.sole_reader(e.outputs[0]);
  if (!add || !is_op(m.node(*add), "Add") || m.node(*add).inputs.size() != 2) return std::nullopt;
  if (!near(m.constant(Matcher::other(m.node(*add), e.outputs[0])), 1.0)) return std::nullopt;
  const std::string& a = m.node(*add).outputs[0];
  auto first_mul = m.sole_reader(a);
  if (!first_mul || !is_op(m.node(*first_mul), "Mul")) return std::nullopt;

  // The product's root is the first Mul or the Mul that alone reads it.
  std::vector<size_t> roots = {*first_mul};
  if (auto up = m.sole_reader(m.node(*first_mul).outputs[0]); up && is_op(m.node(*up), "Mul")) roots.insert(roots.begin(), *up);
  for (size_t root : roots) {
    std::vector<std::string> leaves;
    std::vector<size_t> muls;
    m.product_leaves(root, leaves, muls);
    if (muls.size() != 2 || leaves.size() != 3) continue;
    auto has = [&](auto pred) { return std::count_if(leaves.begin(), leaves.end(), pred) == 1; };
    if (!has([&](const std::string& l) { return l == x; }) || !has([&](const std::string& l) { return l == a; }) ||
        !has([&](const std::string& l) { return near(m.constant(l), 0.5); }))
      continue;
    SubgraphMatch r{"gelu_erf", {*scale, erf, *add}, x, m.node(root).outputs[0], {z, e.outputs[0], a}};
    // muls[0] is the root; the other Mul comes before it.
    r.nodes.push_back(muls[1]);
    r.nodes.push_back(muls[0]);
    r.interior.push_back(m.node(muls[1]).outputs[0]);
    return r;
  }
  return std::nullopt;
}

}  // namespace

std::vector<SubgraphMatch> match_subgraphs(const Graph& g, const std::unordered_map<std::string, int>& readers) {
  const Matcher m(g, readers);
  std::vector<SubgraphMatch> out;
  std::unordered_set<size_t> taken;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (!is_op(g.nodes[i], "Erf")) continue;
    auto r = match_gelu_erf(m, i);
    if (!r || std::any_of(r->nodes.begin(), r->nodes.end(), [&](size_t n) { return taken.count(n); })) continue;
    taken.insert(r->nodes.begin(), r->nodes.end());
    out.push_back(std::move(*r));
  }
  return out;
}

Expr subgraph_gradient(GraphBuilder& b, const SubgraphMatch& m, const Expr& x, const Expr& dy) {
  // gelu_erf is the only rule so far: GeluGrad(dY, X) = dY * (Phi(X) + X * phi(X)).
  return apply(b, "GeluGrad", {dy, x}, dy.type, {}, kFusedGradDomain);
}

}  // namespace onnxtrain
