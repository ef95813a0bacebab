// Gradients of ops that fit no other family: Tile, Pad, Clip, CumSum, Dropout, DepthToSpace, SpaceToDepth,
// Einsum, NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss, Trilu, TopK.
#include <algorithm>
#include <cctype>
#include <map>

#include "gradients/rule.h"
#include "gradients/rules/util.h"
#include "graph/einsum.h"

namespace onnxtrain {

namespace {

Expr zero_of(RuleContext& c, const Expr& like) { return scalar(c.builder(), like.dtype(), 0.0); }

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

void clip_rule(RuleContext& c) {
  // y = min(max(x, lo), hi): x passes its gradient where lo <= x <= hi.
  GraphBuilder& b = c.builder();
  Expr x = c.X(0), dy = c.dY(0), zero = zero_of(c, dy);
  std::optional<Expr> lo, hi;
  if (c.opset() < 11) {
    if (c.node().has_attr("min")) lo = scalar(b, x.dtype(), c.node().attr_float("min", 0));
    if (c.node().has_attr("max")) hi = scalar(b, x.dtype(), c.node().attr_float("max", 0));
  } else {
    if (c.has_input(1)) lo = c.X(1);
    if (c.has_input(2)) hi = c.X(2);
  }
  // min and max are non-differentiable in the ONNX schema: only x gets a gradient.
  Expr g = dy;
  if (lo) g = where(less(x, *lo), zero, g);
  if (hi) g = where(greater(x, *hi), zero, g);
  c.set_dX(0, g);
}

void cumsum_rule(RuleContext& c) {
  // Each x_j reaches the outputs after it (before it, reversed): the gradient is the opposite-direction
  // cumulative sum, exclusive when the forward was.
  const int64_t reverse = c.node().attr_int("reverse", 0) != 0 ? 0 : 1;
  c.set_dX(0, apply(c.builder(), "CumSum", {c.dY(0), c.X(1)}, rules::input_type(c, 0),
                    {{"exclusive", c.node().attr_int("exclusive", 0)}, {"reverse", reverse}}));
}

void dropout_rule(RuleContext& c) {
  // Inference is the identity; in training y = x * mask / (1 - ratio), read back through the mask output.
  if (c.opset() < 12 || !c.has_input(2)) return c.set_dX(0, c.dY(0));
  if (c.num_outputs() < 2 || c.node().outputs[1].empty())
    c.fail("needs the mask output to differentiate training-mode Dropout (add a second output to the node)");
  GraphBuilder& b = c.builder();
  Expr dy = c.dY(0);
  const DType dt = dy.dtype();
  Expr ratio = c.has_input(1) ? cast(c.X(1), dt) : scalar(b, dt, 0.5);
  // Inference mode (training_mode false at run time) has an all-true mask and no scaling.
  Expr scale = where(c.X(2), 1.0 / (1.0 - ratio), scalar(b, dt, 1.0));
  c.set_dX(0, where(c.Y(1), dy * scale, zero_of(c, dy)));
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

void trilu_rule(RuleContext& c) {
  // The same mask applies to dY.
  std::vector<Expr> ins{c.dY(0)};
  if (c.has_input(1)) ins.push_back(c.X(1));
  c.set_dX(0, apply(c.builder(), "Trilu", ins, rules::input_type(c, 0), {{"upper", c.node().attr_int("upper", 1)}}));
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

void register_misc_rules(GradientRegistry& r) {
  r.add("Tile", tile_rule);
  r.add("Pad", pad_rule);
  r.add("Clip", clip_rule);
  r.add("CumSum", cumsum_rule);
  r.add("Dropout", dropout_rule);
  r.add("DepthToSpace", depth_to_space_rule);
  r.add("SpaceToDepth", space_to_depth_rule);
  r.add("Einsum", einsum_rule);
  r.add("Trilu", trilu_rule);
  r.add("TopK", topk_rule);
  r.add("NegativeLogLikelihoodLoss", nll_rule);
  r.add("SoftmaxCrossEntropyLoss", sce_rule);
}

}  // namespace onnxtrain
