// Gradients of Conv, ConvTranspose and pooling:
//   Conv:          the fused onnxtrain.ConvGrad(dY, X, W) -> (dX, dW, dB) with the geometry resolved to explicit
//                  pads; its body (gradients/fused_conv.cpp) is dX = ConvTranspose(dY, W) padded to X's size,
//                  dW = a Conv of X by dY (batch and channels swapped) with stride and dilation exchanged,
//                  dB = ReduceSum(dY).
//   ConvTranspose: in standard ops, the adjoint the other way round: dX = Conv(dY, W); dW by the same trick
//                  with X and dY exchanged.
//   MaxPool:       the fused onnxtrain.MaxPoolGrad (opset 16+), whose body, like the expansion emitted at
//                  older opsets, scatters dY (ScatterElements) to the argmax positions from MaxPool's Indices
//                  output (recomputed when the forward node did not ask for it).
//   AveragePool:   the fused onnxtrain.AveragePoolGrad (explicit geometry); with dilations (opset 19) the
//                  standard-op expansion: dY divided by each window's divisor, spread back by a ConvTranspose
//                  with a kernel of ones over (batch*channel) planes.
//   GlobalAveragePool / GlobalMaxPool: dY spread evenly / to the maxima.
//   LpPool / GlobalLpPool: in standard ops, dY * Y^(1-p) spread over the windows (as AveragePool's dilated
//                  case) times |X|^(p-1) sign(X).
// The geometry (explicit pads for auto_pad, output_padding, divisors) is resolved here, so the spatial dims
// of the input must be known statically; batch and channel dims may be symbolic.
#include <algorithm>
#include <string>
#include <vector>

#include "gradients/fused.h"
#include "gradients/rule.h"
#include "gradients/rules/util.h"
#include "graph/error.h"
#include "graph/window.h"

