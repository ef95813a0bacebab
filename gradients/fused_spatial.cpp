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

}  // namespace

std::vector<Function> fused_spatial_functions() { return {max_roi_pool_grad()}; }

}  // namespace onnxtrain
