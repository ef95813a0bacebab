// Gradients of the spatial op family (see register_spatial_rules in gradients/rule.h):
//   GridSample: the fused onnxtrain.GridSampleGrad(dY, X, grid) -> (dX, dGrid) with GridSample's attributes
//               (native kernel in executor/cpu/spatial.cpp). dX scatters dY to the interpolation taps, dGrid is
//               the slope of the interpolation weights against X (zero for nearest, whose output is piecewise
//               constant in the grid). In fused_grad_uses(): its standard-ONNX body (gradients/fused_spatial.cpp)
//               rebuilds the taps in float64 (every rank, mode, padding and align_corners) and scatters with
//               ScatterElements(reduction='add'); it reads the mode and padding as ints, which this rule adds.
//   Col2Im:     its adjoint, Im2Col, in standard ops: dY padded, flattened over the image, and gathered with a
//               constant [K, L] table of the positions block offset k of block l reads.
//   MaxRoiPool: the fused onnxtrain.MaxRoiPoolGrad(dY, X, rois) -> dX (each dY added at its bin's first
//               maximum), in fused_grad_uses(): its standard-ONNX body (gradients/fused_spatial.cpp) masks X to
//               each bin, finds the first maximum with ArgMax and sums dY there as one-hots (no scatter, so it
//               is valid from opset 13). rois get no gradient: the bins move in integer steps, so Y is
//               piecewise constant in them.
//   MaxUnpool:  dX = dY gathered at the indices (after cropping an output_shape larger than the unpooled size).
#include <map>
#include <string>
#include <vector>

#include "gradients/fused.h"
#include "gradients/rule.h"
#include "gradients/rules/util.h"

