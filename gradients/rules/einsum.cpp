// Gradient of Einsum (kernels: executor/cpu/einsum.cpp, executor/cuda/einsum.cu; the equation parser is
// graph/einsum.h, shared with the CPU kernel).
#include <algorithm>
#include <cctype>
#include <map>
#include <optional>
#include <string>

#include "gradients/rule.h"
#include "gradients/rules/util.h"
#include "graph/einsum.h"

namespace onnxtrain {

namespace {

// ---- Einsum ---------------------------------------------------------------------------------------------
// d(operand k) is the einsum of dY with the other operands onto k's indices. An index only operand k has
// (summed by it alone) does not reach dY: the gradient is constant along it, so it is broadcast back.

// Splits "a,b->c" into terms and the output (implicit output: the indices used once, alphabetically, after
// the ellipsis), with every "..." replaced by fresh capital letters aligned from the right, so the gradient
// equations can reorder operands freely.
void einsum_rule(RuleContext& c) {
  const EinsumEquation parsed = parse_einsum_equation(c.node().attr_string("equation", ""));
  const std::string& eq = parsed.text;
  std::vector<std::string> terms = parsed.terms;
  if (terms.size() != c.num_inputs()) c.fail("equation '" + eq + "' does not match the number of inputs");
  std::string out = parsed.output;
  if (eq.find("...") != std::string::npos) {
    std::string fresh;
    for (char ch = 'A'; ch <= 'Z'; ++ch)
      if (eq.find(ch) == std::string::npos) fresh += ch;
    size_t ell = 0;
    std::vector<size_t> ranks;
    for (size_t k = 0; k < terms.size(); ++k) {
      const TypeInfo xt = rules::input_type(c, k);
      if (!xt.shape) c.fail("needs the rank of input " + std::to_string(k) + " for the ellipsis");
      const size_t letters = terms[k].size() - (terms[k].find("...") != std::string::npos ? 3 : 0);
      if (xt.shape->size() < letters) c.fail("operand " + std::to_string(k) + " does not match its rank");
      ranks.push_back(xt.shape->size() - letters);
      ell = std::max(ell, ranks.back());
    }
    if (ell > fresh.size()) c.fail("too many ellipsis dims for equation '" + eq + "'");
    const std::string all = fresh.substr(0, ell);
    auto expand_dots = [](std::string t, const std::string& with) {
      const size_t at = t.find("...");
      return at == std::string::npos ? t : t.replace(at, 3, with);
    };
    for (size_t k = 0; k < terms.size(); ++k) terms[k] = expand_dots(terms[k], all.substr(ell - ranks[k]));
    out = expand_dots(out, all);
  }
  for (const std::string& t : terms)
    for (size_t i = 0; i < t.size(); ++i)
      if (t.find(t[i]) != i)
        c.fail("has no gradient for an operand with a repeated index (a diagonal) yet: '" + eq + "'");
  // Each index's size where it is not a broadcast 1, so a gradient's declared shape is the one einsum makes.
  std::map<char, Dim> size;
  auto note = [&](const std::string& t, const std::optional<Shape>& sh) {
    if (!sh || sh->size() != t.size()) return;
    for (size_t i = 0; i < t.size(); ++i) {
      auto it = size.find(t[i]);
      if (it == size.end() || (it->second.known() && it->second.value == 1)) size[t[i]] = (*sh)[i];
    }
  };
  for (size_t k = 0; k < terms.size(); ++k) note(terms[k], rules::input_type(c, k).shape);
  GraphBuilder& b = c.builder();
  for (size_t k = 0; k < terms.size(); ++k) {
    if (!c.needs_dX(k)) continue;
    const TypeInfo xt = rules::input_type(c, k);
    if (!xt.shape || xt.shape->size() != terms[k].size()) c.fail("needs the rank of input " + std::to_string(k));
    std::string others = out;
    std::vector<Expr> ins{c.dY(0)};
    for (size_t j = 0; j < terms.size(); ++j)
      if (j != k) {
        others += "," + terms[j];
        ins.push_back(c.X(j));
      }
    std::string target;
    Shape target_shape;
    std::vector<int64_t> lonely;  // positions in term k of indices nothing else has
    for (size_t i = 0; i < terms[k].size(); ++i) {
      const char ch = terms[k][i];
      if (others.find(ch) == std::string::npos) {
        lonely.push_back(static_cast<int64_t>(i));
        continue;
      }
      target += ch;
      target_shape.push_back(size.count(ch) ? size.at(ch) : (*xt.shape)[i]);
    }
    Expr g = apply(b, "Einsum", ins, TypeInfo{xt.dtype, target_shape}, {{"equation", others + "->" + target}});
    if (!lonely.empty()) {
      g = rules::unsqueeze(g, lonely, c.opset());
      g = expand(g, shape_of(c.X(k)), xt.shape);
    }
    c.set_dX(k, g);
  }
}

}  // namespace

void register_einsum_rules(GradientRegistry& r) {
  r.add("Einsum", einsum_rule);
}

}  // namespace onnxtrain
