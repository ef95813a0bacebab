// Gradients of the pooling family (kernels: executor/cpu/pool.cpp, executor/cuda/conv.cu):
//   MaxPool:       the fused onnxtrain.MaxPoolGrad (opset 16+), whose body, like the expansion emitted at
//                  older opsets, scatters dY (ScatterElements) to the argmax positions from MaxPool's Indices
//                  output (recomputed when the forward node did not ask for it).
//   AveragePool:   the fused onnxtrain.AveragePoolGrad (explicit geometry); with dilations (opset 19) the
//                  standard-op expansion: dY divided by each window's divisor, spread back by a ConvTranspose
//                  with a kernel of ones over (batch*channel) planes.
//   GlobalAveragePool / GlobalMaxPool: dY spread evenly / to the maxima.
//   LpPool / GlobalLpPool: in standard ops, dY * Y^(1-p) spread over the windows (as AveragePool's dilated
//                  case) times |X|^(p-1) sign(X).
// The geometry (explicit pads for auto_pad, divisors) is resolved here (rules/window.h), so the spatial dims of
// the input must be known statically; batch and channel dims may be symbolic.
#include <algorithm>
#include <string>
#include <vector>

#include "gradients/fused.h"
#include "gradients/rule.h"
#include "gradients/rules/util.h"
#include "gradients/rules/window.h"
#include "graph/error.h"

