#include "gradients/rules/util.h"

#include <algorithm>

#include "gradients/fused.h"
#include "graph/error.h"

namespace onnxtrain::rules {

const TensorData* constant_tensor(const Graph& g, const std::string& value) {
  const TensorData* t = nullptr;
  if (auto it = g.initializers.find(value); it != g.initializers.end()) t = &it->second;
  for (auto n = g.nodes.rbegin(); !t && n != g.nodes.rend(); ++n)
    if (n->op_type == "Constant" && n->domain.empty() && n->outputs.size() == 1 && n->outputs[0] == value)
      t = n->attr_tensor("value");
  return t;
}

std::optional<std::vector<int64_t>> constant_int64s(const Graph& g, const std::string& value) {
  const TensorData* t = constant_tensor(g, value);
  if (!t || t->dtype != DType::Int64) return std::nullopt;
  auto v = t->as<int64_t>();
  return std::vector<int64_t>(v.begin(), v.end());
}

std::optional<std::vector<int64_t>> axes_arg(RuleContext& c, const std::string& attr, size_t input,
                                             int64_t input_since, bool& present) {
  if (c.opset() < input_since) {
    present = c.node().has_attr(attr);
    return c.node().attr_ints(attr);
  }
  present = c.has_input(input);
  if (!present) return std::vector<int64_t>{};
  return constant_int64s(c.builder().graph(), c.node().inputs[input]);
}

namespace {
Expr with_axes(const std::string& op, const Expr& x, const std::vector<int64_t>& axes, int64_t opset, TypeInfo out,
               std::map<std::string, Attribute> attrs = {}) {
  if (opset < 13) {
    attrs["axes"] = axes;
    return apply(*x.b, op, {x}, std::move(out), std::move(attrs));
  }
  return apply(*x.b, op, {x, int64s(*x.b, axes)}, std::move(out), std::move(attrs));
}
}  // namespace

Expr reduce_sum(const Expr& x, const std::vector<int64_t>& axes, bool keepdims, int64_t opset) {
  if (opset >= 13 || axes.empty()) return onnxtrain::reduce_sum(x, axes, keepdims);
  std::optional<Shape> out;
  if (x.shape()) {
    const auto r = static_cast<int64_t>(x.shape()->size());
    std::vector<bool> reduced(r, false);
    for (int64_t a : axes) {
      if (a < -r || a >= r) fail("ReduceSum", "axis " + std::to_string(a) + " out of range for rank " + std::to_string(r));
      reduced[a < 0 ? a + r : a] = true;
    }
    out = Shape();
    for (int64_t i = 0; i < r; ++i)
      if (!reduced[i])
        out->push_back((*x.shape())[i]);
      else if (keepdims)
        out->push_back(Dim::of(1));
  }
  return with_axes("ReduceSum", x, axes, opset, TypeInfo{x.dtype(), std::move(out)},
                   {{"keepdims", int64_t{keepdims ? 1 : 0}}});
}

Expr unsqueeze(const Expr& x, const std::vector<int64_t>& axes, int64_t opset) {
  if (axes.empty()) return x;
  std::optional<Shape> out;
  if (x.shape()) {
    const auto r = static_cast<int64_t>(x.shape()->size() + axes.size());
    std::vector<bool> inserted(r, false);
    for (int64_t a : axes) {
      if (a < -r || a >= r) fail("Unsqueeze", "axis " + std::to_string(a) + " out of range for rank " + std::to_string(r));
      inserted[a < 0 ? a + r : a] = true;
    }
    out = Shape();
    size_t next = 0;
    for (int64_t i = 0; i < r; ++i) out->push_back(inserted[i] ? Dim::of(1) : (*x.shape())[next++]);
  }
  return with_axes("Unsqueeze", x, axes, opset, TypeInfo{x.dtype(), std::move(out)});
}

Expr unsqueeze(const Expr& x, const Expr& axes, std::optional<size_t> result_rank) {
  std::optional<Shape> out;
  if (result_rank) out = Shape(*result_rank);
  return apply(*x.b, "Unsqueeze", {x, axes}, TypeInfo{x.dtype(), std::move(out)});
}

Expr squeeze(const Expr& x, const std::vector<int64_t>& axes, int64_t opset) {
  if (axes.empty()) return x;
  std::optional<Shape> out;
  if (x.shape()) {
    const auto r = static_cast<int64_t>(x.shape()->size());
    std::vector<bool> removed(r, false);
    for (int64_t a : axes) {
      if (a < -r || a >= r) fail("Squeeze", "axis " + std::to_string(a) + " out of range for rank " + std::to_string(r));
      removed[a < 0 ? a + r : a] = true;
    }
    out = Shape();
    for (int64_t i = 0; i < r; ++i)
      if (!removed[i]) out->push_back((*x.shape())[i]);
  }
  return with_axes("Squeeze", x, axes, opset, TypeInfo{x.dtype(), std::move(out)});
}

}  // namespace onnxtrain::rules

