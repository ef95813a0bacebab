// Gradients of ops that move data without arithmetic.
#include <algorithm>
#include <limits>
#include <numeric>

#include "gradients/fused.h"
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
  // Scatter-add of dY into zeros shaped like the data (indices repeat in embeddings, so a plain scatter would
  // lose sums), as the fused GatherGrad: its body scatters with ScatterElements(reduction='add'), opset 16.
  if (c.opset() < 16) c.fail("needs opset 16 or newer (ScatterElements with reduction='add'), the model has opset " +
                             std::to_string(c.opset()));
  GraphBuilder& b = c.builder();
  const TypeInfo xt = rules::input_type(c, 0);
  int64_t axis = c.node().attr_int("axis", 0);
  if (xt.shape) {
    const auto r = static_cast<int64_t>(xt.shape->size());
    if (axis < -r || axis >= r) c.fail("axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(r));
    if (axis < 0) axis += r;
  }
  // Only the data's shape is needed: a constant when static, so the data itself need not stay alive.
  auto dims = rules::static_dims(xt);
  Expr shape = dims ? int64s(b, *dims) : shape_of(c.X(0));
  c.set_dX(0, apply(b, "GatherGrad", {c.dY(0), c.X(1), shape}, xt, {{"axis", axis}}, kFusedGradDomain));
}

// ---- Slice ----------------------------------------------------------------------------------------------
// dX is dY put back where the slice took it from, zeros elsewhere: one Pad of (the rearranged) dY. Along an
// axis with step s != 1 the elements of dY lie |s| apart, so dY is first brought to ascending order (a
// reversing Slice when s < 0) and each element followed by |s| - 1 zeros (Unsqueeze, Pad, Reshape); the
// final Pad then places that run, cropping the zeros after the last element with a negative end pad.

// An int64 value of shape [1] that is either known now or computed at run time from shapes.
struct IntVal {
  std::optional<int64_t> known;
  Expr dynamic;
};

Expr as_expr(GraphBuilder& b, const IntVal& v) { return v.known ? int64s(b, {*v.known}) : v.dynamic; }

IntVal int_binary(GraphBuilder& b, const char* op, const IntVal& x, const IntVal& y) {
  return {std::nullopt, apply(b, op, {as_expr(b, x), as_expr(b, y)}, TypeInfo{DType::Int64, Shape{Dim::of(1)}})};
}

struct SliceAxis {
  int64_t axis = 0;
  int64_t start = 0, end = 0, step = 1;  // as given
};

// starts/ends/axes/steps: attributes before opset 10, constant inputs from then on.
std::vector<SliceAxis> slice_params(RuleContext& c, int64_t rank) {
  std::vector<int64_t> starts, ends, axes, steps;
  if (c.opset() < 10) {
    starts = c.node().attr_ints("starts");
    ends = c.node().attr_ints("ends");
    axes = c.node().attr_ints("axes");
  } else {
    auto get = [&](size_t i, const char* what) -> std::vector<int64_t> {
      if (!c.has_input(i)) return {};
      auto v = rules::constant_int64s(c.builder().graph(), c.node().inputs[i]);
      if (!v) c.fail(std::string(what) + " must be an int64 constant (an initializer or Constant node)");
      return *v;
    };
    starts = get(1, "starts");
    ends = get(2, "ends");
    axes = get(3, "axes");
    steps = get(4, "steps");
  }
  if (axes.empty())
    for (size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
  if (steps.empty()) steps.assign(starts.size(), 1);
  if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size())
    c.fail("starts, ends, axes and steps must have the same length");
  std::vector<SliceAxis> r;
  std::vector<bool> seen(rank, false);
  for (size_t i = 0; i < starts.size(); ++i) {
    int64_t a = axes[i];
    if (a < -rank || a >= rank) c.fail("axis " + std::to_string(a) + " is out of range for rank " + std::to_string(rank));
    if (a < 0) a += rank;
    if (seen[a]) c.fail("axis " + std::to_string(axes[i]) + " is repeated");
    seen[a] = true;
    if (steps[i] == 0) c.fail("steps must not be 0");
    r.push_back({a, starts[i], ends[i], steps[i]});
  }
  return r;
}

