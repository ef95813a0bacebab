// Kernel tests for LpNormalization (the onnx package ships no node test for it), and float64/error cases of
// LRN, MeanVarianceNormalization and Shrink beyond the (float32) ONNX node tests. Expected values are worked
// out by hand or by a reference loop written here from the ONNX definitions.
#include <gtest/gtest.h>

#include <cmath>
#include <span>

#include "executor/kernel.h"
#include "executor/kernel_test_util.h"
#include "graph/error.h"

namespace onnxtrain {
namespace {

using namespace test;

template <class T> class NormOps : public ::testing::Test {};
using FloatTypes = ::testing::Types<float, double>;
TYPED_TEST_SUITE(NormOps, FloatTypes);

TYPED_TEST(NormOps, LpNormalizationP2AlongLastAxis) {
  using T = TypeParam;
  // Rows (3, 4) and (0, -5): norms 5 and 5.
  Tensor y = run_single(make_node("LpNormalization", 1), 1, {tensor<T>({2, 2}, {3, 4, 0, -5})});
  expect_values<T>(y, {0.6, 0.8, 0.0, -1.0}, 1e-6);
}

TYPED_TEST(NormOps, LpNormalizationP1AlongAxis0) {
  using T = TypeParam;
  // Columns (1, -3) and (2, 2): L1 norms 4 and 4.
  Node n = make_node("LpNormalization", 1, {{"axis", int64_t{0}}, {"p", int64_t{1}}});
  Tensor y = run_single(n, 1, {tensor<T>({2, 2}, {1, 2, -3, 2})});
  expect_values<T>(y, {0.25, 0.5, -0.75, 0.5}, 1e-6);
}

TYPED_TEST(NormOps, LpNormalizationMiddleAxisOfRank3) {
  using T = TypeParam;
  // [1, 2, 2]: axis 1 pairs (x[0,0,k], x[0,1,k]): (6, 8) -> norm 10, (1, 0) -> norm 1.
  Node n = make_node("LpNormalization", 1, {{"axis", int64_t{1}}});
  Tensor y = run_single(n, 1, {tensor<T>({1, 2, 2}, {6, 1, 8, 0})});
  expect_values<T>(y, {0.6, 1.0, 0.8, 0.0}, 1e-6);
}

TEST(NormOpsErrors, LpNormalizationRefusesP3) {
  Node n = make_node("LpNormalization", 1, {{"p", int64_t{3}}});
  try {
    run_single(n, 1, {tensor<double>({2}, {1, 2})});
    FAIL() << "p = 3 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("n_LpNormalization"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'p' must be 1 or 2"), std::string::npos) << e.what();
  }
}

TEST(NormOpsErrors, LrnNeedsSize) {
  try {
    run_single(make_node("LRN", 1), 13, {tensor<double>({1, 2, 1}, {1, 2})});
    FAIL() << "LRN without size was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'size' is required"), std::string::npos) << e.what();
  }
}

TEST(NormOpsErrors, MvnDefaultAxesNeedRank4) {
  // The default axes [0, 2, 3] do not exist in a rank-3 input.
  EXPECT_THROW(run_single(make_node("MeanVarianceNormalization", 1), 13, {tensor<double>({1, 2, 2}, {1, 2, 3, 4})}),
               Error);
}

TEST(NormOps64, LrnMatchesTheDefinition) {
  // size 2 (even): the window of channel c is [c, c + 1] (floor(1/2) = 0 before, ceil(1/2) = 1 after).
  const std::vector<double> x = {1.0, -2.0, 0.5, 3.0};  // [1, 4, 1]
  const double alpha = 0.5, beta = 0.75, bias = 2.0;
  Node n = make_node("LRN", 1, {{"size", int64_t{2}}, {"alpha", 0.5f}, {"beta", 0.75f}, {"bias", 2.0f}});
  Tensor y = run_single(n, 13, {tensor<double>({1, 4, 1}, x)});
  std::vector<double> want;
  for (size_t c = 0; c < 4; ++c) {
    double s = x[c] * x[c] + (c + 1 < 4 ? x[c + 1] * x[c + 1] : 0.0);
    want.push_back(x[c] / std::pow(bias + alpha / 2 * s, beta));
  }
  expect_values<double>(y, want, 1e-12);
}

TEST(NormOps64, MvnOverLastAxis) {
  // Rows (1, 2, 3) and (4, 4, 4): means 2 and 4; population sd sqrt(2/3) and 0 (giving 0 / 1e-9 = 0).
  Node n = make_node("MeanVarianceNormalization", 1, {{"axes", std::vector<int64_t>{1}}});
  Tensor y = run_single(n, 13, {tensor<double>({2, 3}, {1, 2, 3, 4, 4, 4})});
  const double sd = std::sqrt(2.0 / 3.0) + 1e-9;
  expect_values<double>(y, {-1 / sd, 0, 1 / sd, 0, 0, 0}, 1e-9);
}

