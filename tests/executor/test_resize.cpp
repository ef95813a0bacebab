// Resize beyond the ONNX node tests (which are float32 and resize every axis): float64 with the opset-18 axes
// attribute against the half-pixel linear formula written out by hand, and the plan-time errors.
#include <gtest/gtest.h>

#include "graph/error.h"
#include "kernel_test_util.h"

namespace onnxtrain {
namespace {

using test::make_node;
using test::run_node;

Tensor f64(std::vector<int64_t> shape, const std::vector<double>& v) {
  Tensor t = Tensor::empty(DType::Float64, std::move(shape));
  std::copy(v.begin(), v.end(), t.span<double>().begin());
  return t;
}

Tensor f32(const std::vector<float>& v) {
  Tensor t = Tensor::empty(DType::Float32, {static_cast<int64_t>(v.size())});
  std::copy(v.begin(), v.end(), t.span<float>().begin());
  return t;
}

Tensor i64(const std::vector<int64_t>& v) {
  Tensor t = Tensor::empty(DType::Int64, {static_cast<int64_t>(v.size())});
  std::copy(v.begin(), v.end(), t.span<int64_t>().begin());
  return t;
}

TEST(Resize, LinearHalfPixelAlongOneAxisFloat64) {
  // X [2, 3, 2], axis 1 doubled: output o reads x = (o + 0.5) / 2 - 0.5, clamped at the edges.
  std::vector<double> xs;
  for (int i = 0; i < 12; ++i) xs.push_back(0.5 * i * i - i);
  const Tensor x = f64({2, 3, 2}, xs);
  Node n = make_node("Resize", 3, {{"mode", std::string("linear")}, {"axes", std::vector<int64_t>{-2}}});
  const Tensor y = run_node(n, 18, {x, Tensor(), f32({2.0f})}, {2})[0];
  ASSERT_EQ(y.shape, (std::vector<int64_t>{2, 6, 2}));
  auto at = [&](int64_t b, int64_t i, int64_t c) { return xs[(b * 3 + i) * 2 + c]; };
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t c = 0; c < 2; ++c) {
      const double a0 = at(b, 0, c), a1 = at(b, 1, c), a2 = at(b, 2, c);
      const std::vector<double> want{a0, 0.75 * a0 + 0.25 * a1, 0.25 * a0 + 0.75 * a1,
                                     0.75 * a1 + 0.25 * a2, 0.25 * a1 + 0.75 * a2, a2};
      for (int64_t o = 0; o < 6; ++o) EXPECT_DOUBLE_EQ(y.ptr<double>()[(b * 6 + o) * 2 + c], want[o]) << b << o << c;
    }
}

void expect_plan_error(const Node& n, int64_t opset, const std::vector<Tensor>& ins, const std::vector<size_t>& known,
                       const std::string& needle) {
  try {
    run_node(n, opset, ins, known);
    ADD_FAILURE() << "expected an error mentioning '" << needle << "'";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(needle), std::string::npos) << what;
    EXPECT_NE(what.find("n_Resize"), std::string::npos) << "the error names the node: " << what;
  }
}

TEST(Resize, PlanErrorsNameNodeAndProblem) {
  const Tensor x = f64({1, 1, 2, 2}, {1, 2, 3, 4});
  const Tensor scales = f32({1, 1, 2, 2});
  const Tensor sizes = i64({1, 1, 4, 4});
  expect_plan_error(make_node("Resize", 4), 13, {x, Tensor(), scales, sizes}, {2, 3}, "exactly one of scales");
  expect_plan_error(make_node("Resize", 3), 13, {x, Tensor(), f32({1, 2})}, {2}, "scales has 2 values, expected 4");
  expect_plan_error(make_node("Resize", 3, {{"antialias", int64_t{1}}}), 18, {x, Tensor(), scales}, {2},
                    "antialias is not defined for mode 'nearest'");
  expect_plan_error(make_node("Resize", 3, {{"coordinate_transformation_mode", std::string("half_pixel_symmetric")}}),
                    18, {x, Tensor(), scales}, {2}, "not defined at opset 18");
  expect_plan_error(make_node("Resize", 3, {{"coordinate_transformation_mode", std::string("tf_crop_and_resize")}}), 13,
                    {x, Tensor(), scales}, {2}, "needs roi");
  expect_plan_error(make_node("Resize", 3, {{"mode", std::string("bicubic")}}), 13, {x, Tensor(), scales}, {2},
                    "mode must be nearest, linear or cubic");
}

}  // namespace
}  // namespace onnxtrain