// ONNX's clamping of a start or end against a dim of size d: negative counts from the back, then clamped to
// [0, d] for positive steps and [-1, d - 1] for negative ones.
int64_t clamp_index(int64_t v, int64_t d, int64_t step, bool is_end) {
  if (v < 0) v += d;
  if (step > 0) return std::clamp<int64_t>(v, 0, d);
  return std::clamp<int64_t>(v, is_end ? -1 : 0, d - 1);
}

void slice_rule(RuleContext& c) {
  GraphBuilder& b = c.builder();
  const TypeInfo xt = rules::input_type(c, 0);
  if (!xt.shape) c.fail("needs the input's rank");
  const auto rank = static_cast<int64_t>(xt.shape->size());
  const std::vector<SliceAxis> params = slice_params(c, rank);
  Expr g = c.dY(0);
  std::vector<IntVal> begins(rank, IntVal{0, {}}), ends(rank, IntVal{0, {}});
  std::optional<Expr> x_shape;  // Shape(X), emitted once when some sliced dim is symbolic
  for (const SliceAxis& p : params) {
    const Dim& dim = (*xt.shape)[p.axis];
    if (!dim.known()) {
      // Symbolic dim (a sequence length, say): only unit steps, with the clamping done by graph ops.
      if (p.step != 1)
        c.fail("needs the size of axis " + std::to_string(p.axis) + " to be known for a step of " +
               std::to_string(p.step));
      if (c.opset() < 11) c.fail("needs opset 11 (Pad with a pads input) when axis " + std::to_string(p.axis) +
                                 " has a symbolic size");
      if (!x_shape) x_shape = shape_of(c.X(0));
      IntVal d{std::nullopt, apply(b, "Gather", {*x_shape, int64s(b, {p.axis})}, TypeInfo{DType::Int64, Shape{Dim::of(1)}})};
      IntVal zero{0, {}};
      auto clamp = [&](int64_t v) -> IntVal {
        if (v >= 0) return v == 0 ? zero : int_binary(b, "Min", IntVal{v, {}}, d);
        return int_binary(b, "Max", int_binary(b, "Add", IntVal{v, {}}, d), zero);
      };
      IntVal start = clamp(p.start), end = clamp(p.end);
      begins[p.axis] = start;
      // An end before the start is an empty slice: all of the axis is padding.
      ends[p.axis] = int_binary(b, "Sub", d, int_binary(b, "Max", end, start));
      continue;
    }
    const int64_t d = dim.value;
    const int64_t start = clamp_index(p.start, d, p.step, false), end = clamp_index(p.end, d, p.step, true);
    const int64_t mag = p.step > 0 ? p.step : -p.step;
    const int64_t dist = p.step > 0 ? end - start : start - end;
    const int64_t len = dist <= 0 ? 0 : (dist + mag - 1) / mag;
    // The lowest index the slice read; dY's elements run upwards from there once in ascending order.
    const int64_t low = p.step > 0 ? start : start - (len - 1) * mag;
    if (len == 0) {
      begins[p.axis] = IntVal{0, {}};
      ends[p.axis] = IntVal{d, {}};
      continue;
    }
    if (p.step < 0 && len > 1) {
      TypeInfo t = g.type;
      g = apply(b, "Slice",
                {g, int64s(b, {-1}), int64s(b, {std::numeric_limits<int64_t>::min()}), int64s(b, {p.axis}),
                 int64s(b, {-1})},
                t);
    }
    int64_t run = len;
    if (mag > 1 && len > 1) {
      // [.., len, ..] -> [.., len, 1, ..] -> [.., len, mag, ..] (zeros after each) -> [.., len * mag, ..]
      Expr u = rules::unsqueeze(g, {p.axis + 1}, c.opset());
      std::vector<int64_t> pads(2 * (rank + 1), 0);
      pads[rank + 1 + p.axis + 1] = mag - 1;
      std::optional<Shape> padded_shape;
      if (u.shape()) {
        padded_shape = *u.shape();
        (*padded_shape)[p.axis + 1] = Dim::of(mag);
      }
      Expr padded = c.opset() < 11 ? apply(b, "Pad", {u}, TypeInfo{g.dtype(), padded_shape}, {{"pads", pads}})
                                   : apply(b, "Pad", {u, int64s(b, pads)}, TypeInfo{g.dtype(), padded_shape});
      std::optional<Shape> merged;
      if (g.shape()) {
        merged = *g.shape();
        (*merged)[p.axis] = Dim::of(len * mag);
      }
      // Reshape target: 0 copies the leading dims; the trailing ones must be spelled out.
      std::vector<int64_t> target(p.axis, 0);
      target.push_back(len * mag);
      bool trailing_known = g.shape().has_value();
      for (int64_t k = p.axis + 1; trailing_known && k < rank; ++k) {
        const Dim& td = (*g.shape())[k];
        if (!td.known()) trailing_known = false;
        else target.push_back(td.value);
      }
      if (!trailing_known) c.fail("needs the dims after axis " + std::to_string(p.axis) + " to be known for a step of " +
                                  std::to_string(p.step));
      g = reshape(padded, int64s(b, target), merged);
      run = len * mag;
    }
    begins[p.axis] = IntVal{low, {}};
    ends[p.axis] = IntVal{d - low - run, {}};
  }
  bool all_known = true;
  std::vector<int64_t> known_pads;
  for (const auto* side : {&begins, &ends})
    for (const IntVal& v : *side) {
      all_known = all_known && v.known.has_value();
      if (v.known) known_pads.push_back(*v.known);
    }
  if (all_known && std::all_of(known_pads.begin(), known_pads.end(), [](int64_t v) { return v == 0; }))
    return c.set_dX(0, g);
  TypeInfo out{g.dtype(), xt.shape};
  if (c.opset() < 11) return c.set_dX(0, apply(b, "Pad", {g}, out, {{"pads", known_pads}}));
  Expr pads;
  if (all_known) {
    pads = int64s(b, known_pads);
  } else {
    std::vector<Expr> parts;
    for (const auto* side : {&begins, &ends})
      for (const IntVal& v : *side) parts.push_back(as_expr(b, v));
    pads = apply(b, "Concat", parts, TypeInfo{DType::Int64, Shape{Dim::of(2 * rank)}}, {{"axis", int64_t{0}}});
  }
  c.set_dX(0, apply(b, "Pad", {g, pads}, out));
}

