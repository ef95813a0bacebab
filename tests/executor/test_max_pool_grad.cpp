// MaxPool (values with and without Indices) and onnxtrain.MaxPoolGrad against a naive per-window reference written here:
// ties keep the first maximum, a NaN wins, all -inf windows and padding-only taps, strides, dilations,
// ceil_mode and overlapping windows (where the gradient adds up).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "executor/tensor.h"
#include "kernel_test_util.h"

namespace onnxtrain {
namespace {

using test::make_node;
using I = std::vector<int64_t>;

struct PoolCase {
  I x, k, s, d, pads;
  int64_t ceil_mode;
};

// For each output of a 2-D pool (row-major), the flat input offset of its first maximum (a NaN beats any
// number), or -1 when the window lies entirely in the padding.
std::vector<int64_t> reference_argmax(const PoolCase& c, const Tensor& x, const I& ys) {
  std::vector<int64_t> out;
  const int64_t H = c.x[2], W = c.x[3];
  for (int64_t p = 0; p < ys[0] * ys[1]; ++p)
    for (int64_t oh = 0; oh < ys[2]; ++oh)
      for (int64_t ow = 0; ow < ys[3]; ++ow) {
        int64_t arg = -1;
        double best = 0;
        for (int64_t jh = 0; jh < c.k[0]; ++jh)
          for (int64_t jw = 0; jw < c.k[1]; ++jw) {
            const int64_t ih = oh * c.s[0] - c.pads[0] + jh * c.d[0], iw = ow * c.s[1] - c.pads[1] + jw * c.d[1];
            if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
            const int64_t at = (p * H + ih) * W + iw;
            const double v = x.ptr<double>()[at];
            if (arg < 0 || v > best || (std::isnan(v) && !std::isnan(best))) {
              best = v;
              arg = at;
            }
          }
        out.push_back(arg);
      }
  return out;
}

class MaxPoolAgainstReference : public ::testing::TestWithParam<PoolCase> {};

TEST_P(MaxPoolAgainstReference, ValuesIndicesAndGradient) {
  const PoolCase& c = GetParam();
  Tensor x = test::random_tensor<double>(c.x, 3, -1, 1);
  double* xv = x.ptr<double>();
  // Ties (a repeated value), a NaN and a patch of -inf.
  for (int64_t i = 0; i + 1 < x.numel(); i += 5) xv[i + 1] = xv[i];
  xv[7] = std::numeric_limits<double>::quiet_NaN();
  // With 2x2 windows from (0, 6): NaNs at its taps 1 and 2; the earlier (tap 1, row 0) is the maximum.
  if (c.x[3] > 7) xv[c.x[3] + 6] = std::numeric_limits<double>::quiet_NaN();
  for (int64_t i = 0; i < std::min<int64_t>(4, c.x[3]); ++i) xv[2 * c.x[3] + i] = -std::numeric_limits<double>::infinity();
  std::map<std::string, Attribute> a{{"kernel_shape", c.k}, {"strides", c.s}, {"dilations", c.d},
                                     {"pads", c.pads}, {"ceil_mode", c.ceil_mode}};
  std::vector<Tensor> out = test::run_node(make_node("MaxPool", 1, a, "", 2), 17, {x});
  const std::vector<int64_t> want = reference_argmax(c, x, out[0].shape);
  ASSERT_EQ(static_cast<int64_t>(want.size()), out[0].numel());
  for (int64_t i = 0; i < out[0].numel(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(out[1].ptr<int64_t>()[i], want[i]);
    const double y = out[0].ptr<double>()[i];
    if (want[i] < 0) EXPECT_EQ(y, -std::numeric_limits<double>::infinity());
    else if (std::isnan(xv[want[i]])) EXPECT_TRUE(std::isnan(y));
    else EXPECT_EQ(y, xv[want[i]]);
  }

  // Without Indices the kernel may take another path (the tiled one): same values.
  std::vector<Tensor> values_only = test::run_node(make_node("MaxPool", 1, a, "", 1), 17, {x});
  ASSERT_EQ(values_only.at(0).shape, out[0].shape);
  for (int64_t i = 0; i < out[0].numel(); ++i) {
    const double y = out[0].ptr<double>()[i], v = values_only[0].ptr<double>()[i];
    EXPECT_TRUE(y == v || (std::isnan(y) && std::isnan(v))) << i << ": " << v << " vs " << y;
  }

  Tensor dy = test::random_tensor<double>(out[0].shape, 4, -1, 1);
  std::vector<Tensor> dx = test::run_node(make_node("MaxPoolGrad", 2, a, "onnxtrain"), 1, {dy, x});
  ASSERT_EQ(dx.at(0).shape, x.shape);
  std::vector<double> expect(static_cast<size_t>(x.numel()), 0.0);
  for (size_t i = 0; i < want.size(); ++i)
    if (want[i] >= 0) expect[static_cast<size_t>(want[i])] += dy.ptr<double>()[i];
  for (int64_t i = 0; i < x.numel(); ++i) EXPECT_DOUBLE_EQ(dx[0].ptr<double>()[i], expect[static_cast<size_t>(i)]) << i;
}

// Mostly ties: every value one of three levels (a NaN among them), so which tap of a window wins is decided by the
// order rule nearly everywhere. 2x2/2 on even sides: the two-pass path for float64, for float32 the AVX-512 one
// (16 windows a vector: 5 windows a row, W2's 14, and 20 = a vector and a tail) where the build has it.
template <class T> void check_tied_2x2(const I& shape = {3, 2, 6, 10}) {
  const PoolCase c{shape, {2, 2}, {2, 2}, {1, 1}, {0, 0, 0, 0}, 0};
  const I ys{shape[0], shape[1], shape[2] / 2, shape[3] / 2};
  Tensor xd = test::random_tensor<double>(c.x, 9, 0, 3);
  for (double& v : xd.span<double>()) v = v < 0.2 ? std::numeric_limits<double>::quiet_NaN() : std::floor(v);
  Tensor x = Tensor::empty(dtype_of<T>(), c.x);
  for (int64_t i = 0; i < x.numel(); ++i) x.ptr<T>()[i] = static_cast<T>(xd.ptr<double>()[i]);
  std::map<std::string, Attribute> a{{"kernel_shape", c.k}, {"strides", c.s}};
  const std::vector<int64_t> want = reference_argmax(c, xd, ys);
  std::vector<Tensor> y = test::run_node(make_node("MaxPool", 1, a, "", 1), 17, {x});
  Tensor dy = Tensor::empty(dtype_of<T>(), ys);
  for (int64_t i = 0; i < dy.numel(); ++i) dy.ptr<T>()[i] = static_cast<T>(i + 1);  // distinct: shows which tap got it
  std::vector<Tensor> dx = test::run_node(make_node("MaxPoolGrad", 2, a, "onnxtrain"), 1, {dy, x});
  std::vector<double> expect(static_cast<size_t>(x.numel()), 0.0);
  for (size_t i = 0; i < want.size(); ++i) {
    const double v = y[0].ptr<T>()[i], w = xd.ptr<double>()[want[i]];
    EXPECT_TRUE(v == w || (std::isnan(v) && std::isnan(w))) << "output " << i;
    expect[static_cast<size_t>(want[i])] = static_cast<double>(i + 1);
  }
  for (int64_t i = 0; i < x.numel(); ++i) EXPECT_EQ(double(dx[0].ptr<T>()[i]), expect[static_cast<size_t>(i)]) << i;
}

TEST(MaxPool2x2, TiesAndNaNsFollowTheOrderRuleFloat64) { check_tied_2x2<double>(); }
TEST(MaxPool2x2, TiesAndNaNsFollowTheOrderRuleFloat32) {
  for (const I& shape : {I{3, 2, 6, 10}, I{2, 3, 28, 28}, I{1, 2, 4, 40}}) {
    SCOPED_TRACE(::testing::Message() << "x " << shape[2] << "x" << shape[3]);
    check_tied_2x2<float>(shape);
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, MaxPoolAgainstReference,
                         // The first four tile the plane (stride = kernel, no padding: the kernels' tiled path):
                         // 2x2 exactly, 2x2 with a row and a column no window covers, 3x3, and a 2x3 window.
                         ::testing::Values(PoolCase{{2, 3, 8, 8}, {2, 2}, {2, 2}, {1, 1}, {0, 0, 0, 0}, 0},
                                           PoolCase{{2, 3, 7, 9}, {2, 2}, {2, 2}, {1, 1}, {0, 0, 0, 0}, 0},
                                           PoolCase{{1, 2, 9, 7}, {3, 3}, {3, 3}, {1, 1}, {0, 0, 0, 0}, 0},
                                           PoolCase{{2, 2, 6, 10}, {2, 3}, {2, 3}, {1, 1}, {0, 0, 0, 0}, 0},
                                           PoolCase{{1, 2, 7, 6}, {3, 2}, {2, 1}, {1, 1}, {1, 0, 1, 1}, 0},
                                           PoolCase{{1, 2, 9, 9}, {3, 3}, {2, 3}, {2, 1}, {2, 1, 1, 2}, 1},
                                           PoolCase{{2, 1, 5, 11}, {2, 3}, {3, 2}, {1, 2}, {1, 1, 0, 0}, 1}));

}  // namespace
}  // namespace onnxtrain