namespace onnxtrain {

namespace {

void grid_sample_rule(RuleContext& c) {
  // The body (gradients/fused_spatial.cpp) reads the mode, padding and alignment as ints (it cannot compare
  // strings before opset 19); the kernel reads GridSample's strings and checks that the two agree.
  std::map<std::string, Attribute> attrs = c.node().attributes;
  const std::string mode = c.node().attr_string("mode", c.opset() >= 20 ? "linear" : "bilinear");
  const std::string pad = c.node().attr_string("padding_mode", "zeros");
  attrs["interpolation"] = int64_t{mode == "nearest" ? 1 : mode == "bicubic" || mode == "cubic" ? 2 : 0};
  attrs["padding"] = int64_t{pad == "border" ? 1 : pad == "reflection" ? 2 : 0};
  attrs["align_corners"] = c.node().attr_int("align_corners", 0);
  std::vector<Expr> d = rules::fused_grads(c, "GridSampleGrad", {c.dY(0), c.X(0), c.X(1)},
                                           {rules::input_type(c, 0), rules::input_type(c, 1)}, attrs);
  for (size_t i = 0; i < 2; ++i)
    if (c.needs_dX(i)) c.set_dX(i, d[i]);
}

void max_roi_pool_rule(RuleContext& c) {
  if (!c.needs_dX(0)) return;
  // The body reads both attributes by reference and has no defaults: spatial_scale's (1.0) is written out.
  std::map<std::string, Attribute> attrs = c.node().attributes;
  attrs.emplace("spatial_scale", 1.0f);
  c.set_dX(0, apply(c.builder(), "MaxRoiPoolGrad", {c.dY(0), c.X(0), c.X(1)}, rules::input_type(c, 0), attrs,
                    kFusedGradDomain));
}

std::vector<int64_t> constant_arg(RuleContext& c, size_t i, const char* what) {
  auto v = rules::constant_int64s(c.builder().graph(), c.node().inputs[i]);
  if (!v) c.fail(std::string("needs ") + what + " to be a constant (its gradient's gather table is built from it)");
  return *v;
}

void col2im_rule(RuleContext& c) {
  if (!c.needs_dX(0)) return;
  GraphBuilder& b = c.builder();
  const std::vector<int64_t> image = constant_arg(c, 1, "image_shape"), block = constant_arg(c, 2, "block_shape");
  const size_t r = image.size();
  if (block.size() != r || r == 0) c.fail("image_shape and block_shape must have the same, nonzero length");
  const auto attr = [&](const char* name, size_t n, int64_t fallback) {
    std::vector<int64_t> v = c.node().attr_ints(name, std::vector<int64_t>(n, fallback));
    if (v.size() != n) c.fail(std::string("attribute '") + name + "' must have " + std::to_string(n) + " entries");
    return v;
  };
  const std::vector<int64_t> s = attr("strides", r, 1), d = attr("dilations", r, 1), pads = attr("pads", 2 * r, 0);
  // Positions in the padded image, block offsets k (row-major over block) by blocks l (row-major over the grid).
  std::vector<int64_t> padded(r), out(r);
  int64_t K = 1, L = 1, P = 1;
  for (size_t i = 0; i < r; ++i) {
    padded[i] = image[i] + pads[i] + pads[r + i];
    out[i] = (padded[i] - ((block[i] - 1) * d[i] + 1)) / s[i] + 1;
    if (s[i] <= 0 || d[i] <= 0 || out[i] <= 0) c.fail("the blocks do not fit the padded image");
    K *= block[i];
    L *= out[i];
    P *= padded[i];
  }
  std::vector<int64_t> table(static_cast<size_t>(K * L));
  for (int64_t k = 0; k < K; ++k)
    for (int64_t l = 0; l < L; ++l) {
      int64_t kr = k, lr = l, at = 0, stride = 1;
      for (size_t i = r; i-- > 0;) {
        const int64_t ki = kr % block[i], li = lr % out[i];
        kr /= block[i];
        lr /= out[i];
        at += (li * s[i] + ki * d[i]) * stride;
        stride *= padded[i];
      }
      table[static_cast<size_t>(k * L + l)] = at;
    }
  Expr dy = c.dY(0);
  const DType t = dy.dtype();
  bool any_pad = false;
  for (int64_t p : pads) any_pad = any_pad || p != 0;
  if (any_pad) {
    std::vector<int64_t> full{0, 0};
    full.insert(full.end(), pads.begin(), pads.begin() + static_cast<std::ptrdiff_t>(r));
    full.push_back(0);
    full.push_back(0);
    full.insert(full.end(), pads.begin() + static_cast<std::ptrdiff_t>(r), pads.end());
    dy = apply(b, "Pad", {dy, int64s(b, full)}, TypeInfo{t, std::nullopt});
  }
  Expr flat = reshape(dy, int64s(b, {0, 0, P}));
  Expr idx = constant(b, TensorData::from<int64_t>({K, L}, std::span<const int64_t>(table)));
  Expr cols = apply(b, "Gather", {flat, idx}, TypeInfo{t, std::nullopt}, {{"axis", int64_t{2}}});
  c.set_dX(0, reshape(cols, int64s(b, {0, -1, L}), rules::input_type(c, 0).shape));
}

void max_unpool_rule(RuleContext& c) {
  if (!c.needs_dX(0)) return;
  GraphBuilder& b = c.builder();
  Expr dy = c.dY(0);
  if (c.num_inputs() > 2 && c.has_input(2)) {
    // An output_shape larger than the unpooled size holds it in its leading corner: crop that back first.
    const TypeInfo xt = rules::input_type(c, 0);
    const auto dims = rules::static_dims(xt);
    if (!dims || dims->size() < 3) c.fail("needs X's shape known statically when output_shape is given");
    const size_t r = dims->size() - 2;
    const std::vector<int64_t> k = c.node().attr_ints("kernel_shape");
    const std::vector<int64_t> s = c.node().attr_ints("strides", std::vector<int64_t>(r, 1));
    const std::vector<int64_t> p = c.node().attr_ints("pads", std::vector<int64_t>(2 * r, 0));
    if (k.size() != r || s.size() != r || p.size() != 2 * r) c.fail("kernel_shape, strides or pads do not match X's rank");
    std::vector<int64_t> ends, axes, starts(r, 0);
    for (size_t i = 0; i < r; ++i) {
      ends.push_back(((*dims)[2 + i] - 1) * s[i] - p[i] - p[r + i] + k[i]);
      axes.push_back(static_cast<int64_t>(i + 2));
    }
    dy = apply(b, "Slice", {dy, int64s(b, starts), int64s(b, ends), int64s(b, axes)}, TypeInfo{dy.dtype(), std::nullopt});
  }
  Expr flat = reshape(dy, int64s(b, {-1}));
  c.set_dX(0, apply(b, "Gather", {flat, c.X(1)}, rules::input_type(c, 0), {{"axis", int64_t{0}}}));
}

}  // namespace

void register_spatial_rules(GradientRegistry& r) {
  r.add("GridSample", grid_sample_rule);
  r.add("Col2Im", col2im_rule);
  r.add("MaxRoiPool", max_roi_pool_rule);
  r.add("MaxUnpool", max_unpool_rule);
}

}  // namespace onnxtrain
