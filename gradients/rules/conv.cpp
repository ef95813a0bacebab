// Gradients of Conv and ConvTranspose (pooling: rules/pool.cpp; the window geometry both use: rules/window.h):
//   Conv:          the fused onnxtrain.ConvGrad(dY, X, W) -> (dX, dW, dB) with the geometry resolved to explicit
//                  pads; its body (gradients/fused_conv.cpp) is dX = ConvTranspose(dY, W) padded to X's size,
//                  dW = a Conv of X by dY (batch and channels swapped) with stride and dilation exchanged,
//                  dB = ReduceSum(dY).
//   ConvTranspose: in standard ops, the adjoint the other way round: dX = Conv(dY, W); dW by the same trick
//                  with X and dY exchanged.
// The geometry (explicit pads for auto_pad, output_padding) is resolved here, so the spatial dims of the input
// must be known statically; batch and channel dims may be symbolic.
#include <algorithm>
#include <string>
#include <vector>

#include "gradients/fused.h"
#include "gradients/rule.h"
#include "gradients/rules/util.h"
#include "gradients/rules/window.h"
#include "graph/error.h"
#include "graph/window.h"

namespace onnxtrain {

namespace {

using rules::conv_transpose_to;
using rules::dims_shape;
using rules::iota_from;
using rules::spatial_attr;
using rules::spatial_known;
using rules::Win;
using rules::window;

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

}  // namespace

void register_conv_rules(GradientRegistry& r) {
  r.add("Conv", conv_rule);
  r.add("ConvTranspose", conv_transpose_rule);
}

}  // namespace onnxtrain