namespace onnxtrain::rules {

TypeInfo input_type(RuleContext& c, size_t i) {
  if (!c.has_input(i)) c.fail("input " + std::to_string(i) + " is absent");
  const TypeInfo* t = c.builder().graph().type_of(c.node().inputs[i]);
  return t ? *t : c.X(i).type;
}

std::optional<std::vector<int64_t>> static_dims(const TypeInfo& t) {
  if (!t.shape) return std::nullopt;
  std::vector<int64_t> dims;
  for (const Dim& d : *t.shape) {
    if (!d.known()) return std::nullopt;
    dims.push_back(d.value);
  }
  return dims;
}

Expr reshape_to_input(RuleContext& c, const Expr& dy, size_t i) {
  TypeInfo t = input_type(c, i);
  if (auto dims = static_dims(t)) {
    if (dy.shape() && *dy.shape() == *t.shape) return dy;
    return reshape(dy, int64s(c.builder(), *dims), t.shape);
  }
  return reshape_like(dy, c.X(i));
}

namespace {
// Whether input dim xd may have been broadcast to gradient dim gd without the shapes saying so: xd is
// symbolic (1 or not, only the run time tells) and gd is not certainly the same size or 1.
bool undecided(const Dim& xd, const Dim& gd) {
  if (xd.known() || xd.same_as(gd)) return false;
  return !(gd.known() && gd.value == 1);
}
}  // namespace

Expr sum_to_shape(Expr g, const Expr& x, const Node& n, int64_t opset) {
  auto at_run_time = [&] {
    return apply(*g.b, "SumToShape", {g, shape_of(x)}, TypeInfo{g.dtype(), x.shape()}, {}, kFusedGradDomain);
  };
  if (!g.shape() || !x.shape()) return g.type.shape && g.type.shape == x.type.shape ? g : at_run_time();
  const Shape& gs = *g.shape();
  const Shape& xs = *x.shape();
  if (gs.size() < xs.size())
    fail(n.describe(), "gradient of '" + x.name + "' has rank " + std::to_string(gs.size()) + " but the input has rank " +
                           std::to_string(xs.size()));
  const size_t lead = gs.size() - xs.size();
  std::vector<int64_t> axes;
  for (size_t a = 0; a < gs.size(); ++a) {
    if (a < lead) {
      axes.push_back(static_cast<int64_t>(a));
      continue;
    }
    const Dim& xd = xs[a - lead];
    const Dim& gd = gs[a];
    if (undecided(xd, gd)) return at_run_time();
    if (xd.known() && xd.value == 1 && !(gd.known() && gd.value == 1)) axes.push_back(static_cast<int64_t>(a));
  }
  if (axes.empty()) return g;
  Expr r = reduce_sum(g, axes, /*keepdims=*/true, opset);  // the form valid at the model's opset
  if (lead == 0) return r;
  if (auto dims = static_dims(x.type)) return reshape(r, int64s(*g.b, *dims), xs);
  return reshape_like(r, x);
}

std::vector<Expr> fused_grads(RuleContext& c, const std::string& op, const std::vector<Expr>& inputs,
                              std::vector<TypeInfo> types, std::map<std::string, Attribute> attrs) {
  std::vector<Expr> g = apply_n(c.builder(), op, inputs, std::move(types), std::move(attrs), kFusedGradDomain);
  Node& n = c.builder().graph().nodes.back();
  for (size_t i = 0; i < g.size(); ++i) {
    if (i < c.num_inputs() && c.has_input(i) && c.needs_dX(i)) continue;
    c.builder().graph().value_info.erase(n.outputs[i]);
    n.outputs[i].clear();
  }
  return g;
}

}  // namespace onnxtrain::rules
