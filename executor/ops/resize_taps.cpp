// Resize's plan (resize_taps.h): the attributes, the output shape from scales or sizes (with the opset-18 axes and
// keep_aspect_ratio_policy), and one tap table per resized axis. Resize is separable: each output coordinate along
// an axis is a weighted sum of a few input coordinates along that axis, with the ONNX reference's coordinate
// transformations and weights.
#include "executor/ops/resize_taps.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "executor/ops/kernel_util.h"
#include "graph/error.h"

namespace onnxtrain::ops {
namespace {

enum class Mode { Nearest, Linear, Cubic };

struct ResizeAttrs {
  Mode mode = Mode::Nearest;
  std::string coordinate_mode = "half_pixel";
  std::string nearest_mode = "round_prefer_floor";
  double cubic_a = -0.75;
  bool exclude_outside = false;
  bool antialias = false;
  double extrapolation_value = 0;
};

// Interpolation weights for the taps around x_original; `ratio` is in (0, 1], the distance from the tap
// left of x (1 when x is an integer), and `scale` the axis' scale (antialias widens the filter by 1/scale).
std::vector<double> coefficients(const ResizeAttrs& a, double ratio, double scale, bool x_is_integer) {
  switch (a.mode) {
    case Mode::Nearest: {
      if (x_is_integer) return {0, 1};
      const std::string& m = a.nearest_mode;
      if (m == "round_prefer_ceil") return {ratio < 0.5 ? 1.0 : 0.0, ratio >= 0.5 ? 1.0 : 0.0};
      if (m == "floor") return {1, 0};
      if (m == "ceil") return {0, 1};
      return {ratio <= 0.5 ? 1.0 : 0.0, ratio > 0.5 ? 1.0 : 0.0};  // round_prefer_floor
    }
    case Mode::Linear: {
      if (!a.antialias) return {1 - ratio, ratio};
      const double s = std::min(scale, 1.0);
      const auto start = static_cast<int64_t>(std::floor(-1 / s) + 1);
      const int64_t footprint = 2 - 2 * start;
      std::vector<double> c(footprint);
      double total = 0;
      for (int64_t i = 0; i < footprint; ++i) total += c[i] = std::clamp(1 - std::abs((start + i - ratio) * s), 0.0, 1.0);
      for (double& v : c) v /= total;
      return c;
    }
    case Mode::Cubic: {
      const double A = a.cubic_a;
      auto kernel = [A](double x) { return cubic_kernel(A, x); };
      if (!a.antialias) return {kernel(ratio + 1), kernel(ratio), kernel(1 - ratio), kernel(2 - ratio)};
      const double s = std::min(scale, 1.0);
      const auto start = static_cast<int64_t>(std::floor(-2 / s) + 1);
      std::vector<double> c;
      double total = 0;
      for (int64_t i = start; i < 2 - start; ++i) total += c.emplace_back(kernel(s * (i - ratio)));
      for (double& v : c) v /= total;
      return c;
    }
  }
  return {};
}

// The input coordinate output o maps to (the ONNX reference's formulas, including its use of scale * in,
// not the rounded output size, as the output width).
double original_coordinate(const ResizeAttrs& a, int64_t o, int64_t in, int64_t out, double scale, double roi_start,
                           double roi_end) {
  const double x = static_cast<double>(o), width = scale * static_cast<double>(in);
  const std::string& m = a.coordinate_mode;
  if (m == "align_corners") return width == 1 ? 0 : x * (in - 1) / (width - 1);
  if (m == "asymmetric") return x / scale;
  if (m == "tf_crop_and_resize") {
    const double span = (roi_end - roi_start) * (in - 1);
    return (width == 1 ? span / 2 : x * span / (width - 1)) + roi_start * (in - 1);
  }
  if (m == "pytorch_half_pixel") return width == 1 ? -0.5 : (x + 0.5) / scale - 0.5;
  if (m == "half_pixel_symmetric") {
    const double adjustment = static_cast<double>(out) / width;
    const double offset = static_cast<double>(in) / 2 * (1 - adjustment);
    return offset + (x + 0.5) / scale - 0.5;
  }
  return (x + 0.5) / scale - 0.5;  // half_pixel
}

AxisTaps axis_taps(const ResizeAttrs& a, int64_t in, int64_t out, double scale, double roi_start, double roi_end) {
  AxisTaps t;
  t.in = in;
  t.out = out;
  t.outside.assign(out, 0);
  std::vector<std::vector<double>> coeffs(out);
  std::vector<double> xs(out);
  for (int64_t o = 0; o < out; ++o) {
    const double x = original_coordinate(a, o, in, out, scale, roi_start, roi_end);
    xs[o] = x;
    if (a.coordinate_mode == "tf_crop_and_resize" && (x < 0 || x > static_cast<double>(in - 1))) {
      t.outside[o] = 1;
      continue;
    }
    const bool integer = x == std::floor(x);
    coeffs[o] = coefficients(a, integer ? 1.0 : x - std::floor(x), scale, integer);
    t.n = std::max<int64_t>(t.n, static_cast<int64_t>(coeffs[o].size()));
  }
  t.index.assign(out * t.n, 0);
  t.weight.assign(out * t.n, 0.0);
  for (int64_t o = 0; o < out; ++o) {
    if (t.outside[o]) continue;
    const std::vector<double>& c = coeffs[o];
    const auto n = static_cast<int64_t>(c.size());
    // The reference pads the input by ceil(n/2) edge values and takes the n padded positions nearest to x
    // (ties to the smaller): a window of n starting at ceil(x) - n/2, kept inside the padded input.
    const int64_t pad = (n + 1) / 2, padded = in + 2 * pad;
    int64_t start = static_cast<int64_t>(std::ceil(xs[o] + static_cast<double>(pad))) - n / 2;
    start = std::clamp<int64_t>(start, 0, std::max<int64_t>(padded - n, 0));
    double kept = 0;
    for (int64_t k = 0; k < n && start + k < padded; ++k) {
      const int64_t at = start + k - pad;
      const bool inside = at >= 0 && at < in;
      const double w = a.exclude_outside && !inside ? 0.0 : c[k];
      t.index[o * t.n + k] = std::clamp<int64_t>(at, 0, in - 1);
      t.weight[o * t.n + k] = w;
      kept += w;
    }
    if (a.exclude_outside && kept != 0)
      for (int64_t k = 0; k < n; ++k) t.weight[o * t.n + k] /= kept;
  }
  return t;
}

// A float tensor's values (roi and scales are float16/float/double in the schema; we read float and double).
std::vector<double> floats_of(const PrepareContext& ctx, const Tensor& t, const std::string& what) {
  std::vector<double> v;
  if (t.dtype == DType::Float32)
    for (float f : t.span<float>()) v.push_back(f);
  else if (t.dtype == DType::Float64)
    for (double d : t.span<double>()) v.push_back(d);
  else
    ctx.fail(what + " must be float32 or float64, got " + dtype_name(t.dtype));
  return v;
}

// An optional input that is absent or an empty tensor counts as not given.
const Tensor* given(const PrepareContext& ctx, size_t i) {
  if (!has_input(ctx, i)) return nullptr;
  const Tensor& t = ctx.constant_input(i);
  return t.numel() == 0 ? nullptr : &t;
}

ResizeAttrs read_attrs(const PrepareContext& ctx) {
  const Node& n = ctx.node;
  ResizeAttrs a;
  const std::string mode = n.attr_string("mode", "nearest");
  if (mode == "nearest")
    a.mode = Mode::Nearest;
  else if (mode == "linear")
    a.mode = Mode::Linear;
  else if (mode == "cubic")
    a.mode = Mode::Cubic;
  else
    ctx.fail("mode must be nearest, linear or cubic, got '" + mode + "'");
  a.coordinate_mode = n.attr_string("coordinate_transformation_mode", "half_pixel");
  static const std::vector<std::string> coordinate_modes = {"half_pixel", "asymmetric", "pytorch_half_pixel",
                                                            "align_corners", "tf_crop_and_resize"};
  const bool known = std::find(coordinate_modes.begin(), coordinate_modes.end(), a.coordinate_mode) !=
                         coordinate_modes.end() ||
                     (ctx.opset >= 19 && a.coordinate_mode == "half_pixel_symmetric");
  if (!known)
    ctx.fail("coordinate_transformation_mode '" + a.coordinate_mode + "' is not defined at opset " +
             std::to_string(ctx.opset));
  a.nearest_mode = n.attr_string("nearest_mode", "round_prefer_floor");
  if (a.nearest_mode != "round_prefer_floor" && a.nearest_mode != "round_prefer_ceil" && a.nearest_mode != "floor" &&
      a.nearest_mode != "ceil")
    ctx.fail("nearest_mode must be round_prefer_floor, round_prefer_ceil, floor or ceil, got '" + a.nearest_mode + "'");
  a.cubic_a = n.attr_float("cubic_coeff_a", -0.75f);
  a.exclude_outside = n.attr_int("exclude_outside", 0) != 0;
  a.extrapolation_value = n.attr_float("extrapolation_value", 0.0f);
  a.antialias = ctx.opset >= 18 && n.attr_int("antialias", 0) != 0;
  if (a.antialias && a.mode == Mode::Nearest) ctx.fail("antialias is not defined for mode 'nearest'");
  return a;
}

}  // namespace

ResizePlan prepare_resize(PrepareContext& ctx) {
  const KernelInput& x = required_input(ctx, 0, "X");
  const ResizeAttrs a = read_attrs(ctx);
  const auto rank = static_cast<int64_t>(x.shape.size());

  // The resized axes: every axis, or the opset-18 `axes` attribute.
  std::vector<int64_t> axes;
  if (ctx.opset >= 18 && ctx.node.has_attr("axes")) {
    for (int64_t ax : ctx.node.attr_ints("axes")) {
      const int64_t norm = normalize_axis(ctx, ax, rank, "axes");
      if (std::find(axes.begin(), axes.end(), norm) != axes.end()) ctx.fail("axes repeats axis " + std::to_string(ax));
      axes.push_back(norm);
    }
  } else {
    for (int64_t i = 0; i < rank; ++i) axes.push_back(i);
  }
  const size_t na = axes.size();

  const Tensor* scales_t = given(ctx, 2);
  const Tensor* sizes_t = given(ctx, 3);
  if ((scales_t != nullptr) == (sizes_t != nullptr))
    ctx.fail("exactly one of scales (input 2) and sizes (input 3) must be given and non-empty");
  std::vector<double> scale(rank, 1.0);
  std::vector<int64_t> out_shape = x.shape;
  if (scales_t) {
    const std::vector<double> s = floats_of(ctx, *scales_t, "scales");
    if (s.size() != na)
      ctx.fail("scales has " + std::to_string(s.size()) + " values, expected " + std::to_string(na));
    for (size_t i = 0; i < na; ++i) {
      if (!(s[i] > 0)) ctx.fail("scales must be positive, got " + std::to_string(s[i]));
      scale[axes[i]] = s[i];
      out_shape[axes[i]] = static_cast<int64_t>(std::floor(s[i] * static_cast<double>(x.shape[axes[i]])));
    }
  } else {
    const std::vector<int64_t> sz = ints_of(ctx, *sizes_t, "sizes");
    if (sz.size() != na) ctx.fail("sizes has " + std::to_string(sz.size()) + " values, expected " + std::to_string(na));
    for (size_t i = 0; i < na; ++i) {
      if (sz[i] <= 0 || x.shape[axes[i]] <= 0) ctx.fail("sizes and the resized dims of X must be positive");
      scale[axes[i]] = static_cast<double>(sz[i]) / static_cast<double>(x.shape[axes[i]]);
      out_shape[axes[i]] = sz[i];
    }
    const std::string policy = ctx.opset >= 18 ? ctx.node.attr_string("keep_aspect_ratio_policy", "stretch") : "stretch";
    if (policy == "not_larger" || policy == "not_smaller") {
      double s = scale[axes[0]];
      for (int64_t ax : axes) s = policy == "not_larger" ? std::min(s, scale[ax]) : std::max(s, scale[ax]);
      for (int64_t ax : axes) {
        scale[ax] = s;
        out_shape[ax] = static_cast<int64_t>(s * static_cast<double>(x.shape[ax]) + 0.5);
      }
    } else if (policy != "stretch") {
      ctx.fail("keep_aspect_ratio_policy must be stretch, not_larger or not_smaller, got '" + policy + "'");
    }
  }

  std::vector<double> roi_start(rank, 0.0), roi_end(rank, 1.0);
  if (a.coordinate_mode == "tf_crop_and_resize") {
    const Tensor* roi_t = given(ctx, 1);
    if (!roi_t) ctx.fail("coordinate_transformation_mode tf_crop_and_resize needs roi (input 1)");
    const std::vector<double> roi = floats_of(ctx, *roi_t, "roi");
    if (roi.size() != 2 * na)
      ctx.fail("roi has " + std::to_string(roi.size()) + " values, expected " + std::to_string(2 * na));
    for (size_t i = 0; i < na; ++i) {
      roi_start[axes[i]] = roi[i];
      roi_end[axes[i]] = roi[na + i];
    }
  }

  std::vector<std::pair<size_t, AxisTaps>> taps;
  for (int64_t ax = rank - 1; ax >= 0; --ax) {
    if (x.shape[ax] == 0 || out_shape[ax] == 0) continue;  // an empty output: run() does nothing
    AxisTaps t = axis_taps(a, x.shape[ax], out_shape[ax], scale[ax], roi_start[ax], roi_end[ax]);
    if (!t.identity()) taps.emplace_back(static_cast<size_t>(ax), std::move(t));
  }
  set_output(ctx, 0, x.dtype, out_shape);
  return ResizePlan{std::move(taps), a.extrapolation_value};
}

}  // namespace onnxtrain::ops
