// Gradients of ops that move data without arithmetic.
#include <numeric>

#include "gradients/rule.h"
#include "gradients/rules/util.h"

namespace onnxtrain {

namespace {

void concat_rule(RuleContext& c) {
  // Split dY back into the pieces, along the concatenation axis.
  const size_t n = c.num_inputs();
  std::vector<TypeInfo> types;
  for (size_t i = 0; i < n; ++i) types.push_back(rules::input_type(c, i));
  if (!types[0].shape) c.fail("needs the rank of the inputs");
  const auto rank = static_cast<int64_t>(types[0].shape->size());
  int64_t axis = c.node().attr_int("axis", 0);
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= rank) c.fail("axis is out of range for rank " + std::to_string(rank));
  std::vector<int64_t> sizes;
  for (const TypeInfo& t : types)
    if (t.shape && (*t.shape)[axis].known()) sizes.push_back((*t.shape)[axis].value);
  Expr split;
  if (c.opset() < 13) {
    // Split takes its sizes as an attribute before opset 13, so they must be known statically.
    if (sizes.size() != n) c.fail("needs the inputs' sizes along the axis at opset " + std::to_string(c.opset()));
    auto pieces = apply_n(c.builder(), "Split", {c.dY(0)}, types, {{"axis", axis}, {"split", sizes}});
    for (size_t i = 0; i < n; ++i) c.set_dX(i, pieces[i]);
    return;
  }
  if (sizes.size() == n) {
    split = int64s(c.builder(), sizes);
  } else {
    std::vector<Expr> parts;
    Expr at = int64s(c.builder(), {axis});
    for (size_t i = 0; i < n; ++i)
      parts.push_back(apply(c.builder(), "Gather", {shape_of(c.X(i)), at}, TypeInfo{DType::Int64, Shape{Dim::of(1)}}));
    split = apply(c.builder(), "Concat", parts, TypeInfo{DType::Int64, Shape{Dim::of(static_cast<int64_t>(n))}},
                  {{"axis", int64_t{0}}});
  }
  auto pieces = apply_n(c.builder(), "Split", {c.dY(0), split}, types, {{"axis", axis}});
  for (size_t i = 0; i < n; ++i) c.set_dX(i, pieces[i]);
}

void gather_rule(RuleContext& c) {
  // Scatter-add dY into zeros shaped like X: indices repeat (embeddings), so plain scatter would lose sums.
  // ScatterND indexes the leading axis, so the gathered axis is moved to the front and back again.
  if (c.opset() < 16) c.fail("needs opset 16 or newer (ScatterND with reduction='add'), the model has opset " +
                             std::to_string(c.opset()));
  Expr x = c.X(0), idx = c.X(1), dy = c.dY(0);
  if (!x.rank() || !idx.rank()) c.fail("needs the ranks of data and indices");
  const auto r = static_cast<int64_t>(*x.rank()), q = static_cast<int64_t>(*idx.rank());
  int64_t axis = c.node().attr_int("axis", 0);
  if (axis < 0) axis += r;
  if (axis < 0 || axis >= r) c.fail("axis is out of range for rank " + std::to_string(r));
  Expr idx64 = cast(idx, DType::Int64);
  Expr index = rules::unsqueeze(idx64, {-1}, c.opset());
  if (axis == 0) {
    c.set_dX(0, apply(c.builder(), "ScatterND", {zeros_like(x), index, dy}, x.type, {{"reduction", std::string("add")}}));
    return;
  }
  // dY is [X[:axis], I, X[axis+1:]]; updates must be [I, X[:axis], X[axis+1:]].
  std::vector<int64_t> dy_perm;
  for (int64_t i = 0; i < q; ++i) dy_perm.push_back(axis + i);
  for (int64_t i = 0; i < axis; ++i) dy_perm.push_back(i);
  for (int64_t i = axis + q; i < r - 1 + q; ++i) dy_perm.push_back(i);
  std::vector<int64_t> x_perm{axis};
  for (int64_t i = 0; i < r; ++i)
    if (i != axis) x_perm.push_back(i);
  std::vector<int64_t> back(r);
  for (int64_t i = 0; i < r; ++i) back[x_perm[i]] = i;
  Expr xt = transpose(zeros_like(x), x_perm);
  Expr scattered = apply(c.builder(), "ScatterND", {xt, index, transpose(dy, dy_perm)}, xt.type,
                         {{"reduction", std::string("add")}});
  c.set_dX(0, transpose(scattered, back));
}

}  // namespace

void register_shape_rules(GradientRegistry& r) {
  for (const char* op : {"Reshape", "Flatten"})
    r.add(op, [](RuleContext& c) { c.set_dX(0, rules::reshape_to_input(c, c.dY(0), 0)); });
  r.add("Squeeze", [](RuleContext& c) {
    bool present = false;
    auto axes = rules::axes_arg(c, "axes", 1, 13, present);
    // With the axes known, put the size-1 dims back; without axes every size-1 dim went, so use X's shape.
    if (present && axes && !axes->empty())
      c.set_dX(0, rules::unsqueeze(c.dY(0), *axes, c.opset()));
    else
      c.set_dX(0, rules::reshape_to_input(c, c.dY(0), 0));
  });
  r.add("Unsqueeze", [](RuleContext& c) {
    bool present = false;
    auto axes = rules::axes_arg(c, "axes", 1, 13, present);
    if (axes && !axes->empty())
      c.set_dX(0, rules::squeeze(c.dY(0), *axes, c.opset()));
    else
      c.set_dX(0, rules::reshape_to_input(c, c.dY(0), 0));
  });
  r.add("Transpose", [](RuleContext& c) {
    std::vector<int64_t> perm = c.node().attr_ints("perm");
    if (perm.empty()) return c.set_dX(0, transpose(c.dY(0), {}));  // the reversal is its own inverse
    std::vector<int64_t> inverse(perm.size());
    for (size_t i = 0; i < perm.size(); ++i) {
      if (perm[i] < 0 || perm[i] >= static_cast<int64_t>(perm.size())) c.fail("perm is not a permutation");
      inverse[perm[i]] = static_cast<int64_t>(i);
    }
    c.set_dX(0, transpose(c.dY(0), inverse));
  });
  // Expand is broadcasting: the engine sums dY back to the input's shape.
  r.add("Expand", [](RuleContext& c) { c.set_dX(0, c.dY(0)); });
  r.add("Concat", concat_rule);
  r.add("Gather", gather_rule);
}

}  // namespace onnxtrain
