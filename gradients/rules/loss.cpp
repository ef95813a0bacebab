// Gradients of the ONNX loss ops: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (kernels:
// executor/cpu/loss.cpp, executor/cuda/loss.cu).
#include <optional>
#include <string>

#include "gradients/rule.h"
#include "gradients/rules/util.h"

namespace onnxtrain {

namespace {

// ---- NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss ----------------------------------------------------
// With wm[n, c, d] = weight[c] where c == target[n, d] (and target is not ignore_index), 0 elsewhere, the
// loss reads -wm * logp, so dlogp = -wm * g with g = dY spread over the elements ("none"), dY ("sum") or
// dY / sum(wm) ("mean").

Expr nll_grad(RuleContext& c, const Expr& like) {
  if (c.has_input(2) && c.needs_dX(2)) c.fail("has no gradient for the class weights (make them a constant)");
  GraphBuilder& b = c.builder();
  const TypeInfo xt = rules::input_type(c, 0);
  if (!xt.shape || xt.shape->size() < 2 || !(*xt.shape)[1].known())
    c.fail("needs the input's rank and number of classes (dim 1) to be known statically");
  const auto rank = static_cast<int64_t>(xt.shape->size());
  const int64_t C = (*xt.shape)[1].value;
  std::vector<int64_t> cdims(rank, 1), classes(C);
  cdims[1] = C;
  for (int64_t i = 0; i < C; ++i) classes[i] = i;
  Expr cls = constant(b, TensorData::from<int64_t>(cdims, std::span<const int64_t>(classes)));
  Expr t = cast(c.X(1), DType::Int64);
  Expr hot = equal(rules::unsqueeze(t, {1}, c.opset()), cls);
  const DType dt = like.dtype();
  Expr w = c.has_input(2) ? reshape(c.X(2), int64s(b, cdims)) : scalar(b, dt, 1.0);
  Expr zero = scalar(b, dt, 0.0);
  Expr wm = where(hot, w, zero);
  if (c.node().has_attr("ignore_index")) {
    Expr ii = int64s(b, {c.node().attr_int("ignore_index", 0)});
    wm = where(rules::unsqueeze(equal(t, ii), {1}, c.opset()), zero, wm);
  }
  const std::string reduction = c.node().attr_string("reduction", "mean");
  Expr dy = c.dY(0);
  if (reduction == "none") return -(wm * rules::unsqueeze(dy, {1}, c.opset()));
  if (reduction == "sum") return -(wm * dy);
  if (reduction == "mean") return -(wm * (dy / reduce_sum_all(wm)));
  c.fail("reduction must be none, sum or mean, got '" + reduction + "'");
}

void nll_rule(RuleContext& c) { c.set_dX(0, nll_grad(c, c.X(0))); }

void sce_rule(RuleContext& c) {
  GraphBuilder& b = c.builder();
  Expr x = c.X(0);
  const bool has_logp = c.num_outputs() > 1 && !c.node().outputs[1].empty();
  Expr logp;
  if (has_logp) {
    logp = c.Y(1);
  } else if (c.opset() >= 13 || (x.rank() && *x.rank() == 2)) {
    logp = apply(b, "LogSoftmax", {x}, x.type, {{"axis", int64_t{1}}});
  } else {
    // LogSoftmax before opset 13 flattens from the axis on, so do it by hand, shifted by the max.
    std::optional<Shape> ms = x.shape();
    if (ms) (*ms)[1] = Dim::of(1);
    Expr m = apply(b, "ReduceMax", {x}, TypeInfo{x.dtype(), ms}, {{"axes", std::vector<int64_t>{1}}});
    Expr s = x - m;
    logp = s - log(rules::reduce_sum(exp(s), {1}, true, c.opset()));
  }
  Expr g = nll_grad(c, x);
  if (has_logp) g = g + c.dY(1);
  c.set_dX(0, g - exp(logp) * rules::reduce_sum(g, {1}, true, c.opset()));
}

}  // namespace

void register_loss_rules(GradientRegistry& r) {
  r.add("NegativeLogLikelihoodLoss", nll_rule);
  r.add("SoftmaxCrossEntropyLoss", sce_rule);
}

}  // namespace onnxtrain
