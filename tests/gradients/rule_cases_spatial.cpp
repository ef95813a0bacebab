// Gradient-check cases of the spatial op family, appended to the table in rule_cases.cpp. Kinks are avoided by
// sampling: grid points fall on pixel boundaries (or rounding boundaries of nearest) with probability zero,
// MaxRoiPool / LpPool maxima and zeros likewise, and MaxUnpool's indices are distinct.
#include "gradients/rule_cases.h"

#include <cmath>

namespace onnxtrain::test {

namespace {

using I = std::vector<int64_t>;
using S = std::string;

void add_grid_sample(std::vector<RuleCase>& v) {
  const std::pair<double, double> any{-1, 1}, inside{-0.95, 0.95}, beyond{-1.3, 1.3}, far{-2.6, 2.6};
  const Shapes s2{{2, 2, 4, 5}, {2, 3, 2, 2}};
  const auto gs = [&](std::string label, S mode, S pad, int64_t align, std::pair<double, double> grid,
                      Shapes shapes, int64_t opset) {
    v.push_back(make("GridSample_" + label, "GridSample", shapes,
                     {{"mode", mode}, {"padding_mode", pad}, {"align_corners", align}}, {any, grid}, opset));
  };
  gs("bilinear_zeros", "bilinear", "zeros", 0, beyond, s2, 16);
  gs("bilinear_zeros_align", "bilinear", "zeros", 1, beyond, s2, 16);
  gs("bilinear_border", "bilinear", "border", 0, beyond, s2, 16);
  gs("bilinear_border_align", "bilinear", "border", 1, beyond, s2, 16);
  gs("bilinear_reflection", "bilinear", "reflection", 0, far, s2, 16);
  gs("bilinear_reflection_align", "bilinear", "reflection", 1, far, s2, 16);
  gs("nearest_zeros", "nearest", "zeros", 0, beyond, s2, 16);
  gs("nearest_reflection_align", "nearest", "reflection", 1, far, s2, 16);
  gs("bicubic_zeros", "bicubic", "zeros", 0, beyond, s2, 16);
  gs("bicubic_border_align", "bicubic", "border", 1, beyond, s2, 16);
  gs("bicubic_reflection", "bicubic", "reflection", 0, far, s2, 16);
  gs("bicubic_inside_align", "bicubic", "zeros", 1, inside, s2, 16);
  // Opset 20: the N-D form (a volume, and a 1-D signal) with the new mode names.
  gs("linear_3d_border", "linear", "border", 0, beyond, {{1, 2, 3, 4, 3}, {1, 2, 2, 3, 3}}, 20);
  gs("linear_3d_reflection_align", "linear", "reflection", 1, far, {{1, 2, 3, 2, 4}, {1, 2, 3, 2, 3}}, 20);
  gs("cubic_1d_zeros", "cubic", "zeros", 0, beyond, {{2, 2, 6}, {2, 5, 1}}, 20);
  gs("cubic_3d_reflection", "cubic", "reflection", 0, far, {{1, 1, 3, 4, 4}, {1, 2, 2, 2, 3}}, 20);
  // One side constant: the fused op then computes only the other output (the unnamed one is skipped).
  const std::vector<double> g{-0.83, 0.41, 0.27, -0.66, 0.05, 0.92, -0.38, -0.11};
  const auto grid = TensorData::from<double>({1, 2, 2, 2}, std::span<const double>(g));
  v.push_back(with_const(make("GridSample_constant_grid", "GridSample", {{1, 2, 3, 4}, {1, 2, 2, 2}},
                              {{"mode", S("bicubic")}, {"padding_mode", S("border")}}, {}, 16),
                         1, grid));
  std::vector<double> xs(24);
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = std::sin(1.7 * static_cast<double>(i));
  v.push_back(with_const(make("GridSample_constant_x", "GridSample", {{1, 2, 3, 4}, {1, 2, 2, 2}},
                              {{"padding_mode", S("reflection")}}, {any, far}, 16),
                         0, TensorData::from<double>({1, 2, 3, 4}, std::span<const double>(xs))));
}

void add_lp_pool(std::vector<RuleCase>& v) {
  v.push_back(make("LpPool_p2_2x2", "LpPool", {{2, 3, 4, 4}}, {{"kernel_shape", I{2, 2}}}, {}, 11));
  v.push_back(make("LpPool_p3_strides_pads", "LpPool", {{1, 2, 5, 6}},
                   {{"kernel_shape", I{3, 2}}, {"strides", I{2, 2}}, {"pads", I{1, 0, 1, 1}}, {"p", int64_t{3}}}, {},
                   11));
  RuleCase p1 = make("LpPool_p1_1d", "LpPool", {{2, 2, 7}}, {{"kernel_shape", I{3}}, {"p", int64_t{1}}}, {}, 11);
  p1.avoid_zero = true;  // |x| has its kink at 0
  v.push_back(p1);
  v.push_back(make("LpPool_same_upper_3d", "LpPool", {{1, 2, 3, 4, 3}},
                   {{"kernel_shape", I{2, 3, 2}}, {"auto_pad", S("SAME_UPPER")}}, {}, 11));
  v.push_back(make("LpPool_same_lower_p4", "LpPool", {{1, 1, 5, 4}},
                   {{"kernel_shape", I{2, 3}}, {"auto_pad", S("SAME_LOWER")}, {"p", int64_t{4}}}, {}, 11));
  v.push_back(make("LpPool_dilations", "LpPool", {{1, 2, 6, 6}},
                   {{"kernel_shape", I{2, 2}}, {"dilations", I{2, 1}}, {"strides", I{1, 2}}}, {}, 18));
  v.push_back(make("LpPool_ceil_mode", "LpPool", {{1, 2, 7, 6}},
                   {{"kernel_shape", I{3, 2}}, {"strides", I{2, 2}}, {"ceil_mode", int64_t{1}}, {"p", int64_t{3}}}, {},
                   18));
  v.push_back(make("GlobalLpPool_p2", "GlobalLpPool", {{2, 3, 4, 5}}, {}, {}, 11));
  v.push_back(make("GlobalLpPool_p3_1d", "GlobalLpPool", {{2, 2, 6}}, {{"p", int64_t{3}}}, {}, 11));
}

void add_max_unpool(std::vector<RuleCase>& v) {
  // Indices of one element per 2x2 window of a 4x4 plane (as MaxPool's Indices would be), N = 1, C = 2.
  const std::vector<int64_t> idx{1, 6, 8, 15, 16 + 5, 16 + 2, 16 + 12, 16 + 11};
  const auto indices = TensorData::from<int64_t>({1, 2, 2, 2}, std::span<const int64_t>(idx));
  const Attrs a{{"kernel_shape", I{2, 2}}, {"strides", I{2, 2}}};
  v.push_back(with_const(make("MaxUnpool_2x2", "MaxUnpool", {{1, 2, 2, 2}, {1, 2, 2, 2}}, a, {}, 11), 1, indices));
  // (With output_shape the checker cannot type Y: ONNX shape inference leaves it unknown; the torch test in
  // tests/python/test_spatial_torch.py covers that form.)
  v.push_back(with_const(make("MaxUnpool_opset9", "MaxUnpool", {{1, 2, 2, 2}, {1, 2, 2, 2}}, a, {}, 9), 1, indices));
}

void add_col2im(std::vector<RuleCase>& v) {
  // [N, C * prod(block), L]: C = 2 and a 2x2 block over a 3x4 image give 2 x 3 = 6 blocks.
  RuleCase plain = make("Col2Im_2x2", "Col2Im", {{2, 8, 6}, {2}, {2}}, {}, {}, 18);
  plain = with_const(with_const(plain, 1, ints({3, 4})), 2, ints({2, 2}));
  v.push_back(plain);
  // pads 1 all round, stride 2, dilation (2, 1): a 5x5 image, 2x3 block: out = ((7 - 3) / 2 + 1, (7 - 3) / 2 + 1) = 3x3.
  RuleCase geo = make("Col2Im_pads_strides_dilations", "Col2Im", {{1, 6, 9}, {2}, {2}},
                      {{"pads", I{1, 1, 1, 1}}, {"strides", I{2, 2}}, {"dilations", I{2, 1}}}, {}, 18);
  geo = with_const(with_const(geo, 1, ints({5, 5})), 2, ints({2, 3}));
  v.push_back(geo);
  RuleCase one = make("Col2Im_1d_strided", "Col2Im", {{1, 3, 4}, {1}, {1}}, {{"strides", I{2}}, {"pads", I{0, 1}}}, {}, 18);
  v.push_back(with_const(with_const(one, 1, ints({8})), 2, ints({3})));
}

void add_max_roi_pool(std::vector<RuleCase>& v) {
  const std::vector<double> rois{0, 0, 0, 3, 3, 1, 1, 2, 5, 4, 0, 2.2, 0.6, 5.6, 5.2};
  const auto r = TensorData::from<double>({3, 5}, std::span<const double>(rois));
  v.push_back(with_const(make("MaxRoiPool_2x2", "MaxRoiPool", {{2, 2, 6, 6}, {3, 5}}, {{"pooled_shape", I{2, 2}}}), 1, r));
  v.push_back(with_const(make("MaxRoiPool_scaled_3x2", "MaxRoiPool", {{2, 1, 5, 7}, {3, 5}},
                              {{"pooled_shape", I{3, 2}}, {"spatial_scale", 0.75f}}),
                         1, r));
}

}  // namespace

void add_spatial_cases(std::vector<RuleCase>& v) {
  add_grid_sample(v);
  add_lp_pool(v);
  add_max_unpool(v);
  add_col2im(v);
  add_max_roi_pool(v);
}

}  // namespace onnxtrain::test
