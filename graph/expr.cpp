#include "graph/expr.h"

#include <algorithm>
#include <numeric>
#include <set>

#include "graph/error.h"

namespace onnxtrain {

namespace {

std::string describe(const Expr& e) {
  std::string s = "'" + e.name + "' (" + dtype_name(e.dtype());
  s += e.shape() ? to_string(*e.shape()) : std::string("[?]");
  return s + ")";
}

GraphBuilder& builder_of(const std::string& op, const Expr& a) {
  if (!a.b) fail("Expr " + op, "operand is an empty Expr (no builder)");
  return *a.b;
}

GraphBuilder& builder_of(const std::string& op, const Expr& a, const Expr& c) {
  GraphBuilder& b = builder_of(op, a);
  if (&builder_of(op, c).graph() != &b.graph())
    fail("Expr " + op, "operands " + describe(a) + " and " + describe(c) + " belong to different graphs");
  return b;
}

Expr make(GraphBuilder& b, std::string name, TypeInfo t) {
  b.set_type(name, t);
  return Expr{&b, std::move(name), std::move(t)};
}

Expr node1(GraphBuilder& b, const std::string& op, const std::vector<Expr>& in, TypeInfo out,
           std::map<std::string, Attribute> attrs = {}) {
  std::vector<std::string> names;
  names.reserve(in.size());
  for (const Expr& e : in) names.push_back(e.valid() ? e.name : std::string());
  return make(b, b.add(op, std::move(names), std::move(attrs)), std::move(out));
}

void require_same_dtype(const std::string& op, const Expr& a, const Expr& c) {
  if (a.dtype() != c.dtype())
    fail("Expr " + op, "operand element types differ: " + describe(a) + " vs " + describe(c));
}

// Broadcast result shape for an elementwise op, failing when the shapes certainly conflict.
std::optional<Shape> broadcast_or_fail(const std::string& op, const Expr& a, const Expr& c) {
  auto s = broadcast_shapes(a.shape(), c.shape());
  if (!s && a.shape() && c.shape())
    fail("Expr " + op, "shapes of " + describe(a) + " and " + describe(c) + " do not broadcast");
  return s;
}

Expr binary(const std::string& op, const Expr& a, const Expr& c) {
  GraphBuilder& b = builder_of(op, a, c);
  require_same_dtype(op, a, c);
  return node1(b, op, {a, c}, TypeInfo{a.dtype(), broadcast_or_fail(op, a, c)});
}

Expr compare(const std::string& op, const Expr& a, const Expr& c) {
  GraphBuilder& b = builder_of(op, a, c);
  require_same_dtype(op, a, c);
  return node1(b, op, {a, c}, TypeInfo{DType::Bool, broadcast_or_fail(op, a, c)});
}

Expr unary(const std::string& op, const Expr& a) {
  GraphBuilder& b = builder_of(op, a);
  return node1(b, op, {a}, a.type);
}

Expr scalar_like(const Expr& a, double v) { return scalar(builder_of("scalar", a), a.dtype(), v); }

int64_t normalize_axis(const std::string& op, int64_t axis, size_t rank) {
  const auto r = static_cast<int64_t>(rank);
  if (axis < -r || axis >= r)
    fail("Expr " + op, "axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(rank));
  return axis < 0 ? axis + r : axis;
}

// Axes as non-negative, sorted, unique; empty means every axis (ONNX's default for reductions).
std::vector<int64_t> normalize_axes(const std::string& op, const std::vector<int64_t>& axes, size_t rank) {
  std::vector<int64_t> out;
  if (axes.empty()) {
    out.resize(rank);
    std::iota(out.begin(), out.end(), 0);
    return out;
  }
  for (int64_t a : axes) out.push_back(normalize_axis(op, a, rank));
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::optional<Shape> reduced_shape(const std::string& op, const std::optional<Shape>& s,
                                   const std::vector<int64_t>& axes, bool keepdims) {
  if (!s) return std::nullopt;
  std::vector<int64_t> ax = normalize_axes(op, axes, s->size());
  Shape out;
  for (size_t i = 0; i < s->size(); ++i) {
    bool reduced = std::binary_search(ax.begin(), ax.end(), static_cast<int64_t>(i));
    if (!reduced)
      out.push_back((*s)[i]);
    else if (keepdims)
      out.push_back(Dim::of(1));
  }
  return out;
}

// The values of a 1-D int64 constant we can see cheaply: an initializer or a recent Constant node (the
// common case is a shape emitted just before by int64s()).
std::optional<std::vector<int64_t>> visible_int64s(const Expr& e) {
  if (!e.valid() || e.dtype() != DType::Int64) return std::nullopt;
  const Graph& g = e.b->graph();
  const TensorData* t = nullptr;
  if (auto it = g.initializers.find(e.name); it != g.initializers.end()) t = &it->second;
  const size_t lookback = std::min<size_t>(g.nodes.size(), 8);
  for (size_t i = 0; !t && i < lookback; ++i) {
    const Node& n = g.nodes[g.nodes.size() - 1 - i];
    if (n.op_type == "Constant" && n.domain.empty() && n.outputs.size() == 1 && n.outputs[0] == e.name)
      t = n.attr_tensor("value");
  }
  if (!t || t->dtype != DType::Int64 || t->dims.size() > 1) return std::nullopt;
  auto v = t->as<int64_t>();
  return std::vector<int64_t>(v.begin(), v.end());
}

Shape shape_of_dims(const std::vector<int64_t>& dims) {
  Shape s;
  for (int64_t d : dims) s.push_back(Dim::of(d));
  return s;
}

// The static result of Reshape(a, target) with ONNX's 0 (copy) and -1 (infer) conventions (allowzero=0).
Shape reshape_result(const std::optional<Shape>& in, const std::vector<int64_t>& target) {
  Shape out;
  int64_t infer_at = -1;
  for (size_t i = 0; i < target.size(); ++i) {
    if (target[i] == 0)
      out.push_back(in && i < in->size() ? (*in)[i] : Dim{});
    else if (target[i] < 0) {
      infer_at = static_cast<int64_t>(i);
      out.push_back(Dim{});
    } else
      out.push_back(Dim::of(target[i]));
  }
  if (infer_at >= 0 && in) {
    // -1 = numel(in) / numel(other dims). Symbols appearing on both sides cancel, so [B, T, C] -> [0, 0, H, -1]
    // still gives C / H.
    int64_t num = 1, den = 1;
    std::multiset<std::string> num_syms, den_syms;
    bool ok = true;
    auto take = [&](const Dim& d, int64_t& prod, std::multiset<std::string>& syms) {
      if (d.known())
        prod *= d.value;
      else if (!d.symbol.empty())
        syms.insert(d.symbol);
      else
        ok = false;
    };
    for (const Dim& d : *in) take(d, num, num_syms);
    for (size_t i = 0; i < out.size(); ++i)
      if (static_cast<int64_t>(i) != infer_at) take(out[i], den, den_syms);
    for (auto it = num_syms.begin(); it != num_syms.end();) {
      auto match = den_syms.find(*it);
      if (match == den_syms.end()) {
        ++it;
        continue;
      }
      den_syms.erase(match);
      it = num_syms.erase(it);
    }
    if (ok && den_syms.empty() && den > 0 && num % den == 0) {
      if (num_syms.empty())
        out[infer_at] = Dim::of(num / den);
      else if (num_syms.size() == 1 && num == den)
        out[infer_at] = Dim::sym(*num_syms.begin());
    }
  }
  return out;
}

Dim broadcast_dim(const Dim& x, const Dim& y, bool& conflict) {
  if (x.known() && x.value == 1) return y;
  if (y.known() && y.value == 1) return x;
  if (x.same_as(y)) return x;
  if (x.known() && y.known()) {
    conflict = true;
    return Dim{};
  }
  // A known size other than 1 wins: the other side is either that size or 1.
  if (x.known()) return x;
  if (y.known()) return y;
  return Dim{};
}

}  // namespace

std::optional<Shape> broadcast_shapes(const std::optional<Shape>& a, const std::optional<Shape>& b) {
  if (!a || !b) return std::nullopt;
  const size_t r = std::max(a->size(), b->size());
  Shape out(r);
  bool conflict = false;
  for (size_t i = 0; i < r; ++i) {
    const size_t from_end = r - 1 - i;
    const Dim one = Dim::of(1);
    const Dim& x = from_end < a->size() ? (*a)[a->size() - 1 - from_end] : one;
    const Dim& y = from_end < b->size() ? (*b)[b->size() - 1 - from_end] : one;
    out[i] = broadcast_dim(x, y, conflict);
  }
  if (conflict) return std::nullopt;
  return out;
}

Expr value(GraphBuilder& b, const std::string& name) {
  const TypeInfo* t = b.graph().type_of(name);
  if (!t) fail("Expr value '" + name + "'", "the graph has no type for this value (run shape inference first)");
  if (t->dtype == DType::Undefined)
    fail("Expr value '" + name + "'", "the element type of this value is unknown (run shape inference first)");
  return Expr{&b, name, *t};
}

Expr value(GraphBuilder& b, const std::string& name, TypeInfo t) {
  if (t.dtype == DType::Undefined) fail("Expr value '" + name + "'", "an element type is required");
  return Expr{&b, name, std::move(t)};
}

Expr scalar(GraphBuilder& b, DType t, double v) { return constant(b, TensorData::scalar_as(t, v)); }

Expr constant(GraphBuilder& b, const TensorData& t) {
  TypeInfo type{t.dtype, shape_of_dims(t.dims)};
  return make(b, b.constant(t), std::move(type));
}

Expr int64s(GraphBuilder& b, const std::vector<int64_t>& v) {
  return constant(b, TensorData::from<int64_t>({static_cast<int64_t>(v.size())}, std::span<const int64_t>(v)));
}

Expr operator+(const Expr& a, const Expr& c) { return binary("Add", a, c); }
Expr operator-(const Expr& a, const Expr& c) { return binary("Sub", a, c); }
Expr operator*(const Expr& a, const Expr& c) { return binary("Mul", a, c); }
Expr operator/(const Expr& a, const Expr& c) { return binary("Div", a, c); }
Expr maximum(const Expr& a, const Expr& c) { return binary("Max", a, c); }
Expr operator-(const Expr& a) { return unary("Neg", a); }

// Only identities that are exact for every value (x*1, x/1, x+0, x-0) are folded.
Expr operator+(const Expr& a, double c) { return c == 0.0 ? a : a + scalar_like(a, c); }
Expr operator+(double c, const Expr& a) { return c == 0.0 ? a : scalar_like(a, c) + a; }
Expr operator-(const Expr& a, double c) { return c == 0.0 ? a : a - scalar_like(a, c); }
Expr operator-(double c, const Expr& a) { return scalar_like(a, c) - a; }
Expr operator*(const Expr& a, double c) { return c == 1.0 ? a : a * scalar_like(a, c); }
Expr operator*(double c, const Expr& a) { return c == 1.0 ? a : scalar_like(a, c) * a; }
Expr operator/(const Expr& a, double c) { return c == 1.0 ? a : a / scalar_like(a, c); }
Expr operator/(double c, const Expr& a) { return scalar_like(a, c) / a; }

Expr exp(const Expr& a) { return unary("Exp", a); }
Expr log(const Expr& a) { return unary("Log", a); }
Expr sqrt(const Expr& a) { return unary("Sqrt", a); }
Expr abs(const Expr& a) { return unary("Abs", a); }
Expr sign(const Expr& a) { return unary("Sign", a); }

Expr pow(const Expr& a, const Expr& e) {
  // ONNX Pow allows an exponent of another numeric type; the result has the base's type.
  GraphBuilder& b = builder_of("Pow", a, e);
  return node1(b, "Pow", {a, e}, TypeInfo{a.dtype(), broadcast_or_fail("Pow", a, e)});
}

Expr matmul(const Expr& a, const Expr& c) {
  GraphBuilder& b = builder_of("MatMul", a, c);
  require_same_dtype("MatMul", a, c);
  std::optional<Shape> out;
  if (a.shape() && c.shape()) {
    Shape sa = *a.shape(), sc = *c.shape();
    if (sa.empty() || sc.empty()) fail("Expr MatMul", "scalar operand: " + describe(sa.empty() ? a : c));
    const bool a_vec = sa.size() == 1, c_vec = sc.size() == 1;
    if (a_vec) sa.insert(sa.begin(), Dim::of(1));
    if (c_vec) sc.push_back(Dim::of(1));
    const Dim& k1 = sa[sa.size() - 1];
    const Dim& k2 = sc[sc.size() - 2];
    if (k1.known() && k2.known() && k1.value != k2.value)
      fail("Expr MatMul", "inner dimensions differ: " + describe(a) + " x " + describe(c));
    auto batch = broadcast_shapes(Shape(sa.begin(), sa.end() - 2), Shape(sc.begin(), sc.end() - 2));
    if (!batch) fail("Expr MatMul", "batch dimensions of " + describe(a) + " and " + describe(c) + " do not broadcast");
    out = *batch;
    if (!a_vec) out->push_back(sa[sa.size() - 2]);
    if (!c_vec) out->push_back(sc[sc.size() - 1]);
  }
  return node1(b, "MatMul", {a, c}, TypeInfo{a.dtype(), std::move(out)});
}

Expr transpose(const Expr& a, const std::vector<int64_t>& perm) {
  GraphBuilder& b = builder_of("Transpose", a);
  std::optional<Shape> out;
  std::map<std::string, Attribute> attrs;
  if (!perm.empty()) attrs["perm"] = perm;
  if (a.shape()) {
    const Shape& s = *a.shape();
    std::vector<int64_t> p = perm;
    if (p.empty()) {
      p.resize(s.size());
      std::iota(p.rbegin(), p.rend(), 0);
    }
    std::vector<int64_t> sorted = p;
    std::sort(sorted.begin(), sorted.end());
    for (size_t i = 0; i < sorted.size(); ++i)
      if (sorted.size() != s.size() || sorted[i] != static_cast<int64_t>(i))
        fail("Expr Transpose", "perm is not a permutation of the axes of " + describe(a));
    out = Shape();
    for (int64_t i : p) out->push_back(s[i]);
  }
  return node1(b, "Transpose", {a}, TypeInfo{a.dtype(), std::move(out)}, std::move(attrs));
}

Expr transpose_last2(const Expr& a) {
  if (!a.rank() || *a.rank() < 2)
    fail("Expr transpose_last2", "needs a known rank of at least 2, got " + describe(a));
  std::vector<int64_t> perm(*a.rank());
  std::iota(perm.begin(), perm.end(), 0);
  std::swap(perm[perm.size() - 1], perm[perm.size() - 2]);
  return transpose(a, perm);
}

Expr reduce_sum(const Expr& a, const std::vector<int64_t>& axes, bool keepdims) {
  GraphBuilder& b = builder_of("ReduceSum", a);
  TypeInfo out{a.dtype(), reduced_shape("ReduceSum", a.shape(), axes, keepdims)};
  std::map<std::string, Attribute> attrs{{"keepdims", int64_t{keepdims ? 1 : 0}}};
  // Axes are an input since opset 13; no input (not an empty one) means "every axis".
  if (axes.empty()) return node1(b, "ReduceSum", {a}, std::move(out), std::move(attrs));
  return node1(b, "ReduceSum", {a, int64s(b, axes)}, std::move(out), std::move(attrs));
}

// ReduceMean moved its axes from an attribute to an input at opset 18, so emitting it would tie the graph
// to one side of that change. A sum divided by the element count is valid at every opset we emit: the count
// is a constant when the reduced dims are known, else ReduceProd over the gathered dims (ReduceProd without
// axes reduces everything at every opset).
Expr reduce_mean(const Expr& a, const std::vector<int64_t>& axes, bool keepdims) {
  GraphBuilder& b = builder_of("ReduceMean", a);
  Expr s = reduce_sum(a, axes, keepdims);
  if (a.shape()) {
    int64_t count = 1;
    bool known = true;
    for (int64_t ax : normalize_axes("ReduceMean", axes, a.shape()->size())) {
      const Dim& d = (*a.shape())[ax];
      known = known && d.known();
      if (d.known()) count *= d.value;
    }
    if (known) return s / static_cast<double>(count);
  }
  Expr n;
  if (axes.empty()) {
    n = node1(b, "Size", {a}, TypeInfo{DType::Int64, Shape{}});
  } else {
    Expr dims = node1(b, "Gather", {shape_of(a), int64s(b, axes)},
                      TypeInfo{DType::Int64, Shape{Dim::of(static_cast<int64_t>(axes.size()))}});
    n = node1(b, "ReduceProd", {dims}, TypeInfo{DType::Int64, Shape{}}, {{"keepdims", int64_t{0}}});
  }
  return s / cast(n, a.dtype());
}

Expr reduce_sum_all(const Expr& a) { return reduce_sum(a, {}, false); }
Expr reduce_mean_all(const Expr& a) { return reduce_mean(a, {}, false); }

Expr reshape(const Expr& a, const Expr& shape, std::optional<Shape> result_shape) {
  GraphBuilder& b = builder_of("Reshape", a, shape);
  if (shape.dtype() != DType::Int64) fail("Expr Reshape", "the shape must be int64, got " + describe(shape));
  if (!result_shape) {
    if (auto v = visible_int64s(shape))
      result_shape = reshape_result(a.shape(), *v);
    else if (shape.shape() && shape.shape()->size() == 1 && (*shape.shape())[0].known())
      result_shape = Shape(static_cast<size_t>((*shape.shape())[0].value));
  }
  return node1(b, "Reshape", {a, shape}, TypeInfo{a.dtype(), std::move(result_shape)});
}

Expr reshape_like(const Expr& a, const Expr& like) {
  // Nothing to do when both shapes are fully known and equal.
  if (a.shape() && like.shape() && *a.shape() == *like.shape() &&
      std::all_of(a.shape()->begin(), a.shape()->end(), [](const Dim& d) { return d.known(); }))
    return a;
  return reshape(a, shape_of(like), like.shape());
}

Expr shape_of(const Expr& a) {
  GraphBuilder& b = builder_of("Shape", a);
  Dim r = a.rank() ? Dim::of(static_cast<int64_t>(*a.rank())) : Dim{};
  return node1(b, "Shape", {a}, TypeInfo{DType::Int64, Shape{r}});
}

Expr cast(const Expr& a, DType to) {
  if (a.dtype() == to) return a;
  GraphBuilder& b = builder_of("Cast", a);
  return node1(b, "Cast", {a}, TypeInfo{to, a.shape()}, {{"to", static_cast<int64_t>(to)}});
}

Expr where(const Expr& cond, const Expr& a, const Expr& c) {
  GraphBuilder& b = builder_of("Where", cond, a);
  builder_of("Where", a, c);
  if (cond.dtype() != DType::Bool) fail("Expr Where", "the condition must be bool, got " + describe(cond));
  require_same_dtype("Where", a, c);
  auto s = broadcast_shapes(broadcast_or_fail("Where", a, c), cond.shape());
  if (!s && cond.shape() && a.shape() && c.shape())
    fail("Expr Where", "the condition " + describe(cond) + " does not broadcast with " + describe(a));
  return node1(b, "Where", {cond, a, c}, TypeInfo{a.dtype(), std::move(s)});
}

Expr less(const Expr& a, const Expr& c) { return compare("Less", a, c); }
Expr greater(const Expr& a, const Expr& c) { return compare("Greater", a, c); }
Expr equal(const Expr& a, const Expr& c) { return compare("Equal", a, c); }

Expr expand(const Expr& a, const Expr& shape, std::optional<Shape> result_shape) {
  GraphBuilder& b = builder_of("Expand", a, shape);
  if (shape.dtype() != DType::Int64) fail("Expr Expand", "the shape must be int64, got " + describe(shape));
  if (!result_shape) {
    if (auto v = visible_int64s(shape)) {
      result_shape = broadcast_shapes(a.shape(), shape_of_dims(*v));
      if (!result_shape && a.shape()) fail("Expr Expand", describe(a) + " does not broadcast to the target shape");
    } else if (a.shape() && shape.shape() && shape.shape()->size() == 1 && (*shape.shape())[0].known()) {
      // Target dims unknown: the result keeps any input dim other than 1 (the target must match it).
      auto target = static_cast<size_t>((*shape.shape())[0].value);
      const Shape& s = *a.shape();
      Shape out(std::max(target, s.size()));
      for (size_t i = 0; i < s.size(); ++i) {
        const Dim& d = s[s.size() - 1 - i];
        if (d.known() && d.value != 1) out[out.size() - 1 - i] = d;
      }
      result_shape = std::move(out);
    }
  }
  return node1(b, "Expand", {a, shape}, TypeInfo{a.dtype(), std::move(result_shape)});
}

namespace {
Expr filled_like(const Expr& a, double v) {
  GraphBuilder& b = builder_of("ConstantOfShape", a);
  TensorData fill = TensorData::scalar_as(a.dtype(), v);
  fill.dims = {1};
  return node1(b, "ConstantOfShape", {shape_of(a)}, a.type, {{"value", std::move(fill)}});
}
}  // namespace

Expr zeros_like(const Expr& a) { return filled_like(a, 0.0); }
Expr ones_like(const Expr& a) { return filled_like(a, 1.0); }

Expr sum(const std::vector<Expr>& xs) {
  if (xs.empty()) fail("Expr Sum", "needs at least one operand");
  if (xs.size() == 1) return xs[0];
  GraphBuilder& b = builder_of("Sum", xs[0]);
  std::optional<Shape> s = xs[0].shape();
  bool all_known = s.has_value();
  for (size_t i = 1; i < xs.size(); ++i) {
    builder_of("Sum", xs[0], xs[i]);
    require_same_dtype("Sum", xs[0], xs[i]);
    all_known = all_known && xs[i].shape().has_value();
    s = broadcast_shapes(s, xs[i].shape());
    if (!s && all_known) fail("Expr Sum", "operand " + describe(xs[i]) + " does not broadcast with the others");
  }
  return node1(b, "Sum", xs, TypeInfo{xs[0].dtype(), std::move(s)});
}

Expr apply(GraphBuilder& b, const std::string& op, const std::vector<Expr>& inputs, TypeInfo out_type,
           std::map<std::string, Attribute> attrs, const std::string& domain) {
  return apply_n(b, op, inputs, {std::move(out_type)}, std::move(attrs), domain)[0];
}

std::vector<Expr> apply_n(GraphBuilder& b, const std::string& op, const std::vector<Expr>& inputs,
                          std::vector<TypeInfo> out_types, std::map<std::string, Attribute> attrs,
                          const std::string& domain) {
  std::vector<std::string> names;
  names.reserve(inputs.size());
  for (const Expr& e : inputs) names.push_back(e.valid() ? e.name : std::string());
  auto outs = b.add_node(op, std::move(names), out_types.size(), std::move(attrs), domain);
  std::vector<Expr> result;
  result.reserve(outs.size());
  for (size_t i = 0; i < outs.size(); ++i) result.push_back(make(b, outs[i], std::move(out_types[i])));
  return result;
}

}  // namespace onnxtrain