void split_rule(RuleContext& c) {
  // The engine hands zeros for outputs nobody reads, so the pieces always tile the input.
  std::vector<Expr> pieces;
  for (size_t i = 0; i < c.num_outputs(); ++i) pieces.push_back(c.dY(i));
  if (pieces.size() == 1) return c.set_dX(0, pieces[0]);
  c.set_dX(0, apply(c.builder(), "Concat", pieces, rules::input_type(c, 0), {{"axis", c.node().attr_int("axis", 0)}}));
}

// CenterCropPad crops some axes and zero-pads others, each centred the same way (the odd element at the end),
// so its adjoint is itself: cropping dY back to X's size undoes the padding and zero-padding it back undoes
// the crop. dX = CenterCropPad(dY, X's dims at axes), same axes.
void center_crop_pad_rule(RuleContext& c) {
  const TypeInfo xt = rules::input_type(c, 0);
  if (!xt.shape) c.fail("needs the rank of input_data");
  const auto rank = static_cast<int64_t>(xt.shape->size());
  std::vector<int64_t> axes = c.node().attr_ints("axes");
  if (!c.node().has_attr("axes"))
    for (int64_t d = 0; d < rank; ++d) axes.push_back(d);
  for (int64_t& a : axes) {
    if (a < -rank || a >= rank) c.fail("axis " + std::to_string(a) + " is out of range for rank " + std::to_string(rank));
    if (a < 0) a += rank;
  }
  GraphBuilder& b = c.builder();
  std::vector<int64_t> dims;
  for (int64_t a : axes)
    if ((*xt.shape)[a].known()) dims.push_back((*xt.shape)[a].value);
  Expr shape = dims.size() == axes.size()
                   ? int64s(b, dims)
                   : apply(b, "Gather", {shape_of(c.X(0)), int64s(b, axes)},
                           TypeInfo{DType::Int64, Shape{Dim::of(static_cast<int64_t>(axes.size()))}});
  c.set_dX(0, apply(b, "CenterCropPad", {c.dY(0), shape}, TypeInfo{c.dY(0).dtype(), xt.shape}, {{"axes", axes}}));
}

