// Window geometry shared by the convolution and pooling rules (rules/window.h).
#include "gradients/rules/window.h"

#include "gradients/rules/util.h"
#include "graph/error.h"
#include "graph/window.h"

namespace onnxtrain::rules {

std::vector<int64_t> spatial_attr(RuleContext& c, const std::string& name, size_t n, int64_t fallback) {
  std::vector<int64_t> v = c.node().attr_ints(name, std::vector<int64_t>(n, fallback));
  if (v.size() != n)
    c.fail("attribute '" + name + "' has " + std::to_string(v.size()) + " entries, expected " + std::to_string(n));
  // window() divides by strides: a zero must be an error here, since ONNX's inference, which would have
  // crashed on it in its child process, does not see every node whose shape we know (infer_missing).
  const int64_t least = name == "output_padding" ? 0 : 1;
  for (int64_t x : v)
    if (x < least)
      c.fail("attribute '" + name + "' has " + std::to_string(x) + "; expected every value >= " + std::to_string(least));
  return v;
}

// The input's type with every spatial dim known; fails naming what is missing.
TypeInfo spatial_known(RuleContext& c, size_t i) {
  TypeInfo t = rules::input_type(c, i);
  if (!t.shape || t.shape->size() < 3)
    c.fail("needs input " + std::to_string(i) + " with a known rank >= 3 (its gradient geometry depends on it)");
  for (size_t j = 2; j < t.shape->size(); ++j)
    if (!(*t.shape)[j].known())
      c.fail("needs the spatial dims of input " + std::to_string(i) + " to be known statically, got " +
             to_string(*t.shape));
  return t;
}

// The forward window geometry of Conv or a pooling op, as the kernels compute it (executor/cpu/conv.cpp).
Win window(RuleContext& c, const Shape& xs, const std::vector<int64_t>& kernel, bool ceil_mode) {
  Win w;
  w.r = xs.size() - 2;
  if (kernel.size() != w.r) c.fail("kernel has " + std::to_string(kernel.size()) + " dims for input " + to_string(xs));
  w.k = kernel;
  w.s = spatial_attr(c, "strides", w.r, 1);
  w.d = spatial_attr(c, "dilations", w.r, 1);
  std::vector<int64_t> pads = c.node().attr_ints("pads", std::vector<int64_t>(2 * w.r, 0));
  if (pads.size() != 2 * w.r) c.fail("attribute 'pads' must have " + std::to_string(2 * w.r) + " entries");
  const std::string auto_pad = c.node().attr_string("auto_pad", "NOTSET");
  if (!is_auto_pad(auto_pad)) c.fail("auto_pad '" + auto_pad + "' is not one of NOTSET, SAME_UPPER, SAME_LOWER, VALID");
  for (size_t i = 0; i < w.r; ++i) {
    const int64_t in = xs[2 + i].value;
    const WindowDim win = forward_window(in, (w.k[i] - 1) * w.d[i] + 1, w.s[i], pads[i], pads[i + w.r], auto_pad, ceil_mode);
    const int64_t out = win.out, pb = win.pad_begin, pe = win.pad_end;
    if (out <= 0) c.fail("the window does not fit the input " + to_string(xs));
    w.in.push_back(in);
    w.out.push_back(out);
    w.pb.push_back(pb);
    w.pe.push_back(pe);
  }
  return w;
}

std::vector<int64_t> iota_from(int64_t first, size_t n) {
  std::vector<int64_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = first + static_cast<int64_t>(i);
  return v;
}

Shape dims_shape(std::vector<Dim> lead, const std::vector<int64_t>& rest) {
  for (int64_t v : rest) lead.push_back(Dim::of(v));
  return lead;
}

// ConvTranspose of `dy` by `w` whose output spatial size is exactly `target`: output_padding covers a short
// result, and a long one (pooling's ceil_mode windows past the end pad) is cropped by growing the end pad.
Expr conv_transpose_to(RuleContext& c, const Expr& dy, const Expr& w, const Win& g, const std::vector<int64_t>& target,
                       int64_t group, TypeInfo out) {
  std::vector<int64_t> pe = g.pe, opad(g.r, 0);
  for (size_t i = 0; i < g.r; ++i) {
    const int64_t full = g.s[i] * (g.out[i] - 1) + (g.k[i] - 1) * g.d[i] + 1 - g.pb[i] - g.pe[i];
    if (full <= target[i]) opad[i] = target[i] - full;
    else pe[i] += full - target[i];
  }
  std::vector<int64_t> pads = g.pb;
  pads.insert(pads.end(), pe.begin(), pe.end());
  return apply(c.builder(), "ConvTranspose", {dy, w}, std::move(out),
               {{"strides", g.s}, {"dilations", g.d}, {"pads", pads}, {"output_padding", opad},
                {"kernel_shape", g.k}, {"group", group}});
}

}  // namespace onnxtrain::rules