TEST(NormOps64, ShrinkHardAndSoft) {
  Node n = make_node("Shrink", 1, {{"lambd", 1.5f}, {"bias", 0.5f}});
  Tensor y = run_single(n, 9, {tensor<double>({5}, {-2, -1, 0, 1.5, 3})});
  expect_values<double>(y, {-1.5, 0, 0, 0, 2.5}, 1e-12);
}

TYPED_TEST(NormOps, DetOfABatch) {
  using T = TypeParam;
  // [[1, 2], [3, 4]] -> -2; [[0, 1], [1, 0]] needs a row swap -> -1; [[1, 2], [2, 4]] is singular -> 0;
  // [[2, 0], [0, 3]] -> 6.
  Tensor x = tensor<T>({2, 2, 2, 2}, {1, 2, 3, 4, 0, 1, 1, 0, 1, 2, 2, 4, 2, 0, 0, 3});
  Tensor y = run_single(make_node("Det", 1), 11, {x});
  EXPECT_EQ(y.shape, (std::vector<int64_t>{2, 2}));
  expect_values<T>(y, {-2, -1, 0, 6}, 1e-5);
}

TEST(NormOps64, Det3x3AndEmpty) {
  // Expansion along the first row: 2 (1*0 - 3*4) - 1 (0*0 - 3*1) + 5 (0*4 - 1*1) = -24 + 3 - 5 = -26.
  Tensor y = run_single(make_node("Det", 1), 11, {tensor<double>({3, 3}, {2, 1, 5, 0, 1, 3, 1, 4, 0})});
  EXPECT_TRUE(y.shape.empty());
  expect_values<double>(y, {-26}, 1e-12);
  // A 0 x 0 matrix has determinant 1 (the empty product).
  expect_values<double>(run_single(make_node("Det", 1), 11, {tensor<double>({2, 0, 0}, {})}), {1, 1}, 0);
}

TEST(NormOpsErrors, DetNeedsSquareMatrices) {
  try {
    run_single(make_node("Det", 1), 11, {tensor<double>({2, 3}, {1, 2, 3, 4, 5, 6})});
    FAIL() << "a 2x3 matrix was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("n_Det"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("square"), std::string::npos) << e.what();
  }
}

Tensor bool_tensor(const std::vector<bool>& v) {
  Tensor t = Tensor::empty(DType::Bool, {static_cast<int64_t>(v.size())});
  for (size_t i = 0; i < v.size(); ++i) t.ptr<uint8_t>()[i] = v[i] ? 1 : 0;
  return t;
}

TEST(ShapeOps64, CompressAlongAxisAndFlattened) {
  // [[1, 2], [3, 4], [5, 6]]: rows 0 and 2; a condition shorter than the axis (the missing entries count as
  // false) keeping no column; and without axis the flattened elements 1 and 3.
  Tensor x = tensor<double>({3, 2}, {1, 2, 3, 4, 5, 6});
  Tensor rows = run_single(make_node("Compress", 2, {{"axis", int64_t{0}}}), 11, {x, bool_tensor({true, false, true})}, {1});
  EXPECT_EQ(rows.shape, (std::vector<int64_t>{2, 2}));
  expect_values<double>(rows, {1, 2, 5, 6}, 0);
  Tensor cols = run_single(make_node("Compress", 2, {{"axis", int64_t{-1}}}), 11, {x, bool_tensor({false})}, {1});
  EXPECT_EQ(cols.shape, (std::vector<int64_t>{3, 0}));
  Tensor flat = run_single(make_node("Compress", 2), 9, {x, bool_tensor({false, true, false, true})}, {1});
  EXPECT_EQ(flat.shape, (std::vector<int64_t>{2}));
  expect_values<double>(flat, {2, 4}, 0);
}

TEST(ShapeOps64, CompressRefusesARunTimeCondition) {
  // The output's shape depends on the condition, and plans fix shapes before running.
  try {
    run_single(make_node("Compress", 2, {{"axis", int64_t{0}}}), 11,
               {tensor<double>({2}, {1, 2}), bool_tensor({true, false})});
    FAIL() << "a run-time condition was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("n_Compress"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("must be known before the step runs"), std::string::npos) << e.what();
  }
}

TEST(ShapeOps64, CenterCropPadCropsAndPadsCentred) {
  // Axis 0: 4 -> 1 crops, starting at floor(3 / 2) = 1. Axis 1: 2 -> 5 pads, the input at floor(3 / 2) = 1.
  Tensor x = tensor<double>({4, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  Tensor shape = Tensor::empty(DType::Int64, {2});
  shape.ptr<int64_t>()[0] = 1;
  shape.ptr<int64_t>()[1] = 5;
  Tensor y = run_single(make_node("CenterCropPad", 2), 18, {x, shape}, {1});
  EXPECT_EQ(y.shape, (std::vector<int64_t>{1, 5}));
  expect_values<double>(y, {0, 3, 4, 0, 0}, 0);
}

}  // namespace
}  // namespace onnxtrain
