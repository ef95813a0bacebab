// Standard-ONNX bodies of the spatial family's fused gradients (native kernels: executor/cpu/spatial.cpp).
//
// MaxRoiPoolGrad(dY, X, rois) -> dX, attributes pooled_shape and spatial_scale (rules always set both: a body
// has no attribute defaults). The body recomputes the kernel's bins (roi_bins in executor/cpu/spatial.cpp) in
// float64, whatever X's type, so the corners and bin edges are the kernel's own numbers: each region's corners
// are round(v * scale) with halves away from zero (std::round, built from Floor since ONNX's Round rounds
// halves to even), bin i covers rows [floor(i bh), ceil((i + 1) bh)) + y1 clipped to [0, H], likewise columns.
// Each bin's first maximum in row-major order (the kernel's strict `>`) is found without a per-bin loop:
// every bin is a mask over the region's [H, W] plane, X outside the mask reads -inf, the bin's maximum is
// ArgMax + GatherElements, and the first in-bin position holding that maximum is ArgMax of the (in bin and
// equal to the maximum) indicator, which is exact for a bin full of -inf too. dY then goes there as a one-hot
// over the region's plane summed over the bins, and each region's plane is summed into its batch entry (no
// ScatterElements: its reduction='add' needs opset 16, and MaxRoiPool is an opset-1 op, so the body stays valid
// at every opset from 13, the least an exported gradient model imports). An empty bin adds nothing (Where, not
// a product, so an infinite dY stays where it belongs). The sums group the additions by region, where the
// kernel adds them one by one: equal to rounding. Cost: the masked copy is [R, C, ph, pw, H, W], i.e. ph * pw
// times the regions' gathered planes, and the per-batch sum is [N, R, C, H, W]. Not reproduced: a NaN in a bin (the kernel keeps the bin's
// first element when that one is NaN and skips later NaNs; the body's comparisons find no maximum then and
// add nothing for that bin).
#include <limits>
#include <tuple>
#include <utility>

#include "gradients/fused_body.h"

