#include "gradients/rules/util.h"

#include <algorithm>

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

}  // namespace onnxtrain::rules