namespace onnxtrain {

namespace {

using rules::conv_transpose_to;
using rules::dims_shape;
using rules::iota_from;
using rules::spatial_attr;
using rules::spatial_known;
using rules::Win;
using rules::window;

void max_pool_rule(RuleContext& c) {
  // Windows that cannot overlap (stride >= dilated kernel extent, the usual MaxPool 2) hit each input at
  // most once, so a plain scatter (opset 11) is exact; overlapping ones must add up (reduction, opset 16).
  if (!c.node().has_attr("kernel_shape")) c.fail("attribute 'kernel_shape' is required");
  const std::vector<int64_t> k = c.node().attr_ints("kernel_shape");
  const std::vector<int64_t> s = spatial_attr(c, "strides", k.size(), 1), d = spatial_attr(c, "dilations", k.size(), 1);
  bool overlap = false;
  for (size_t i = 0; i < k.size(); ++i) overlap = overlap || s[i] < (k[i] - 1) * d[i] + 1;
  const int64_t needed = overlap ? 16 : 11;
  if (c.opset() < needed)
    c.fail(std::string("the MaxPool gradient scatters dY with ScatterElements") +
           (overlap ? " (reduction='add' for overlapping windows)" : "") + ", which needs opset >= " +
           std::to_string(needed) + "; the model imports opset " + std::to_string(c.opset()));
  GraphBuilder& b = c.builder();
  Expr x = c.X(0), dy = c.dY(0);
  if (c.opset() >= 16) {
    // The fused op finds each window's maximum again and adds dY there in one pass; its body is the
    // recompute-and-scatter below (with reduction='add', hence opset 16), reading MaxPool's own attributes.
    std::map<std::string, Attribute> attrs = c.node().attributes;
    attrs.erase("storage_order");
    c.set_dX(0, apply(b, "MaxPoolGrad", {dy, x}, rules::input_type(c, 0), attrs, kFusedGradDomain));
    return;
  }
  Expr idx;
  if (c.num_outputs() > 1 && !c.node().outputs[1].empty() && c.node().attr_int("storage_order", 0) == 0) {
    idx = c.Y(1);
  } else {
    // Recompute the argmax: row-major indices into the whole flattened input.
    std::map<std::string, Attribute> attrs = c.node().attributes;
    attrs.erase("storage_order");
    TypeInfo yt = c.Y(0).type;
    idx = apply_n(b, "MaxPool", {x}, {yt, TypeInfo{DType::Int64, yt.shape}}, attrs)[1];
  }
  const Expr flat = int64s(b, {-1});
  Expr zeros = reshape(zeros_like(x), flat);
  std::map<std::string, Attribute> attrs{{"axis", int64_t{0}}};
  if (overlap) attrs["reduction"] = std::string("add");
  Expr scattered = apply(b, "ScatterElements", {zeros, reshape(idx, flat), reshape(dy, flat)},
                         TypeInfo{dy.dtype(), zeros.shape()}, attrs);
  c.set_dX(0, rules::reshape_to_input(c, scattered, 0));
}

TensorData filled(DType t, const std::vector<int64_t>& dims, const std::vector<double>& v) {
  if (t == DType::Float64) return TensorData::from<double>(dims, std::span<const double>(v));
  if (t != DType::Float32) fail("AveragePool gradient", "only float32 and float64 are supported, got " + dtype_name(t));
  std::vector<float> f(v.begin(), v.end());
  return TensorData::from<float>(dims, std::span<const float>(f));
}

// The adjoint of a window sum: each value of `v` (the pooled shape) added at its window's taps inside the input,
// as a ConvTranspose with a kernel of ones over planes [N*C, 1, out...] (one single-channel kernel serves every
// channel); the result has input 0's shape.
Expr spread_windows(RuleContext& c, const Expr& v, const Win& g) {
  GraphBuilder& b = c.builder();
  const DType t = v.dtype();
  std::vector<int64_t> planes{-1, 1};
  planes.insert(planes.end(), g.out.begin(), g.out.end());
  Expr p = reshape(v, int64s(b, planes), dims_shape({Dim{}, Dim::of(1)}, g.out));
  std::vector<int64_t> kdims{1, 1};
  kdims.insert(kdims.end(), g.k.begin(), g.k.end());
  int64_t ksz = 1;
  for (int64_t k : g.k) ksz *= k;
  Expr ones = constant(b, filled(t, kdims, std::vector<double>(static_cast<size_t>(ksz), 1.0)));
  Expr dx = conv_transpose_to(c, p, ones, g, g.in, 1, TypeInfo{t, dims_shape({Dim{}, Dim::of(1)}, g.in)});
  return rules::reshape_to_input(c, dx, 0);
}

void average_pool_rule(RuleContext& c) {
  const TypeInfo xt = spatial_known(c, 0);
  if (!c.node().has_attr("kernel_shape")) c.fail("attribute 'kernel_shape' is required");
  const Win g = window(c, *xt.shape, c.node().attr_ints("kernel_shape"), c.node().attr_int("ceil_mode", 0) != 0);
  const bool include_pad = c.node().attr_int("count_include_pad", 0) != 0;
  if (std::all_of(g.d.begin(), g.d.end(), [](int64_t d) { return d == 1; })) {
    // The fused op, its geometry explicit (its body reads pads, strides and count_include_pad as tensors and
    // has no dilated AveragePool to lean on, hence the decomposition below for dilations).
    c.set_dX(0, rules::fused_grads(c, "AveragePoolGrad", {c.dY(0), c.X(0)}, {xt},
                            {{"kernel_shape", g.k}, {"strides", g.s}, {"pads", g.pads()},
                             {"count_include_pad", int64_t{include_pad}}, {"ceil_mode", c.node().attr_int("ceil_mode", 0)}})[0]);
    return;
  }
  GraphBuilder& b = c.builder();
  Expr dy = c.dY(0);
  const DType t = dy.dtype();
  // Per-output divisors, as the kernel counts them: taps inside the input (or the padded input).
  int64_t n_out = 1;
  for (int64_t o : g.out) n_out *= o;
  std::vector<double> inv(static_cast<size_t>(n_out), 1.0);
  for (int64_t f = 0; f < n_out; ++f) {
    int64_t rem = f, cnt = 1;
    for (size_t i = g.r; i-- > 0;) {
      const int64_t o = rem % g.out[i];
      rem /= g.out[i];
      // ceil_mode windows past the end pad count as padding (the ONNX reference; the kernel does the same).
      const int64_t padded_end =
          std::max(g.in[i] + g.pe[i], (g.out[i] - 1) * g.s[i] - g.pb[i] + (g.k[i] - 1) * g.d[i] + 1);
      const int64_t lo = include_pad ? -g.pb[i] : 0, hi = include_pad ? padded_end : g.in[i];
      int64_t n = 0;
      for (int64_t j = 0; j < g.k[i]; ++j) {
        const int64_t at = o * g.s[i] - g.pb[i] + j * g.d[i];
        n += at >= lo && at < hi;
      }
      cnt *= n;
    }
    inv[static_cast<size_t>(f)] = 1.0 / static_cast<double>(std::max<int64_t>(cnt, 1));
  }
  const bool uniform = std::all_of(inv.begin(), inv.end(), [&](double v) { return v == inv[0]; });
  Expr scaled = uniform ? dy * inv[0] : dy * constant(b, filled(t, g.out, inv));
  c.set_dX(0, spread_windows(c, scaled, g));
}

// LpPool: Y = (sum_w |x|^p)^(1/p), so dX = (sum over the windows holding x of dY * Y^(1-p)) * |x|^(p-1) sign(x),
// the window sum spread by spread_windows. Y = 0 (a window of zeros) would give 0 * inf: there the gradient is
// taken as 0 (a subgradient), by Where.
Expr lp_factor(RuleContext& c, const Expr& dy, const Expr& y, int64_t p) {
  if (p == 1) return dy;
  Expr zero = scalar(c.builder(), y.dtype(), 0.0);
  Expr safe = where(greater(y, zero), y, ones_like(y));
  Expr inv = p == 2 ? 1.0 / safe : pow(safe, scalar(c.builder(), y.dtype(), static_cast<double>(1 - p)));
  return where(greater(y, zero), dy * inv, zeros_like(dy));
}

Expr lp_slope(RuleContext& c, const Expr& x, int64_t p) {
  if (p == 1) return sign(x);
  if (p == 2) return x;
  return pow(abs(x), scalar(c.builder(), x.dtype(), static_cast<double>(p - 1))) * sign(x);
}

int64_t lp_p(RuleContext& c) {
  const int64_t p = c.node().attr_int("p", 2);
  if (p < 1) c.fail("p must be >= 1, got " + std::to_string(p));
  return p;
}

void lp_pool_rule(RuleContext& c) {
  const TypeInfo xt = spatial_known(c, 0);
  if (!c.node().has_attr("kernel_shape")) c.fail("attribute 'kernel_shape' is required");
  const Win g = window(c, *xt.shape, c.node().attr_ints("kernel_shape"), c.node().attr_int("ceil_mode", 0) != 0);
  const int64_t p = lp_p(c);
  Expr spread = spread_windows(c, lp_factor(c, c.dY(0), c.Y(0), p), g);
  c.set_dX(0, spread * lp_slope(c, c.X(0), p));
}

// GlobalLpPool: the same with one window per plane (dY [N, C, 1...] broadcasts over it).
void global_lp_pool_rule(RuleContext& c) {
  const int64_t p = lp_p(c);
  c.set_dX(0, lp_factor(c, c.dY(0), c.Y(0), p) * lp_slope(c, c.X(0), p));
}

void global_average_pool_rule(RuleContext& c) {
  const TypeInfo xt = spatial_known(c, 0);
  int64_t size = 1;
  for (size_t i = 2; i < xt.shape->size(); ++i) size *= (*xt.shape)[i].value;
  Expr dy = c.dY(0);
  c.set_dX(0, expand(dy * (1.0 / static_cast<double>(size)), shape_of(c.X(0)), xt.shape));
}

void global_max_pool_rule(RuleContext& c) {
  // Every position equal to its plane's maximum receives the gradient (ties share it in full, as a subgradient
  // would pick one; random inputs have none).
  Expr x = c.X(0), y = c.Y(0), dy = c.dY(0);
  c.set_dX(0, where(equal(x, y), dy, scalar(c.builder(), dy.dtype(), 0.0)));
}

}  // namespace

void register_pool_rules(GradientRegistry& r) {
  r.add("MaxPool", max_pool_rule);
  r.add("AveragePool", average_pool_rule);
  r.add("GlobalAveragePool", global_average_pool_rule);
  r.add("GlobalMaxPool", global_max_pool_rule);
  r.add("LpPool", lp_pool_rule);
  r.add("GlobalLpPool", global_lp_pool_rule);
}

}  // namespace onnxtrain