namespace onnxtrain {

namespace {

using fused_body::add;
using fused_body::int64s;

constexpr int64_t kDouble = 11, kInt64 = 7, kBool = 9;  // TensorProto element types

Function max_roi_pool_grad() {
  Function f = fused_body::function(
      "MaxRoiPoolGrad", {"dY", "X", "rois"}, {"dX"},
      "Gradient of MaxRoiPool (attributes pooled_shape, spatial_scale) with respect to X: each dY added at its "
      "bin's first maximum in X (row-major). Bins are recomputed in float64 as Caffe's ROIPooling defines them; "
      "the first maximum is found by masking X to each bin; dY is spread there as one-hots and summed into "
      "each region's batch entry (no scatter, so any opset from 13).",
      {"pooled_shape", "spatial_scale"});
  using fused_body::kFloat, fused_body::kInts;
  const auto cast = [&](const std::string& in, const std::string& out, int64_t to) {
    return add(f, "Cast", {in}, out, {{"to", to}});
  };
  fused_body::caller_attribute(f, "pooled", "pooled_shape", kInts);
  fused_body::caller_attribute(f, "scale_f", "spatial_scale", kFloat);
  cast("scale_f", "scale", kDouble);
  add(f, "Constant", {}, "i0", {{"value", TensorData::scalar<int64_t>(0)}});
  add(f, "Constant", {}, "i1", {{"value", TensorData::scalar<int64_t>(1)}});
  add(f, "Constant", {}, "i2", {{"value", TensorData::scalar<int64_t>(2)}});
  add(f, "Constant", {}, "i3", {{"value", TensorData::scalar<int64_t>(3)}});
  add(f, "Constant", {}, "i4", {{"value", TensorData::scalar<int64_t>(4)}});
  add(f, "Constant", {}, "d0", {{"value", TensorData::scalar<double>(0.0)}});
  add(f, "Constant", {}, "d1", {{"value", TensorData::scalar<double>(1.0)}});
  add(f, "Constant", {}, "dhalf", {{"value", TensorData::scalar<double>(0.5)}});
  int64s(f, "ax_last", {-1});
  int64s(f, "ax0", {0});

  // Sizes: N, C, H, W of X; ph, pw of pooled_shape.
  add(f, "Shape", {"X"}, "xshape");
  add(f, "Gather", {"xshape", "i1"}, "C", {{"axis", int64_t{0}}});
  add(f, "Gather", {"xshape", "i2"}, "H", {{"axis", int64_t{0}}});
  add(f, "Gather", {"xshape", "i3"}, "W", {{"axis", int64_t{0}}});
  add(f, "Gather", {"pooled", "i0"}, "ph", {{"axis", int64_t{0}}});
  add(f, "Gather", {"pooled", "i1"}, "pw", {{"axis", int64_t{0}}});
  cast("H", "Hd", kDouble);
  cast("W", "Wd", kDouble);
  cast("ph", "phd", kDouble);
  cast("pw", "pwd", kDouble);

  // The regions' columns, in float64: batch index (truncated, as the kernel's static_cast) and the corners
  // round(v * scale), halves away from zero.
  cast("rois", "rois_d", kDouble);
  add(f, "Gather", {"rois_d", "i0"}, "batch_d", {{"axis", int64_t{1}}});
  cast("batch_d", "batch", kInt64);
  const auto corner = [&](const char* col, const std::string& name) {
    add(f, "Gather", {"rois_d", col}, name + "_v", {{"axis", int64_t{1}}});
    add(f, "Mul", {name + "_v", "scale"}, name + "_t");
    add(f, "Abs", {name + "_t"}, name + "_abs");
    add(f, "Floor", {name + "_abs"}, name + "_floor");
    add(f, "Sub", {name + "_abs", name + "_floor"}, name + "_frac");
    add(f, "GreaterOrEqual", {name + "_frac", "dhalf"}, name + "_up");
    cast(name + "_up", name + "_upd", kDouble);
    add(f, "Add", {name + "_floor", name + "_upd"}, name + "_mag");
    add(f, "Sign", {name + "_t"}, name + "_sign");
    add(f, "Mul", {name + "_sign", name + "_mag"}, name + "_r");
    // [R, 1], to broadcast against the bins.
    return add(f, "Unsqueeze", {name + "_r", "ax_last"}, name);
  };
  corner("i1", "x1");
  corner("i2", "y1");
  corner("i3", "x2");
  corner("i4", "y2");

  // Per axis: the bins' edges [R, p] and the membership of each position [R, p, len].
  const auto bins = [&](const std::string& a, const std::string& lo, const std::string& hi, const std::string& p,
                        const std::string& pd, const std::string& len, const std::string& lend) {
    add(f, "Sub", {hi, lo}, a + "_span0");
    add(f, "Add", {a + "_span0", "d1"}, a + "_span1");
    add(f, "Max", {a + "_span1", "d1"}, a + "_span");
    add(f, "Div", {a + "_span", pd}, a + "_bin");  // [R, 1]
    add(f, "Range", {"i0", p, "i1"}, a + "_i");
    cast(a + "_i", a + "_id", kDouble);
    add(f, "Add", {a + "_id", "d1"}, a + "_id1");
    add(f, "Mul", {a + "_id", a + "_bin"}, a + "_lo_t");  // [R, p]
    add(f, "Mul", {a + "_id1", a + "_bin"}, a + "_hi_t");
    add(f, "Floor", {a + "_lo_t"}, a + "_lo_f");
    add(f, "Ceil", {a + "_hi_t"}, a + "_hi_c");
    add(f, "Add", {a + "_lo_f", lo}, a + "_lo_s");
    add(f, "Add", {a + "_hi_c", lo}, a + "_hi_s");
    add(f, "Min", {a + "_lo_s", lend}, a + "_lo_m");
    add(f, "Max", {a + "_lo_m", "d0"}, a + "_start");
    add(f, "Min", {a + "_hi_s", lend}, a + "_hi_m");
    add(f, "Max", {a + "_hi_m", "d0"}, a + "_end");
    add(f, "Unsqueeze", {a + "_start", "ax_last"}, a + "_start3");  // [R, p, 1]
    add(f, "Unsqueeze", {a + "_end", "ax_last"}, a + "_end3");
    add(f, "Range", {"i0", len, "i1"}, a + "_pos");
    cast(a + "_pos", a + "_posd", kDouble);  // [len]
    add(f, "GreaterOrEqual", {a + "_posd", a + "_start3"}, a + "_after");
    add(f, "Less", {a + "_posd", a + "_end3"}, a + "_before");
    return add(f, "And", {a + "_after", a + "_before"}, a + "_in");  // [R, p, len]
  };
  bins("h", "y1", "y2", "ph", "phd", "H", "Hd");
  bins("w", "x1", "x2", "pw", "pwd", "W", "Wd");
  // mask [R, 1, ph, pw, H, W]: row in bin i and column in bin j.
  int64s(f, "ax_rows", {1, 3, 5});
  int64s(f, "ax_cols", {1, 2, 4});
  add(f, "Unsqueeze", {"h_in", "ax_rows"}, "rows6");
  add(f, "Unsqueeze", {"w_in", "ax_cols"}, "cols6");
  add(f, "And", {"rows6", "cols6"}, "mask");

  // X's planes per region, masked to each bin: [R, C, ph, pw, H * W].
  // In float64 (exact for float32 X), so -inf needs no CastLike (opset 15).
  cast("X", "x_d", kDouble);
  add(f, "Gather", {"x_d", "batch"}, "xr", {{"axis", int64_t{0}}});
  int64s(f, "ax_bins", {2, 3});
  add(f, "Unsqueeze", {"xr", "ax_bins"}, "xr6");
  add(f, "Constant", {}, "neg_inf", {{"value", TensorData::scalar<double>(-std::numeric_limits<double>::infinity())}});
  add(f, "Where", {"mask", "xr6", "neg_inf"}, "masked");
  int64s(f, "flat5", {0, 0, 0, 0, -1});
  add(f, "Reshape", {"masked", "flat5"}, "masked_flat");
  add(f, "Reshape", {"mask", "flat5"}, "mask_flat");  // [R, 1, ph, pw, H * W]
  add(f, "ArgMax", {"masked_flat"}, "any_max", {{"axis", int64_t{-1}}, {"keepdims", int64_t{1}}});
  add(f, "GatherElements", {"masked_flat", "any_max"}, "bin_max", {{"axis", int64_t{-1}}});
  add(f, "Equal", {"masked_flat", "bin_max"}, "at_max");
  add(f, "And", {"at_max", "mask_flat"}, "candidate");
  cast("candidate", "candidate_d", kDouble);
  add(f, "ArgMax", {"candidate_d"}, "arg", {{"axis", int64_t{-1}}, {"keepdims", int64_t{1}}});  // first one
  add(f, "GatherElements", {"candidate_d", "arg"}, "hit_d", {{"axis", int64_t{-1}}});             // 0: empty bin
  cast("hit_d", "hit", kBool);

  // dY added at each bin's maximum, without a scatter (ScatterElements adds only from opset 16, and MaxRoiPool
  // is an opset-1 op): a one-hot of the maximum over the region's plane, summed over the bins, then each
  // region's plane summed into its batch entry. Where, not products: an infinite dY stays where it belongs.
  add(f, "Mul", {"H", "W"}, "HW");
  add(f, "Range", {"i0", "HW", "i1"}, "hw_range");
  add(f, "Equal", {"arg", "hw_range"}, "is_arg");  // [R, C, ph, pw, H * W]
  add(f, "And", {"is_arg", "hit"}, "one_hot");
  add(f, "Unsqueeze", {"dY", "ax_last"}, "dy5");
  // A zero of dY's type without CastLike (opset 15): the sum of an empty slice of dY.
  int64s(f, "flat", {-1});
  add(f, "Reshape", {"dY", "flat"}, "dy_flat");
  add(f, "Slice", {"dy_flat", "ax0", "ax0"}, "dy_none");
  add(f, "ReduceSum", {"dy_none"}, "zero", {{"keepdims", int64_t{0}}});
  add(f, "Where", {"one_hot", "dy5", "zero"}, "spread");
  add(f, "ReduceSum", {"spread", "ax_bins"}, "per_roi", {{"keepdims", int64_t{0}}});  // [R, C, H * W]
  add(f, "Gather", {"xshape", "i0"}, "N");
  add(f, "Range", {"i0", "N", "i1"}, "n_range");
  add(f, "Unsqueeze", {"n_range", "ax_last"}, "n_col");  // [N, 1]
  add(f, "Equal", {"n_col", "batch"}, "of_batch");      // [N, R]
  add(f, "Unsqueeze", {"of_batch", "ax_bins"}, "of_batch4");  // [N, R, 1, 1]
  add(f, "Where", {"of_batch4", "per_roi", "zero"}, "per_batch");  // [N, R, C, H * W]
  int64s(f, "ax1", {1});
  add(f, "ReduceSum", {"per_batch", "ax1"}, "summed", {{"keepdims", int64_t{0}}});
  add(f, "Reshape", {"summed", "xshape"}, "dX");
  return f;
}


// GridSampleGrad(dY, X, grid) -> (dX, dGrid). One body for every rank (1-D to 3-D sampling), mode, padding and
// align_corners: X is viewed as [N, C, D, H, W] (missing leading spatial dims are 1) and the grid gets 0 for
// the missing components, which samples the single row or plane with weight exactly 1 and slope 0; every
// axis takes four taps i0 - 1 .. i0 + 2 around floor(x), of which linear uses the middle two, nearest the
// second (x already rounded half to even) and cubic all four (Keys, A = -0.75); the other taps are masked
// out. The mode, padding and align_corners come in as ints (attributes `interpolation`: 0 linear, 1 nearest,
// 2 cubic; `padding`: 0 zeros, 1 border, 2 reflection; `align_corners`), which the rule writes beside
// GridSample's strings since a body cannot compare strings before opset 19. The coordinates, taps, weights
// and slopes are computed in float64 whatever X's type, exactly as axis_taps in executor/cpu/spatial.cpp
// (the ONNX reference's padding of the coordinate, then of each tap); dX is ScatterElements(reduction='add')
// of dY times the tap weights (opset 16, as GridSample itself), dGrid the sum over channels and taps of
// dY * X[tap] * d(weight)/d(grid). Costs: 64 tap combinations per sampled point and channel whatever the
// mode (a 2-D bilinear sample uses 4 of them), as [N, C, points, 64] tensors.
Function grid_sample_grad() {
  Function f = fused_body::function(
      "GridSampleGrad", {"dY", "X", "grid"}, {"dX", "dGrid"},
      "Gradient of GridSample with respect to X and grid. Attributes (ints, set by the rule beside GridSample's "
      "own): interpolation (0 linear, 1 nearest, 2 cubic), padding (0 zeros, 1 border, 2 reflection), "
      "align_corners. Taps and weights are recomputed in float64 as the ONNX reference defines them; dX "
      "scatters dY * weight with ScatterElements(reduction='add') (opset 16); dGrid sums dY * X * the weights' "
      "slope (zero for nearest).",
      {"interpolation", "padding", "align_corners"});
  using fused_body::kInt;
  int counter = 0;
  // An auto-named node: returns its output.
  const auto N_ = [&](const std::string& type, std::vector<std::string> in,
                      std::map<std::string, Attribute> attrs = {}) {
    std::string out = "g";  // appended, not "g" + ...: GCC 12 warns falsely (-Wrestrict) on that operator+
    out += std::to_string(counter++);
    return add(f, type, std::move(in), out, std::move(attrs));
  };
  const auto dconst = [&](double v) {
    return N_("Constant", {}, {{"value", TensorData::scalar<double>(v)}});
  };
  const auto iconst = [&](int64_t v) { return N_("Constant", {}, {{"value", TensorData::scalar<int64_t>(v)}}); };
  const auto ints = [&](const std::vector<int64_t>& v) {
    return N_("Constant", {}, {{"value", TensorData::from<int64_t>({static_cast<int64_t>(v.size())}, std::span(v))}});
  };
  const auto bools = [&](const std::vector<int64_t>& v) {  // a [4] bool mask over the taps
    return N_("Cast", {ints(v)}, {{"to", kBool}});
  };
  const auto where = [&](const std::string& c, const std::string& a, const std::string& b) {
    return N_("Where", {c, a, b});
  };
  const auto bin = [&](const char* op, const std::string& a, const std::string& b) { return N_(op, {a, b}); };

  fused_body::caller_attribute(f, "interp", "interpolation", kInt);
  fused_body::caller_attribute(f, "pad", "padding", kInt);
  fused_body::caller_attribute(f, "align", "align_corners", kInt);
  const std::string is_near = bin("Equal", "interp", iconst(1)), is_cubic = bin("Equal", "interp", iconst(2));
  const std::string is_lin = bin("Equal", "interp", iconst(0));
  const std::string is_border = bin("Equal", "pad", iconst(1)), is_refl = bin("Equal", "pad", iconst(2));
  const std::string is_zeros = bin("Equal", "pad", iconst(0)), is_align = bin("Equal", "align", iconst(1));
  const std::string d0 = dconst(0), d1 = dconst(1), dhalf = dconst(0.5), d2 = dconst(2), d4 = dconst(4);

  // Shapes: X as [N, C, D, H, W], the grid as [N, P, 3] in float64 (x, y, z; missing components 0).
  add(f, "Shape", {"X"}, "xshape");
  add(f, "Shape", {"grid"}, "gshape");
  const std::string r1 = N_("Slice", {"gshape", ints({-1}), ints({std::numeric_limits<int64_t>::max()})});
  const std::string nc = N_("Slice", {"xshape", ints({0}), ints({2})});
  const std::string spatial = N_("Slice", {"xshape", ints({2}), ints({std::numeric_limits<int64_t>::max()})});
  const std::string spatial3 = N_("Slice", {N_("Concat", {ints({1, 1, 1}), spatial}, {{"axis", int64_t{0}}}),
                                            ints({-3}), ints({std::numeric_limits<int64_t>::max()})});
  const std::string x5shape = N_("Concat", {nc, spatial3}, {{"axis", int64_t{0}}});
  const std::string dhw = N_("ReduceProd", {spatial3}, {{"keepdims", int64_t{1}}});  // [1]
  const std::string x_flat = N_("Reshape", {"X", N_("Concat", {nc, dhw}, {{"axis", int64_t{0}}})});  // [N, C, DHW]
  const std::string g3d = N_("Reshape", {N_("Cast", {"grid"}, {{"to", kDouble}}),
                                         N_("Concat", {ints({0, -1}), r1}, {{"axis", int64_t{0}}})});  // [N, P, r]
  const std::string np = N_("Slice", {N_("Shape", {g3d}), ints({0}), ints({2})});
  const std::string missing = N_("Concat", {np, bin("Sub", ints({3}), r1)}, {{"axis", int64_t{0}}});
  const std::string g3 = N_("Concat", {g3d, N_("Expand", {d0, missing})}, {{"axis", int64_t{-1}}});  // [N, P, 3]

  // reflect(x) into [lo, hi] and its slope sign, as the kernel's reflect().
  const auto reflect = [&](const std::string& x, const std::string& lo, const std::string& hi) {
    const std::string range = bin("Sub", hi, lo);
    const std::string flat_range = bin("LessOrEqual", range, d0);
    const std::string safe = where(flat_range, d1, range);
    const auto fold = [&](const std::string& dx) {  // n whole ranges, r the rest, even n
      const std::string n = N_("Floor", {bin("Div", dx, safe)});
      const std::string rest = bin("Sub", dx, bin("Mul", n, range));
      const std::string even = bin("Equal", N_("Mod", {n, d2}, {{"fmod", int64_t{1}}}), d0);
      return std::make_tuple(rest, even);
    };
    const auto [rb, eb] = fold(bin("Sub", lo, x));
    const auto [ra, ea] = fold(bin("Sub", x, hi));
    const std::string below = bin("Less", x, lo), above = bin("Greater", x, hi);
    const std::string dm1 = dconst(-1);
    const std::string xb = where(eb, bin("Add", lo, rb), bin("Sub", hi, rb));
    const std::string xa = where(ea, bin("Sub", hi, ra), bin("Add", lo, ra));
    std::string out = where(below, xb, where(above, xa, x));
    std::string slope = where(below, where(eb, dm1, d1), where(above, where(ea, dm1, d1), d1));
    out = where(flat_range, lo, out);
    slope = where(flat_range, d0, slope);
    return std::make_pair(out, slope);
  };

  const std::string k1 = bools({0, 1, 0, 0}), k12 = bools({0, 1, 1, 0}), k2 = bools({0, 0, 1, 0});
  const std::string kall = bools({1, 1, 1, 1});
  const std::string kpos = N_("Constant", {}, {{"value", TensorData::from<double>({4}, std::span<const double>(
                                                                std::vector<double>{-1, 0, 1, 2}))}});
  const std::string ax_last = ints({-1});
  struct Taps {
    std::string idx, w, dw, valid;  // [N, P, 4]
  };
  // One axis: grid component `comp` over a spatial dim of length `len` (1-D int64).
  const auto taps = [&](int64_t comp, int64_t dim) {
    const std::string v = N_("Gather", {g3, iconst(comp)}, {{"axis", int64_t{-1}}});  // [N, P]
    const std::string len = N_("Cast", {N_("Gather", {spatial3, iconst(dim)}, {{"axis", int64_t{0}}})},
                               {{"to", kDouble}});
    const std::string len_m1 = bin("Sub", len, d1);
    const std::string lo = where(is_align, d0, dconst(-0.5));
    const std::string hi = where(is_align, len_m1, bin("Sub", len, dhalf));
    const std::string v1 = bin("Add", v, d1);
    const std::string xa = bin("Mul", bin("Div", v1, d2), len_m1);
    const std::string xn = bin("Div", bin("Sub", bin("Mul", v1, len), d1), d2);
    std::string x = where(is_align, xa, xn);
    std::string slope = where(is_align, bin("Div", len_m1, d2), bin("Div", len, d2));
    x = where(is_near, N_("Round", {x}), x);
    slope = where(is_near, d0, slope);
    const std::string outside = bin("Or", bin("Less", x, lo), bin("Greater", x, hi));
    const std::string clamped = N_("Max", {N_("Min", {x, len_m1}), d0});
    const auto [xr, sr] = reflect(x, lo, hi);
    const std::string use_border = bin("And", outside, is_border), use_refl = bin("And", outside, is_refl);
    x = where(use_border, clamped, where(use_refl, xr, x));
    slope = where(use_border, d0, where(use_refl, bin("Mul", slope, sr), slope));
    // Non-finite (x - x is not 0) or far outside: every tap reads zero.
    const std::string finite = bin("Equal", bin("Sub", x, x), d0);
    const std::string near_enough = bin("And", N_("Not", {bin("Less", x, bin("Sub", lo, d4))}),
                                        N_("Not", {bin("Greater", x, bin("Add", hi, d4))}));
    const std::string ok = bin("And", finite, near_enough);
    const std::string xs = N_("Unsqueeze", {where(ok, x, d0), ax_last});  // [N, P, 1]
    const std::string i0 = N_("Floor", {xs}), fr = bin("Sub", xs, i0);
    const std::string pos = bin("Add", i0, kpos);  // [N, P, 4]
    const std::string one_minus = bin("Sub", d1, fr);
    const std::string slope3 = N_("Unsqueeze", {slope, ax_last});
    const std::string neg_slope = N_("Neg", {slope3});
    // Linear: (0, 1 - f, f, 0); nearest: (0, 1, 0, 0); cubic: Keys' kernel at d = f + 1 - k.
    const std::string w_lin = where(k1, one_minus, where(k2, fr, d0));
    const std::string dw_lin = where(k1, neg_slope, where(k2, slope3, d0));
    const std::string w_near = where(k1, d1, d0);
    const std::string d = bin("Sub", bin("Add", fr, d1), N_("Add", {kpos, d1}));  // f + 1 - k
    const std::string ad = N_("Abs", {d});
    const std::string p1 = bin("Add", bin("Mul", bin("Mul", bin("Sub", bin("Mul", dconst(1.25), ad), dconst(2.25)), ad), ad), d1);
    const std::string p2 = bin("Sub", bin("Mul", bin("Add", bin("Mul", bin("Sub", bin("Mul", dconst(-0.75), ad), dconst(-3.75)), ad), dconst(-6)), ad), dconst(-3));
    const std::string in1 = bin("LessOrEqual", ad, d1), in2 = bin("Less", ad, d2);
    const std::string w_cub = where(in1, p1, where(in2, p2, d0));
    const std::string sgn = where(bin("Less", d, d0), dconst(-1), d1);
    const std::string q1 = bin("Mul", bin("Mul", sgn, bin("Sub", bin("Mul", dconst(3 * 1.25), ad), dconst(2 * 2.25))), ad);
    const std::string q2 = bin("Mul", sgn, bin("Add", bin("Mul", bin("Sub", bin("Mul", dconst(3 * -0.75), ad), dconst(10 * -0.75)), ad), dconst(-6)));
    const std::string dw_cub = bin("Mul", where(in1, q1, where(in2, q2, d0)), slope3);
    Taps t;
    t.w = where(is_cubic, w_cub, where(is_near, w_near, w_lin));
    t.dw = where(is_cubic, dw_cub, where(is_near, d0, dw_lin));
    // (Where on bool values has no onnxruntime kernel: And/Or.)
    const std::string active = bin("Or", bin("And", is_cubic, kall),
                                   bin("Or", bin("And", is_near, k1), bin("And", is_lin, k12)));
    // Each tap padded: inside as is; border clamped; reflection reflected and clamped; zeros: reads nothing.
    const std::string inside = bin("And", N_("Not", {bin("Less", pos, d0)}), bin("Less", pos, len));
    const std::string pos_clamped = N_("Max", {N_("Min", {pos, len_m1}), d0});
    const auto [pr, unused] = reflect(pos, lo, hi);
    (void)unused;
    const std::string pos_refl = N_("Max", {N_("Min", {N_("Floor", {pr}), len_m1}), d0});
    const std::string padded = where(inside, pos, where(is_border, pos_clamped, pos_refl));
    const std::string readable = bin("Or", inside, N_("Not", {is_zeros}));
    t.valid = bin("And", bin("And", active, N_("Unsqueeze", {ok, ax_last})), readable);
    t.idx = N_("Cast", {where(t.valid, padded, d0)}, {{"to", kInt64}});
    return t;
  };
  const Taps tz = taps(2, 0), ty = taps(1, 1), tx = taps(0, 2);

  // The 64 combinations [N, P, 4, 4, 4] (z, y, x), flattened to [N, P, 64].
  const std::string az = ints({3, 4}), ay = ints({2, 4}), ax = ints({2, 3});
  const auto comb = [&](const std::string& a, const std::string& b, const std::string& c, const char* op) {
    return bin(op, bin(op, N_("Unsqueeze", {a, az}), N_("Unsqueeze", {b, ay})), N_("Unsqueeze", {c, ax}));
  };
  const std::string flat64 = ints({0, 0, 64});
  const std::string w = N_("Reshape", {comb(tz.w, ty.w, tx.w, "Mul"), flat64});
  const std::string valid = N_("Reshape", {comb(tz.valid, ty.valid, tx.valid, "And"), flat64});
  const std::string H = N_("Gather", {spatial3, iconst(1)}, {{"axis", int64_t{0}}});
  const std::string W = N_("Gather", {spatial3, iconst(2)}, {{"axis", int64_t{0}}});
  const std::string at = N_("Reshape", {bin("Add", bin("Mul", bin("Add", bin("Mul", N_("Unsqueeze", {tz.idx, az}), H),
                                                                   N_("Unsqueeze", {ty.idx, ay})), W),
                                               N_("Unsqueeze", {tx.idx, ax})), flat64});  // [N, P, 64]
  const std::string one_ax = ints({1});
  const std::string valid4 = N_("Unsqueeze", {valid, one_ax}), w4 = N_("Unsqueeze", {w, one_ax});  // [N, 1, P, 64]
  const std::string at4 = N_("Unsqueeze", {at, one_ax});
  const std::string dy_d = N_("Unsqueeze", {N_("Reshape", {N_("Cast", {"dY"}, {{"to", kDouble}}), ints({0, 0, -1})}),
                                            ax_last});  // [N, C, P, 1]
  // dX: dY * w added at (n, c, tap).
  {
    fused_body::constant_like(f, "zero", 0.0, "dY");
    const std::string upd = N_("CastLike", {where(valid4, bin("Mul", dy_d, w4), d0), "dY"});  // [N, C, P, 64]
    const std::string upd_shape = N_("Shape", {upd});
    const std::string nn = N_("Gather", {nc, iconst(0)}, {{"axis", int64_t{0}}});
    const std::string cc = N_("Gather", {nc, iconst(1)}, {{"axis", int64_t{0}}});
    const std::string plane = bin("Add", bin("Mul", N_("Reshape", {N_("Range", {iconst(0), nn, iconst(1)}), ints({-1, 1, 1, 1})}), cc),
                                  N_("Reshape", {N_("Range", {iconst(0), cc, iconst(1)}), ints({1, -1, 1, 1})}));
    const std::string index = bin("Add", bin("Mul", plane, dhw), N_("Expand", {at4, upd_shape}));
    const std::string zeros = N_("Reshape", {N_("Expand", {"zero", "xshape"}), ints({-1})});
    const std::string sc = N_("ScatterElements", {zeros, N_("Reshape", {index, ints({-1})}), N_("Reshape", {upd, ints({-1})})},
                              {{"axis", int64_t{0}}, {"reduction", std::string("add")}});
    add(f, "Reshape", {sc, "xshape"}, "dX");
  }
  // dGrid: per axis, the sum over channels and taps of dY * X[tap] * d(w)/d(grid), zero for nearest.
  {
    // X at every tap of every channel: GatherElements over [N, C, DHW] with the taps [N, 1, P * 64] expanded.
    const std::string at_row = N_("Reshape", {at4, ints({0, 1, -1})});
    const std::string row_len = N_("Slice", {N_("Shape", {at_row}), ints({2}), ints({3})});
    const std::string gidx = N_("Expand", {at_row, N_("Concat", {nc, row_len}, {{"axis", int64_t{0}}})});
    const std::string xv = N_("Reshape", {N_("Cast", {N_("GatherElements", {x_flat, gidx}, {{"axis", int64_t{2}}})},
                                                  {{"to", kDouble}}),
                                          N_("Concat", {nc, ints({-1, 64})}, {{"axis", int64_t{0}}})});
    const std::string prod = where(valid4, bin("Mul", dy_d, xv), d0);  // [N, C, P, 64]
    const std::string per_tap = N_("ReduceSum", {prod, one_ax}, {{"keepdims", int64_t{0}}});  // [N, P, 64]
    const auto slope_of = [&](const std::string& a, const std::string& b, const std::string& c) {
      const std::string coef = N_("Reshape", {comb(a, b, c, "Mul"), flat64});
      const std::string s = N_("ReduceSum", {bin("Mul", per_tap, coef), ax_last}, {{"keepdims", int64_t{1}}});
      return where(is_near, d0, s);  // [N, P, 1]
    };
    const std::string gz = slope_of(tz.dw, ty.w, tx.w), gy = slope_of(tz.w, ty.dw, tx.w), gx = slope_of(tz.w, ty.w, tx.dw);
    const std::string all3 = N_("Concat", {gx, gy, gz}, {{"axis", int64_t{-1}}});
    const std::string firsts = N_("Slice", {all3, ints({0}), r1, ax_last});
    add(f, "Reshape", {N_("CastLike", {firsts, "dY"}), "gshape"}, "dGrid");
  }
  return f;
}

}  // namespace

std::vector<Function> fused_spatial_functions() { return {max_roi_pool_grad(), grid_sample_grad()}; }

}  // namespace onnxtrain
