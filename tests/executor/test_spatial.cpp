// Kernel tests of the spatial ops: GlobalLpPool and MaxRoiPool (the onnx package ships no node test for them),
// and GridSample / Col2Im / MaxUnpool cases beyond the ONNX node tests (float64, padding semantics, errors).
// Expected values are worked out by hand in the comments.
#include <gtest/gtest.h>

#include <cmath>
#include <span>

#include "executor/kernel.h"
#include "executor/kernel_test_util.h"
#include "graph/error.h"

namespace onnxtrain {
namespace {

using namespace test;

Tensor int64_tensor(std::vector<int64_t> shape, const std::vector<int64_t>& v) {
  Tensor t = Tensor::empty(DType::Int64, std::move(shape));
  for (size_t i = 0; i < v.size(); ++i) t.span<int64_t>()[i] = v[i];
  return t;
}

template <class T> class SpatialOps : public ::testing::Test {};
using FloatTypes = ::testing::Types<float, double>;
TYPED_TEST_SUITE(SpatialOps, FloatTypes);

TYPED_TEST(SpatialOps, GlobalLpPoolNorms) {
  using T = TypeParam;
  const Tensor x = tensor<T>({1, 2, 2, 2}, {3, 4, 0, 0, 1, -2, 2, 0});
  // p = 2: sqrt(9 + 16) = 5, sqrt(1 + 4 + 4) = 3.
  expect_values<T>(run_single(make_node("GlobalLpPool", 1), 2, {x}), {5, 3}, 1e-6);
  // p = 1: 3 + 4 = 7, 1 + 2 + 2 = 5.
  expect_values<T>(run_single(make_node("GlobalLpPool", 1, {{"p", int64_t{1}}}), 2, {x}), {7, 5}, 1e-6);
  // p = 3: (27 + 64)^(1/3), (1 + 8 + 8)^(1/3).
  const Tensor y = run_single(make_node("GlobalLpPool", 1, {{"p", int64_t{3}}}), 2, {x});
  expect_values<T>(y, {std::cbrt(91.0), std::cbrt(17.0)}, 1e-5);
  EXPECT_EQ(y.shape, (std::vector<int64_t>{1, 2, 1, 1}));
}

TYPED_TEST(SpatialOps, MaxRoiPoolBins) {
  using T = TypeParam;
  std::vector<double> v(16);
  for (int i = 0; i < 16; ++i) v[static_cast<size_t>(i)] = i;  // x[h][w] = 4h + w: a bin's max is its last tap
  const Tensor x = tensor<T>({1, 1, 4, 4}, v);
  // Roi 0: the whole image, 2x2 bins of 2x2 -> 5, 7, 13, 15. Roi 1: (1,1)-(2,2), bins of one pixel -> 5, 6, 9, 10.
  // Roi 2: past the image (start clipped to 4): every bin empty -> 0.
  const Tensor rois = tensor<T>({3, 5}, {0, 0, 0, 3, 3, 0, 1, 1, 2, 2, 0, 10, 10, 12, 12});
  const Tensor y = run_single(make_node("MaxRoiPool", 2, {{"pooled_shape", std::vector<int64_t>{2, 2}}}), 1, {x, rois});
  EXPECT_EQ(y.shape, (std::vector<int64_t>{3, 1, 2, 2}));
  expect_values<T>(y, {5, 7, 13, 15, 5, 6, 9, 10, 0, 0, 0, 0}, 0);
  // spatial_scale 0.5: (0,0)-(7,7) becomes (0,0)-(4,4) after rounding 3.5 away from zero, 5 wide: bins of 2.5 cover
  // rows/cols [0, 3) and [2, 5) clipped to [2, 4) -> maxima x[2][2], x[2][3], x[3][2], x[3][3].
  const Tensor r2 = tensor<T>({1, 5}, {0, 0, 0, 7, 7});
  const Tensor y2 = run_single(make_node("MaxRoiPool", 2, {{"pooled_shape", std::vector<int64_t>{2, 2}},
                                                           {"spatial_scale", 0.5f}}),
                               1, {x, r2});
  expect_values<T>(y2, {10, 11, 14, 15}, 0);
}

TEST(SpatialOpsErrors, MaxRoiPoolRefusesABatchIndexOutOfRange) {
  const Tensor x = tensor<double>({1, 1, 2, 2}, {1, 2, 3, 4});
  const Tensor rois = tensor<double>({1, 5}, {1, 0, 0, 1, 1});
  try {
    run_single(make_node("MaxRoiPool", 2, {{"pooled_shape", std::vector<int64_t>{1, 1}}}), 1, {x, rois});
    FAIL() << "batch index 1 of a batch of 1 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("n_MaxRoiPool"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("batch index 1"), std::string::npos) << e.what();
  }
}

TYPED_TEST(SpatialOps, GridSamplePaddingAtTheCorner) {
  using T = TypeParam;
  // X = [[1, 2], [3, 4]]. Grid point (-1, -1): with align_corners it is pixel (0, 0) -> 1. Without, it is
  // coordinate (-0.5, -0.5): half a pixel out, taps -1 and 0 at weight 1/2 on each axis. zeros: 1/4 of X[0][0];
  // border: the taps clamp to X[0][0] -> 1; reflection: tap -1 reflects to 0 -> 1. Point (0, 0) is the centre
  // (0.5, 0.5) -> 2.5 in every mode.
  const Tensor x = tensor<T>({1, 1, 2, 2}, {1, 2, 3, 4});
  const Tensor grid = tensor<T>({1, 1, 2, 2}, {-1, -1, 0, 0});
  auto run = [&](const char* pad, int64_t align) {
    return run_single(make_node("GridSample", 2, {{"padding_mode", std::string(pad)}, {"align_corners", align}}), 16,
                      {x, grid});
  };
  expect_values<T>(run("zeros", 1), {1, 2.5}, 1e-6);
  expect_values<T>(run("zeros", 0), {0.25, 2.5}, 1e-6);
  expect_values<T>(run("border", 0), {1, 2.5}, 1e-6);
  expect_values<T>(run("reflection", 0), {1, 2.5}, 1e-6);
}

TEST(SpatialOpsEdges, GridSampleFarAndNonFiniteGridValues) {
  // X = [[1, 2], [3, 4]]. zeros padding: 1e30, -1e30 and NaN read nothing -> 0. border: 1e30 clamps to the last
  // column/row -> X[1][1] = 4. reflection, align_corners: -3 unnormalises to -1, one range past 0, which
  // reflects to 1 -> X[1][1] = 4; -5 to -2, two ranges, back to 0 -> X[0][0] = 1.
  const Tensor x = tensor<double>({1, 1, 2, 2}, {1, 2, 3, 4});
  const Tensor far = tensor<double>({1, 1, 3, 2}, {1e30, 0, -1e30, 0, std::nan(""), 0});
  auto run = [&](const Tensor& grid, const char* pad, int64_t align) {
    return run_single(make_node("GridSample", 2, {{"padding_mode", std::string(pad)}, {"align_corners", align}}), 16,
                      {x, grid});
  };
  expect_values<double>(run(far, "zeros", 0), {0, 0, 0}, 0);
  expect_values<double>(run(tensor<double>({1, 1, 1, 2}, {1e30, 1e30}), "border", 0), {4}, 0);
  expect_values<double>(run(tensor<double>({1, 1, 2, 2}, {-3, -3, -5, -5}), "reflection", 1), {4, 1}, 1e-12);
}

TEST(SpatialOpsErrors, GridSampleRefusesAFiveDimensionalInputBeforeOpset20) {
  const Tensor x = tensor<double>({1, 1, 2, 2, 2}, std::vector<double>(8, 1));
  const Tensor grid = tensor<double>({1, 1, 1, 1, 3}, {0, 0, 0});
  EXPECT_THROW(run_single(make_node("GridSample", 2), 16, {x, grid}), Error);
  expect_values<double>(run_single(make_node("GridSample", 2), 20, {x, grid}), {1}, 1e-12);
}

TYPED_TEST(SpatialOps, Col2ImSumsOverlappingBlocks) {
  using T = TypeParam;
  // A 2x3 image from 2x2 blocks at columns 0 and 1: block offsets k = (0,0), (0,1), (1,0), (1,1) are rows of the
  // input, blocks l = 0, 1 its columns. The middle column receives offset (., 1) of block 0 and (., 0) of block 1.
  const Tensor cols = tensor<T>({1, 4, 2}, {1, 10, 2, 20, 3, 30, 4, 40});
  const Tensor image = int64_tensor({2}, {2, 3}), block = int64_tensor({2}, {2, 2});
  const Tensor y = run_single(make_node("Col2Im", 3), 18, {cols, image, block}, {1, 2});
  EXPECT_EQ(y.shape, (std::vector<int64_t>{1, 1, 2, 3}));
  expect_values<T>(y, {1, 2 + 10, 20, 3, 4 + 30, 40}, 1e-6);
}

TEST(SpatialOpsErrors, MaxUnpoolRefusesAnIndexOutsideTheOutput) {
  const Tensor x = tensor<double>({1, 1, 1, 1}, {5});
  const Tensor idx = int64_tensor({1, 1, 1, 1}, {4});  // the unpooled 2x2 plane has indices 0..3
  try {
    run_single(make_node("MaxUnpool", 2, {{"kernel_shape", std::vector<int64_t>{2, 2}}}), 11, {x, idx});
    FAIL() << "index 4 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("n_MaxUnpool"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace onnxtrain