// Compress keeps the slices j of X (along axis, or of the flattened X) whose condition entry is true; slice j
// becomes slice pos[j] of Y. Its adjoint puts dY's slice pos[j] back at j and zeros elsewhere:
//   dX = Where(kept, Gather(dY, pos, axis), 0)
// with the constants kept[j] (the condition, padded with false to X's length) and pos[j] (0 where not kept,
// masked anyway). The condition must be a constant, as the kernel requires too.
void compress_rule(RuleContext& c) {
  GraphBuilder& b = c.builder();
  const TypeInfo xt = rules::input_type(c, 0);
  if (!xt.shape) c.fail("needs the rank of input");
  const TensorData* cond = rules::constant_tensor(b.graph(), c.node().inputs[1]);
  if (!cond || cond->dtype != DType::Bool || cond->dims.size() != 1)
    c.fail("needs 'condition' to be a constant 1-D bool tensor (an initializer or a Constant)");
  const auto rank = static_cast<int64_t>(xt.shape->size());
  const bool has_axis = c.node().has_attr("axis");
  int64_t axis = c.node().attr_int("axis", 0);
  if (has_axis && (axis < -rank || axis >= rank))
    c.fail("axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(rank));
  if (axis < 0) axis += rank;
  int64_t len = 1;
  if (has_axis) {
    if (!(*xt.shape)[axis].known()) c.fail("needs the size of input's axis " + std::to_string(axis) + " statically");
    len = (*xt.shape)[axis].value;
  } else {
    for (const Dim& d : *xt.shape) {
      if (!d.known()) c.fail("needs the input's dims statically (Compress without axis flattens it)");
      len *= d.value;
    }
  }
  std::vector<int64_t> pos(len, 0);
  std::vector<bool> kept(len, false);
  int64_t n_kept = 0;
  for (int64_t j = 0; j < cond->dims[0] && j < len; ++j)
    if (cond->bytes[j] != std::byte{0}) {
      kept[j] = true;
      pos[j] = n_kept++;
    }
  Expr dy = c.dY(0);
  if (n_kept == 0) return c.set_dX(0, zeros_like(c.X(0)));  // nothing kept: dY is empty
  // kept as [len, 1, ..., 1], broadcasting along the dims after the axis.
  const int64_t g_axis = has_axis ? axis : 0, trailing = has_axis ? rank - axis - 1 : 0;
  TensorData mask;
  mask.dtype = DType::Bool;
  mask.dims = {len};
  mask.dims.insert(mask.dims.end(), trailing, 1);
  for (bool k : kept) mask.bytes.push_back(std::byte{k ? uint8_t{1} : uint8_t{0}});
  const Shape gathered = has_axis ? *xt.shape : Shape{Dim::of(len)};  // dY's shape with X's length at the axis
  Expr spread = apply(b, "Gather", {dy, int64s(b, pos)}, TypeInfo{dy.dtype(), gathered}, {{"axis", g_axis}});
  Expr dx = where(constant(b, mask), spread, scalar(b, dy.dtype(), 0.0));
  c.set_dX(0, has_axis ? dx : rules::reshape_to_input(c, dx, 0));
}

// ---- Tile, Pad, DepthToSpace, SpaceToDepth, Trilu --------------------------------------------------------

void tile_rule(RuleContext& c) {
  // Output dim k is (repeat, original) with the repeat outer: view dY that way and sum the repeats out.
  const TypeInfo xt = rules::input_type(c, 0);
  auto dims = rules::static_dims(xt);
  if (!dims) c.fail("needs the input's shape to be known statically");
  auto reps = rules::constant_int64s(c.builder().graph(), c.node().inputs[1]);
  if (!reps) c.fail("repeats must be an int64 constant (an initializer or Constant node)");
  if (reps->size() != dims->size()) c.fail("repeats does not match the input's rank");
  std::vector<int64_t> view, axes;
  Shape view_shape;
  for (size_t k = 0; k < dims->size(); ++k) {
    axes.push_back(static_cast<int64_t>(2 * k));
    view.insert(view.end(), {(*reps)[k], (*dims)[k]});
    view_shape.push_back(Dim::of((*reps)[k]));
    view_shape.push_back(Dim::of((*dims)[k]));
  }
  if (std::all_of(reps->begin(), reps->end(), [](int64_t r) { return r == 1; })) return c.set_dX(0, c.dY(0));
  Expr v = reshape(c.dY(0), int64s(c.builder(), view), view_shape);
  c.set_dX(0, rules::reduce_sum(v, axes, false, c.opset()));
}

void pad_rule(RuleContext& c) {
  // Pad with the negated pads crops what was added and puts back (as zeros) what a negative pad cropped.
  const std::string mode = c.node().attr_string("mode", "constant");
  if (mode != "constant") c.fail("has no gradient for mode '" + mode + "' yet (only 'constant')");
  GraphBuilder& b = c.builder();
  const TypeInfo xt = rules::input_type(c, 0);
  Expr dy = c.dY(0), dx;
  if (c.opset() < 11) {
    std::vector<int64_t> pads = c.node().attr_ints("pads");
    for (int64_t& p : pads) p = -p;
    dx = apply(b, "Pad", {dy}, xt, {{"pads", pads}});
  } else {
    auto pads = rules::constant_int64s(b.graph(), c.node().inputs[1]);
    if (!pads) c.fail("pads must be an int64 constant (an initializer or Constant node)");
    for (int64_t& p : *pads) p = -p;
    std::vector<Expr> ins{dy, int64s(b, *pads)};
    if (c.has_input(3)) {
      auto axes = rules::constant_int64s(b.graph(), c.node().inputs[3]);
      if (!axes) c.fail("axes must be an int64 constant (an initializer or Constant node)");
      ins.push_back(scalar(b, dy.dtype(), 0.0));  // constant_value must precede axes
      ins.push_back(int64s(b, *axes));
    }
    dx = apply(b, "Pad", ins, xt);
  }
  // constant_value is non-differentiable in the ONNX schema, so the engine never asks for its gradient.
  c.set_dX(0, dx);
}

void depth_to_space_rule(RuleContext& c) {
  GraphBuilder& b = c.builder();
  const int64_t bs = c.node().attr_int("blocksize", 0);
  const TypeInfo xt = rules::input_type(c, 0);
  const std::string mode = c.opset() >= 11 ? c.node().attr_string("mode", "DCR") : "DCR";
  // DCR is exactly undone by SpaceToDepth.
  if (mode == "DCR") return c.set_dX(0, apply(b, "SpaceToDepth", {c.dY(0)}, xt, {{"blocksize", bs}}));
  // CRD: y[n, c, h*b + i, w*b + j] = x[n, (c*b + i)*b + j, h, w]; undo with reshape, transpose, reshape.
  if (!xt.shape || xt.shape->size() != 4) c.fail("needs a 4-D input");
  const Shape& s = *xt.shape;
  if (!s[1].known() || !s[2].known() || !s[3].known()) c.fail("needs the input's C, H and W to be known statically");
  const int64_t C = s[1].value, H = s[2].value, W = s[3].value, ch = C / (bs * bs);
  Shape six{s[0], Dim::of(ch), Dim::of(H), Dim::of(bs), Dim::of(W), Dim::of(bs)};
  Expr v = reshape(c.dY(0), int64s(b, {0, ch, H, bs, W, bs}), six);
  Expr t = transpose(v, {0, 1, 3, 5, 2, 4});
  c.set_dX(0, reshape(t, int64s(b, {0, C, H, W}), s));
}

void space_to_depth_rule(RuleContext& c) {
  c.set_dX(0, apply(c.builder(), "DepthToSpace", {c.dY(0)}, rules::input_type(c, 0),
                    {{"blocksize", c.node().attr_int("blocksize", 0)}}));
}

void trilu_rule(RuleContext& c) {
  // The same mask applies to dY.
  std::vector<Expr> ins{c.dY(0)};
  if (c.has_input(1)) ins.push_back(c.X(1));
  c.set_dX(0, apply(c.builder(), "Trilu", ins, rules::input_type(c, 0), {{"upper", c.node().attr_int("upper", 1)}}));
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
  r.add("Slice", slice_rule);
  r.add("Split", split_rule);
  r.add("CenterCropPad", center_crop_pad_rule);
  r.add("Compress", compress_rule);
  r.add("Tile", tile_rule);
  r.add("Pad", pad_rule);
  r.add("DepthToSpace", depth_to_space_rule);
  r.add("SpaceToDepth", space_to_depth_rule);
  r.add("Trilu", trilu_rule);
}

}  // namespace onnxtrain
