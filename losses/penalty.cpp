#include "losses/penalty.h"

#include <cmath>
#include <cstdio>

#include "graph/error.h"
#include "graph/expr.h"

namespace onnxtrain {

namespace {

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

}  // namespace

std::string append_penalty(Graph& g, const std::string& loss, const std::vector<std::string>& weights,
                           const PenaltySpec& p) {
  if (!(p.l1 >= 0) || !std::isfinite(p.l1)) fail("penalty.l1", "expected a non-negative number, got " + num(p.l1));
  if (!(p.l2 >= 0) || !std::isfinite(p.l2)) fail("penalty.l2", "expected a non-negative number, got " + num(p.l2));
  const TypeInfo* lt = g.type_of(loss);
  if (!lt || !is_floating(lt->dtype))
    fail("penalty", "loss '" + loss + "' must be a floating-point value with a known type");
  if (lt->shape && !lt->shape->empty())
    fail("penalty", "loss '" + loss + "' must be a scalar, got shape " + to_string(*lt->shape));
  GraphBuilder b(g, "penalty/");
  Expr total = value(b, loss);
  std::vector<Expr> l1_terms, l2_terms;
  for (const std::string& w : weights) {
    const TypeInfo* wt = g.type_of(w);
    if (!wt) fail("penalty.weights", "'" + w + "' is not a value of the graph");
    if (!is_floating(wt->dtype))
      fail("penalty.weights", "'" + w + "' is " + dtype_name(wt->dtype) + "; only floating-point weights are penalized");
    // Terms are summed in the loss dtype (a float32 weight under a float64 loss keeps the loss's precision).
    Expr x = cast(value(b, w), total.dtype());
    if (p.l1 > 0) l1_terms.push_back(reduce_sum_all(abs(x)));
    if (p.l2 > 0) l2_terms.push_back(reduce_sum_all(x * x));
  }
  auto add = [&](std::vector<Expr>& terms, double coef) {
    if (terms.empty()) return;
    Expr s = terms.size() == 1 ? terms[0] : sum(terms);
    total = total + coef * s;
  };
  add(l1_terms, p.l1);
  add(l2_terms, p.l2);
  std::string out = GraphBuilder(g).unique_name("penalized_loss");
  b.add_node("Identity", {total.name}, 1, {}, {}, {out});
  b.set_type(out, total.type);
  return out;
}

}  // namespace onnxtrain
