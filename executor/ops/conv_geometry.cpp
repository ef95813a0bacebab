// Geometry of the convolution and pooling ops (conv_geometry.h), shared by the CPU and CUDA kernels.
#include "executor/ops/conv_geometry.h"

#include <algorithm>

#include "executor/ops/kernel_util.h"
#include "graph/error.h"
#include "graph/window.h"

namespace onnxtrain::ops {

namespace {

// Kernel dims from the attribute, else from the weights' trailing dims (they must agree when both exist).
std::vector<int64_t> kernel_dims(const PrepareContext& ctx, const std::vector<int64_t>& w_shape) {
  std::vector<int64_t> from_w(w_shape.begin() + 2, w_shape.end());
  if (!ctx.node.has_attr("kernel_shape")) return from_w;
  std::vector<int64_t> k = ctx.node.attr_ints("kernel_shape");
  if (k != from_w)
    ctx.fail("kernel_shape " + shape_string(k) + " does not match the weights " + shape_string(w_shape));
  return k;
}

}  // namespace

std::vector<int64_t> spatial_attr(const PrepareContext& ctx, const std::string& name, size_t n, int64_t fallback) {
  std::vector<int64_t> v = ctx.node.attr_ints(name, std::vector<int64_t>(n, fallback));
  if (v.size() != n)
    ctx.fail("attribute '" + name + "' has " + std::to_string(v.size()) + " entries, expected " + std::to_string(n) +
             " (one per spatial dim)");
  return v;
}

namespace {

// The attributes Conv, ConvTranspose and pooling share, read for `kernel`'s spatial dims: strides and dilations
// (each >= 1, as is the kernel), pads and auto_pad.
struct WindowAttrs {
  std::vector<int64_t> strides, dilations, pads;  // pads: the r begins, then the r ends
  std::string auto_pad;
};

WindowAttrs window_attrs(const PrepareContext& ctx, const std::vector<int64_t>& kernel) {
  const size_t r = kernel.size();
  WindowAttrs a;
  a.strides = spatial_attr(ctx, "strides", r, 1);
  a.dilations = spatial_attr(ctx, "dilations", r, 1);
  a.pads = ctx.node.attr_ints("pads", std::vector<int64_t>(2 * r, 0));
  if (a.pads.size() != 2 * r)
    ctx.fail("attribute 'pads' has " + std::to_string(a.pads.size()) + " entries, expected " + std::to_string(2 * r));
  a.auto_pad = ctx.node.attr_string("auto_pad", "NOTSET");
  if (!is_auto_pad(a.auto_pad))
    ctx.fail("auto_pad '" + a.auto_pad + "' is not one of NOTSET, SAME_UPPER, SAME_LOWER, VALID");
  for (size_t i = 0; i < r; ++i)
    if (kernel[i] < 1 || a.strides[i] < 1 || a.dilations[i] < 1)
      ctx.fail("kernel, strides and dilations must be >= 1, got " + std::to_string(kernel[i]) + ", " +
               std::to_string(a.strides[i]) + ", " + std::to_string(a.dilations[i]) + " for spatial dim " +
               std::to_string(i));
  return a;
}

}  // namespace

void window_geometry(const PrepareContext& ctx, const std::vector<int64_t>& x_shape, const std::vector<int64_t>& kernel,
                     bool ceil_mode, Geo& g) {
  const size_t r = x_shape.size() - 2;
  if (r < 1 || r > kMaxSpatial)
    ctx.fail("input " + shape_string(x_shape) + " must have 1 to 3 spatial dims (rank 3 to 5)");
  g.rank = r;
  if (kernel.size() != r)
    ctx.fail("kernel has " + std::to_string(kernel.size()) + " dims for input " + shape_string(x_shape));
  const WindowAttrs a = window_attrs(ctx, kernel);
  const size_t off = kMaxSpatial - r;
  for (size_t i = 0; i < r; ++i) {
    const int64_t in = x_shape[2 + i], k = kernel[i], s = a.strides[i], d = a.dilations[i];
    if (a.auto_pad == "NOTSET" && (a.pads[i] < 0 || a.pads[i + r] < 0)) ctx.fail("pads must be non-negative");
    const WindowDim w = forward_window(in, (k - 1) * d + 1, s, a.pads[i], a.pads[i + r], a.auto_pad, ceil_mode);
    const int64_t out = w.out, pb = w.pad_begin, pe = w.pad_end;
    if (out <= 0) ctx.fail("the window does not fit: input " + shape_string(x_shape) + " gives an empty output");
    g.in[off + i] = in;
    g.out[off + i] = out;
    g.k[off + i] = k;
    g.s[off + i] = s;
    g.d[off + i] = d;
    g.pb[off + i] = pb;
    g.pe[off + i] = pe;
  }
}

std::vector<int64_t> out_shape(const Geo& g, int64_t channels) {
  std::vector<int64_t> s{g.N, channels};
  for (size_t i = kMaxSpatial - g.rank; i < kMaxSpatial; ++i) s.push_back(g.out[i]);
  return s;
}

Geo conv_geometry(const PrepareContext& ctx, size_t xi) {
  const KernelInput& x = required_input(ctx, xi, "X");
  const KernelInput& w = required_input(ctx, xi + 1, "W");
  if (w.dtype != x.dtype) ctx.fail("W is " + dtype_name(w.dtype) + " but X is " + dtype_name(x.dtype));
  if (x.shape.size() < 3 || w.shape.size() != x.shape.size())
    ctx.fail("X " + shape_string(x.shape) + " and W " + shape_string(w.shape) + " must have the same rank, 3 to 5");
  Geo g;
  g.N = x.shape[0];
  g.C = x.shape[1];
  g.M = w.shape[0];
  g.G = ctx.node.attr_int("group", 1);
  if (g.G < 1 || g.C % g.G || g.M % g.G || w.shape[1] * g.G != g.C)
    ctx.fail("group " + std::to_string(g.G) + " does not fit X " + shape_string(x.shape) + " and W " +
             shape_string(w.shape) + " (W must be [M, C/group, k...] with C and M divisible by group)");
  window_geometry(ctx, x.shape, kernel_dims(ctx, w.shape), false, g);
  return g;
}

Geo conv_transpose_geometry(const PrepareContext& ctx, Dims3& right_pad) {
  const KernelInput& x = required_input(ctx, 0, "X");
  const KernelInput& w = required_input(ctx, 1, "W");
  if (w.dtype != x.dtype) ctx.fail("W is " + dtype_name(w.dtype) + " but X is " + dtype_name(x.dtype));
  if (x.shape.size() < 3 || x.shape.size() > 5 || w.shape.size() != x.shape.size())
    ctx.fail("X " + shape_string(x.shape) + " and W " + shape_string(w.shape) + " must have the same rank, 3 to 5");
  Geo g;
  g.N = x.shape[0];
  g.C = x.shape[1];
  g.G = ctx.node.attr_int("group", 1);
  if (g.G < 1 || w.shape[0] != g.C || g.C % g.G)
    ctx.fail("W " + shape_string(w.shape) + " must be [C, M/group, k...] for X " + shape_string(x.shape) +
             " and group " + std::to_string(g.G));
  g.M = w.shape[1] * g.G;
  const size_t r = x.shape.size() - 2;
  g.rank = r;
  const std::vector<int64_t> k = kernel_dims(ctx, w.shape);
  const WindowAttrs a = window_attrs(ctx, k);
  const std::vector<int64_t> opad = spatial_attr(ctx, "output_padding", r, 0);
  std::vector<int64_t> oshape;
  if (ctx.node.has_attr("output_shape")) {
    oshape = ctx.node.attr_ints("output_shape");
    if (oshape.size() == r + 2) oshape.erase(oshape.begin(), oshape.begin() + 2);
    if (oshape.size() != r) ctx.fail("output_shape must list the " + std::to_string(r) + " spatial dims");
  }
  const size_t off = kMaxSpatial - r;
  right_pad = {0, 0, 0};
  for (size_t i = 0; i < r; ++i) {
    const int64_t in = x.shape[2 + i], s = a.strides[i], d = a.dilations[i], ext = (k[i] - 1) * d + 1;
    const int64_t total = s * (in - 1) + opad[i] + ext - (oshape.empty() ? in * s : oshape[i]);
    if (oshape.empty() && (a.auto_pad == "SAME_UPPER" || a.auto_pad == "SAME_LOWER") && total < 0)
      ctx.fail("negative total padding");
    const WindowDim w = transposed_window(in, ext, s, opad[i], a.pads[i], a.pads[i + r], a.auto_pad,
                                          oshape.empty() ? std::nullopt : std::optional<int64_t>(oshape[i]));
    const int64_t out = w.out, pb = w.pad_begin, pe = w.pad_end;
    if (out <= 0) ctx.fail("the output would be empty for input " + shape_string(x.shape));
    // The end padding that gives exactly `out` (output_padding and output_shape folded in), for oneDNN.
    right_pad[off + i] = s * (in - 1) + ext - pb - out;
    g.in[off + i] = in;
    g.out[off + i] = out;
    g.k[off + i] = k[i];
    g.s[off + i] = s;
    g.d[off + i] = d;
    g.pb[off + i] = pb;
    g.pe[off + i] = pe;
  }
  return g;
}

Geo pool_geometry(const PrepareContext& ctx, size_t x_input) {
  const KernelInput& x = required_input(ctx, x_input, "X");
  if (x.shape.size() < 3) ctx.fail("X " + shape_string(x.shape) + " must have rank 3 to 5");
  if (!ctx.node.has_attr("kernel_shape")) ctx.fail("attribute 'kernel_shape' is required");
  const std::vector<int64_t> k = ctx.node.attr_ints("kernel_shape");
  if (k.size() != x.shape.size() - 2)
    ctx.fail("kernel_shape has " + std::to_string(k.size()) + " entries for input " + shape_string(x.shape));
  Geo g;
  g.N = x.shape[0];
  g.C = g.M = x.shape[1];
  window_geometry(ctx, x.shape, k, ctx.node.attr_int("ceil_mode", 0) != 0, g);
  return g;
}

// Taps inside the input, or with count_include_pad those inside the padded input, where (as in the ONNX
// reference) ceil_mode's windows past the end pad extend the padding. PyTorch instead leaves those taps out of
// the divisor.
int64_t avg_pool_count(const Geo& g, const Dims3& o, bool include_pad) {
  int64_t n = 1;
  for (size_t i = 0; i < kMaxSpatial; ++i) {
    const int64_t padded_end = std::max(g.in[i] + g.pe[i], (g.out[i] - 1) * g.s[i] - g.pb[i] + (g.k[i] - 1) * g.d[i] + 1);
    const int64_t lo = include_pad ? -g.pb[i] : 0, hi = include_pad ? padded_end : g.in[i];
    int64_t c = 0;
    for (int64_t j = 0; j < g.k[i]; ++j) {
      const int64_t at = o[i] * g.s[i] - g.pb[i] + j * g.d[i];
      c += at >= lo && at < hi;
    }
    n *= c;
  }
  return std::max<int64_t>(n, 1);
}

void require_explicit(const PrepareContext& ctx, std::initializer_list<const char*> attrs) {
  const std::string auto_pad = ctx.node.attr_string("auto_pad", "NOTSET");
  if (auto_pad != "NOTSET")
    ctx.fail("auto_pad '" + auto_pad + "' is not supported here: pass explicit pads (the gradient rule resolves them)");
  for (const char* a : attrs)
    if (!ctx.node.has_attr(a)) ctx.fail(std::string("attribute '") + a + "' must be given explicitly");
}

std::array<bool, 3> wanted_outputs(const PrepareContext& ctx) {
  std::array<bool, 3> want{};
  for (size_t i = 0; i < ctx.node.outputs.size() && i < 3; ++i) want[i] = !ctx.node.outputs[i].empty();
  return want;
}

}  // namespace onnxtrain::ops
