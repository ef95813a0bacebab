#include "losses/loss.h"

#include <algorithm>

#include "graph/error.h"
#include "graph/expr.h"

namespace onnxtrain {

const std::vector<std::string>& loss_kinds() {
  static const std::vector<std::string> k = {"mse"};
  return k;
}

namespace {

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

Expr reduce(const Expr& per_element, const std::string& reduction) {
  if (reduction == "mean") return reduce_mean_all(per_element);
  if (reduction == "sum") return reduce_sum_all(per_element);
  fail("loss.reduction", "expected 'mean' or 'sum', got '" + reduction + "'");
}

}  // namespace

LossGraph append_loss(Graph& g, const std::string& prediction, const LossSpec& spec) {
  const auto& kinds = loss_kinds();
  if (std::find(kinds.begin(), kinds.end(), spec.kind) == kinds.end())
    fail("loss.kind", "unknown loss '" + spec.kind + "'; expected one of: " + join(kinds));
  const TypeInfo* pt = g.type_of(prediction);
  if (!pt || !is_floating(pt->dtype))
    fail("loss", "prediction '" + prediction + "' must be a floating-point tensor with a known type");
  GraphBuilder b(g, "loss/");
  LossGraph out;
  // The target is user-facing, so it gets a plain name rather than the builder's "loss/" prefix.
  out.target = GraphBuilder(g).unique_name("target");
  b.add_input(out.target, *pt);
  Expr p = value(b, prediction);
  Expr t = value(b, out.target);
  Expr d = p - t;
  Expr l = reduce(d * d, spec.reduction);
  if (spec.half) l = l * 0.5;
  out.loss = GraphBuilder(g).unique_name("loss");
  b.add_node("Identity", {l.name}, 1, {}, {}, {out.loss});
  b.set_type(out.loss, l.type);
  return out;
}

}  // namespace onnxtrain
