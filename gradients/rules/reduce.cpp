// Gradients of reductions. Each rule first restores the reduced dims of dY (and Y) as size-1 dims, then
// lets broadcasting spread them over the input. Also CumSum and TopK, which work along one axis too.
#include "gradients/rule.h"
#include "gradients/rules/util.h"

namespace onnxtrain {

namespace {

// How a reduce node reduces, read once per rule.
struct Reduction {
  bool identity = false;  // noop_with_empty_axes with no axes: y = x
  bool keepdims = true;
  std::optional<std::vector<int64_t>> axes;  // empty: every axis; nullopt: a run-time value
};

Reduction reduction(RuleContext& c, int64_t axes_input_since) {
  Reduction r;
  bool present = false;
  r.axes = rules::axes_arg(c, "axes", 1, axes_input_since, present);
  r.keepdims = c.node().attr_int("keepdims", 1) != 0;
  // noop_with_empty_axes arrived with the axes input.
  const bool noop = c.opset() >= axes_input_since && c.node().attr_int("noop_with_empty_axes", 0) != 0;
  r.identity = noop && r.axes && r.axes->empty();
  return r;
}

// t (shaped like the node's output) with the reduced dims back as size 1, so it broadcasts against X.
Expr keep_dims(RuleContext& c, const Reduction& r, const Expr& t) {
  if (r.keepdims || r.identity) return t;
  if (!r.axes) return rules::unsqueeze(t, c.X(1), c.X(0).rank());
  // All axes reduced: a scalar already broadcasts against anything.
  if (r.axes->empty()) return t;
  return rules::unsqueeze(t, *r.axes, c.opset());
}

Expr expand_to_input(RuleContext& c, const Expr& t) {
  Expr x = c.X(0);
  if (t.shape() && x.shape() && *t.shape() == *x.shape()) return t;
  return expand(t, shape_of(x), x.shape());
}

std::optional<int64_t> static_numel(const Expr& e) {
  if (!e.shape()) return std::nullopt;
  int64_t n = 1;
  for (const Dim& d : *e.shape()) {
    if (!d.known()) return std::nullopt;
    n *= d.value;
  }
  return n;
}

// numel(Y) / numel(X): the factor a mean applies to each input element.
Expr mean_scale(RuleContext& c) {
  Expr x = c.X(0), y = c.Y(0);
  auto nx = static_numel(x), ny = static_numel(y);
  if (nx && ny) return scalar(c.builder(), x.dtype(), *nx == 0 ? 0.0 : static_cast<double>(*ny) / *nx);
  auto size = [&](const Expr& e) {
    return cast(apply(c.builder(), "Size", {e}, TypeInfo{DType::Int64, Shape{}}), x.dtype());
  };
  return size(y) / size(x);
}

void add_reduce(GradientRegistry& reg, const std::string& op, int64_t axes_input_since,
                std::function<Expr(RuleContext&, const Reduction&)> grad) {
  reg.add(op, [axes_input_since, grad](RuleContext& c) {
    Reduction r = reduction(c, axes_input_since);
    c.set_dX(0, grad(c, r));
  });
}

// ---- CumSum and TopK: along one axis, like the reductions ------------------------------------------------

void cumsum_rule(RuleContext& c) {
  // Each x_j reaches the outputs after it (before it, reversed): the gradient is the opposite-direction
  // cumulative sum, exclusive when the forward was.
  const int64_t reverse = c.node().attr_int("reverse", 0) != 0 ? 0 : 1;
  c.set_dX(0, apply(c.builder(), "CumSum", {c.dY(0), c.X(1)}, rules::input_type(c, 0),
                    {{"exclusive", c.node().attr_int("exclusive", 0)}, {"reverse", reverse}}));
}

void topk_rule(RuleContext& c) {
  // dY goes back to the positions the values came from; they are distinct along the axis, so a plain scatter.
  if (c.opset() < 11) c.fail("needs opset 11 or newer (ScatterElements), the model has opset " + std::to_string(c.opset()));
  if (c.num_outputs() < 2 || c.node().outputs[1].empty()) c.fail("needs the Indices output");
  Expr x = c.X(0);
  c.set_dX(0, apply(c.builder(), "ScatterElements", {zeros_like(x), c.Y(1), c.dY(0)}, x.type,
                    {{"axis", c.node().attr_int("axis", -1)}}));
}

}  // namespace

void register_reduce_rules(GradientRegistry& reg) {
  add_reduce(reg, "ReduceSum", 13, [](RuleContext& c, const Reduction& r) {
    return expand_to_input(c, keep_dims(c, r, c.dY(0)));
  });
  add_reduce(reg, "ReduceMean", 18, [](RuleContext& c, const Reduction& r) {
    if (r.identity) return c.dY(0);
    return expand_to_input(c, keep_dims(c, r, c.dY(0) * mean_scale(c)));
  });
  add_reduce(reg, "ReduceSumSquare", 18, [](RuleContext& c, const Reduction& r) {
    // y = sum(x^2):  dx = 2 x dy
    if (r.identity) return c.dY(0) * 2.0 * c.X(0);
    return keep_dims(c, r, c.dY(0)) * (2.0 * c.X(0));
  });
  add_reduce(reg, "ReduceL2", 18, [](RuleContext& c, const Reduction& r) {
    // y = sqrt(sum(x^2)):  dx = dy * x / y
    if (r.identity) return c.dY(0);  // the reference returns x unchanged
    return c.X(0) * keep_dims(c, r, c.dY(0) / c.Y(0));
  });
  add_reduce(reg, "ReduceLogSumExp", 18, [](RuleContext& c, const Reduction& r) {
    // dx = dy * exp(x - y), the softmax of x along the reduced axes
    if (r.identity) return c.dY(0);
    return keep_dims(c, r, c.dY(0)) * exp(c.X(0) - keep_dims(c, r, c.Y(0)));
  });
  add_reduce(reg, "ReduceProd", 18, [](RuleContext& c, const Reduction& r) {
    // dx = dy * y / x: the product of the other elements. Not defined where x is exactly 0.
    if (r.identity) return c.dY(0);
    return keep_dims(c, r, c.dY(0) * c.Y(0)) / c.X(0);
  });
  add_reduce(reg, "ReduceL1", 18, [](RuleContext& c, const Reduction& r) {
    // y = sum(|x|):  dx = dy * sign(x), 0 at the kink
    if (r.identity) return c.dY(0);  // the reference returns x unchanged
    return keep_dims(c, r, c.dY(0)) * sign(c.X(0));
  });
  add_reduce(reg, "ReduceLogSum", 18, [](RuleContext& c, const Reduction& r) {
    // y = log(sum(x)):  dx = dy / sum(x) = dy / exp(y)
    if (r.identity) return c.dY(0);
    return expand_to_input(c, keep_dims(c, r, c.dY(0) / exp(c.Y(0))));
  });
  // Max and Min send the gradient to every element equal to the result (each tie gets it in full).
  for (const char* op : {"ReduceMax", "ReduceMin"}) {
    add_reduce(reg, op, 18, [](RuleContext& c, const Reduction& r) {
      if (r.identity) return c.dY(0);
      Expr dy = keep_dims(c, r, c.dY(0));
      return where(equal(c.X(0), keep_dims(c, r, c.Y(0))), dy, scalar(c.builder(), dy.dtype(), 0.0));
    });
  }
  reg.add("CumSum", cumsum_rule);
  reg.add("TopK", topk_rule);
}

}  // namespace onnxtrain