namespace onnxtrain {

namespace {

struct Win {
  size_t r = 0;
  std::vector<int64_t> in, out, k, s, d, pb, pe;
  std::vector<int64_t> pads() const {
    std::vector<int64_t> p = pb;
    p.insert(p.end(), pe.begin(), pe.end());
    return p;
  }
};

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

// Weight gradient by the classic trick. `a` is [N, Ca, sa...] and `b` is [N, Cb, sb...] with
// b[n, cb, i] paired with a[n, ca, i*s - pb + kk*d] for kernel offset kk; returns [Cb, Ca/group, k...]:
//   Conv(a' = a as [Ca/group, group*N, sa], b' = b as [Cb, N, sb], group) strides d, dilations s
// gives [Ca/group, Cb, k' >= k], cropped to k and transposed.
Expr weight_grad(RuleContext& c, const Expr& a, const Expr& b, int64_t group, const std::vector<int64_t>& sa,
                 const std::vector<int64_t>& sb, const std::vector<int64_t>& k, const std::vector<int64_t>& s,
                 const std::vector<int64_t>& d, const std::vector<int64_t>& pb, const std::vector<int64_t>& pe,
                 const Dim& ca, const Dim& cb) {
  GraphBuilder& bl = c.builder();
  const size_t r = k.size();
  const DType t = a.dtype();
  if (!ca.known()) c.fail("needs the channel count known statically for the weight gradient");
  const int64_t cag = ca.value / group;
  std::vector<int64_t> swap01 = {1, 0};
  for (size_t i = 0; i < r; ++i) swap01.push_back(static_cast<int64_t>(i) + 2);
  Expr a2;
  if (group == 1) {
    a2 = transpose(a, swap01);
  } else {
    std::vector<int64_t> split{0, group, cag};
    split.insert(split.end(), sa.begin(), sa.end());
    Expr a5 = reshape(a, int64s(bl, split));
    std::vector<int64_t> perm{2, 1, 0};
    for (size_t i = 0; i < r; ++i) perm.push_back(static_cast<int64_t>(i) + 3);
    std::vector<int64_t> merge{cag, -1};
    merge.insert(merge.end(), sa.begin(), sa.end());
    a2 = reshape(transpose(a5, perm), int64s(bl, merge));
  }
  Expr b2 = transpose(b, swap01);
  std::vector<int64_t> kk(r);
  for (size_t i = 0; i < r; ++i) {
    kk[i] = (sa[i] + pb[i] + pe[i] - ((sb[i] - 1) * s[i] + 1)) / d[i] + 1;
    if (kk[i] < k[i]) c.fail("internal: weight-gradient geometry is shorter than the kernel");
  }
  std::vector<int64_t> pads = pb;
  pads.insert(pads.end(), pe.begin(), pe.end());
  Expr g = apply(bl, "Conv", {a2, b2}, TypeInfo{t, dims_shape({Dim::of(cag), cb}, kk)},
                 {{"strides", d}, {"dilations", s}, {"pads", pads}, {"kernel_shape", sb}, {"group", group}});
  if (kk != k) {
    std::vector<int64_t> zeros(r, 0);
    g = apply(bl, "Slice", {g, int64s(bl, zeros), int64s(bl, k), int64s(bl, iota_from(2, r))},
              TypeInfo{t, dims_shape({Dim::of(cag), cb}, k)});
  }
  return transpose(g, swap01);
}

std::vector<int64_t> kernel_of(RuleContext& c, const TypeInfo& wt) {
  if (c.node().has_attr("kernel_shape")) return c.node().attr_ints("kernel_shape");
  auto dims = rules::static_dims(wt);
  if (!dims || dims->size() < 3) c.fail("needs kernel_shape or weights with known dims");
  return std::vector<int64_t>(dims->begin() + 2, dims->end());
}

// Spatial dims first, then the batch: two reductions over contiguous rows and then columns, which the CPU
// kernel runs as fast paths, where one over axes {0, 2, ...} takes its general strided loop (13% of W2's
// training step, measured with perf; the split made it ~1%).
Expr bias_grad(RuleContext& c, const Expr& dy, size_t rank) {
  if (rank <= 2) return rules::reduce_sum(dy, {0}, false, c.opset());
  std::vector<int64_t> spatial;
  for (size_t i = 2; i < rank; ++i) spatial.push_back(static_cast<int64_t>(i));
  return rules::reduce_sum(rules::reduce_sum(dy, spatial, false, c.opset()), {0}, false, c.opset());
}

// The fused onnxtrain.ConvGrad with the geometry resolved (explicit pads, so its body can hand them to
// ConvTranspose and Conv). Its body is the classic decomposition (dX by ConvTranspose, dW by a Conv with
// strides and dilations exchanged, dB by ReduceSum), written against runtime shapes.
void conv_rule(RuleContext& c) {
  const TypeInfo xt = spatial_known(c, 0), wt = rules::input_type(c, 1);
  const int64_t group = c.node().attr_int("group", 1);
  const Win g = window(c, *xt.shape, kernel_of(c, wt), false);
  std::vector<Expr> ins{c.dY(0), c.X(0), c.X(1)};
  std::vector<TypeInfo> types{xt, wt};
  types.push_back(c.has_input(2) ? rules::input_type(c, 2) : TypeInfo{xt.dtype, std::nullopt});  // dB or ""
  std::vector<Expr> d = rules::fused_grads(c, "ConvGrad", ins, types,
                                    {{"kernel_shape", g.k}, {"strides", g.s}, {"dilations", g.d}, {"pads", g.pads()},
                                     {"group", group}});
  for (size_t i = 0; i < d.size(); ++i)
    if (c.has_input(i) && c.needs_dX(i)) c.set_dX(i, d[i]);
}

void conv_transpose_rule(RuleContext& c) {
  const TypeInfo xt = spatial_known(c, 0), wt = rules::input_type(c, 1);
  const int64_t group = c.node().attr_int("group", 1);
  if (!wt.shape) c.fail("needs the rank of W");
  Win g;
  g.r = xt.shape->size() - 2;
  g.k = kernel_of(c, wt);
  g.s = spatial_attr(c, "strides", g.r, 1);
  g.d = spatial_attr(c, "dilations", g.r, 1);
  const std::vector<int64_t> opad = spatial_attr(c, "output_padding", g.r, 0);
  std::vector<int64_t> pads = c.node().attr_ints("pads", std::vector<int64_t>(2 * g.r, 0));
  if (pads.size() != 2 * g.r) c.fail("attribute 'pads' must have " + std::to_string(2 * g.r) + " entries");
  const std::string auto_pad = c.node().attr_string("auto_pad", "NOTSET");
  std::vector<int64_t> oshape = c.node().attr_ints("output_shape");
  if (oshape.size() == g.r + 2) oshape.erase(oshape.begin(), oshape.begin() + 2);
  for (size_t i = 0; i < g.r; ++i) {
    const int64_t in = (*xt.shape)[2 + i].value, ext = (g.k[i] - 1) * g.d[i] + 1;
    const WindowDim win = transposed_window(in, ext, g.s[i], opad[i], pads[i], pads[i + g.r], auto_pad,
                                            oshape.empty() ? std::nullopt : std::optional<int64_t>(oshape[i]));
    // A requested output longer than the full result (its tail only bias) runs on the CPU but has no rule yet.
    if (win.pad_end < 0) c.fail("output_shape is larger than the full transposed convolution");
    const int64_t out = win.out, pb = win.pad_begin, pe = win.pad_end;
    g.in.push_back(in);
    g.out.push_back(out);
    g.pb.push_back(pb);
    g.pe.push_back(pe);
  }
  Expr dy = c.dY(0);
  if (c.needs_dX(0)) {
    // Conv(dY, W) reads dY at i*s - pb + j*d: exactly the positions X[i] was spread to.
    c.set_dX(0, apply(c.builder(), "Conv", {dy, c.X(1)}, xt,
                      {{"strides", g.s}, {"dilations", g.d}, {"pads", g.pads()}, {"kernel_shape", g.k},
                       {"group", group}}));
  }
  if (c.needs_dX(1)) {
    const Dim m = (*wt.shape)[1].known() ? Dim::of((*wt.shape)[1].value * group) : Dim{};
    std::vector<int64_t> pe(g.r);
    for (size_t i = 0; i < g.r; ++i) {
      // Just enough end padding for the full kernel: out + pb + pe' - (in-1)*s - 1 = (k-1)*d.
      pe[i] = (g.k[i] - 1) * g.d[i] + (g.in[i] - 1) * g.s[i] + 1 - g.out[i] - g.pb[i];
      if (pe[i] < 0) pe[i] = 0;
    }
    c.set_dX(1, weight_grad(c, dy, c.X(0), group, g.out, g.in, g.k, g.s, g.d, g.pb, pe, m, (*xt.shape)[1]));
  }
  if (c.has_input(2) && c.needs_dX(2)) c.set_dX(2, bias_grad(c, dy, xt.shape->size()));
}

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

void register_conv_rules(GradientRegistry& r) {
  r.add("Conv", conv_rule);
  r.add("ConvTranspose", conv_transpose_rule);
  r.add("MaxPool", max_pool_rule);
  r.add("AveragePool", average_pool_rule);
  r.add("GlobalAveragePool", global_average_pool_rule);
  r.add("GlobalMaxPool", global_max_pool_rule);
  r.add("LpPool", lp_pool_rule);
  r.add("GlobalLpPool", global_lp_pool_rule);
}

}  // namespace onnxtrain
