// Conv, ConvTranspose and pooling kernels beyond the ONNX node tests: float32 (our AVX-512 kernels, or oneDNN) and
// float64 (direct loops) Conv against a naive N-D reference written here, ConvTranspose as the exact adjoint of Conv, MaxPool's
// Indices, and the factories' errors.
#include <gtest/gtest.h>

#include <cmath>

#include "executor/tensor.h"
#include "graph/error.h"
#include "kernel_test_util.h"

namespace onnxtrain {
namespace {

using test::make_node;
using test::random_tensor;
using test::ravel;
using test::run_single;
using test::unravel;
using I = std::vector<int64_t>;

struct ConvCase {
  I x, w;
  bool bias;
  int64_t group;
  I strides, dilations, pads;
};

// y[n, m, o] = b[m] + sum over c in m's group and kernel offsets j of x[n, c, o*s - pb + j*d] * w[m, c, j].
std::vector<double> reference_conv(const ConvCase& c, const Tensor& x, const Tensor& w, const Tensor* b, const I& ys) {
  const size_t r = c.x.size() - 2;
  const int64_t cg = c.x[1] / c.group, mg = c.w[0] / c.group;
  std::vector<double> y(static_cast<size_t>(numel_of(ys)), 0.0);
  auto xv = [&](int64_t i) { return x.dtype == DType::Float32 ? double(x.ptr<float>()[i]) : x.ptr<double>()[i]; };
  auto wv = [&](int64_t i) { return w.dtype == DType::Float32 ? double(w.ptr<float>()[i]) : w.ptr<double>()[i]; };
  for (int64_t yi = 0; yi < numel_of(ys); ++yi) {
    I o = unravel(yi, ys);
    const int64_t n = o[0], m = o[1];
    double acc = b ? (b->dtype == DType::Float32 ? double(b->ptr<float>()[m]) : b->ptr<double>()[m]) : 0.0;
    I ks(c.w.begin() + 2, c.w.end());
    for (int64_t c2 = 0; c2 < cg; ++c2)
      for (int64_t ji = 0; ji < numel_of(ks); ++ji) {
        I j = unravel(ji, ks);
        I xi{n, (m / mg) * cg + c2};
        bool inside = true;
        for (size_t a = 0; a < r; ++a) {
          const int64_t p = o[2 + a] * c.strides[a] - c.pads[a] + j[a] * c.dilations[a];
          inside = inside && p >= 0 && p < c.x[2 + a];
          xi.push_back(p);
        }
        if (!inside) continue;
        I wi{m, c2};
        wi.insert(wi.end(), j.begin(), j.end());
        acc += xv(ravel(xi, c.x)) * wv(ravel(wi, c.w));
      }
    y[static_cast<size_t>(yi)] = acc;
  }
  return y;
}

std::map<std::string, Attribute> conv_attrs(const ConvCase& c) {
  return {{"group", c.group}, {"strides", c.strides}, {"dilations", c.dilations}, {"pads", c.pads}};
}

const std::vector<ConvCase>& conv_cases() {
  static const std::vector<ConvCase> cases = {
      {{2, 3, 8, 8}, {4, 3, 3, 3}, true, 1, {1, 1}, {1, 1}, {1, 1, 1, 1}},   // the CNN workhorse
      {{1, 4, 9, 7}, {6, 2, 3, 2}, false, 2, {2, 1}, {1, 2}, {1, 0, 0, 1}},  // groups, asymmetric everything
      {{2, 8, 10, 10}, {8, 1, 3, 3}, true, 8, {2, 2}, {1, 1}, {1, 1, 1, 1}}, // depthwise
      {{2, 3, 11}, {5, 3, 4}, true, 1, {3}, {2}, {2, 1}},                     // 1-D
      {{1, 2, 5, 4, 6}, {3, 2, 2, 3, 2}, true, 1, {1, 2, 1}, {2, 1, 1}, {0, 1, 1, 1, 0, 0}},  // 3-D
      {{4, 32, 16, 16}, {64, 32, 3, 3}, true, 1, {1, 1}, {1, 1}, {1, 1, 1, 1}},  // big enough for real kernels
  };
  return cases;
}

template <class T> void check_conv_against_reference(double tol) {
  uint32_t seed = 1;
  for (const ConvCase& c : conv_cases()) {
    Tensor x = random_tensor<T>(c.x, seed++, -1, 1), w = random_tensor<T>(c.w, seed++, -1, 1);
    Tensor b = random_tensor<T>({c.w[0]}, seed++, -1, 1);
    Node n = make_node("Conv", c.bias ? 3 : 2, conv_attrs(c));
    Tensor y = c.bias ? run_single(n, 17, {x, w, b}) : run_single(n, 17, {x, w});
    std::vector<double> want = reference_conv(c, x, w, c.bias ? &b : nullptr, y.shape);
    ASSERT_EQ(static_cast<size_t>(y.numel()), want.size()) << shape_string(y.shape);
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(double(y.ptr<T>()[i]), want[i], tol * (1 + std::abs(want[i])))
          << "case x" << shape_string(c.x) << " w" << shape_string(c.w) << " element " << i;
  }
}

TEST(Conv, Float32MatchesReference) { check_conv_against_reference<float>(1e-5); }
TEST(Conv, Float64MatchesReference) { check_conv_against_reference<double>(1e-12); }

// <Conv(x, w), y> = <x, ConvTranspose(y, w)> when ConvTranspose has Conv's geometry and the output_padding that
// gives back x's size: ConvTranspose is the adjoint of Conv. Checked in both dtypes.
template <class T> void check_adjoint(double tol) {
  uint32_t seed = 100;
  for (const ConvCase& c : conv_cases()) {
    Tensor x = random_tensor<T>(c.x, seed++, -1, 1), w = random_tensor<T>(c.w, seed++, -1, 1);
    Tensor y = run_single(make_node("Conv", 2, conv_attrs(c)), 17, {x, w});
    Tensor r = random_tensor<T>(y.shape, seed++, -1, 1);
    const size_t rank = c.x.size() - 2;
    I opad;
    for (size_t a = 0; a < rank; ++a) {
      const int64_t full = c.strides[a] * (y.shape[2 + a] - 1) + (c.w[2 + a] - 1) * c.dilations[a] + 1 -
                           c.pads[a] - c.pads[a + rank];
      opad.push_back(c.x[2 + a] - full);
    }
    auto attrs = conv_attrs(c);
    attrs["output_padding"] = opad;
    Tensor xt = run_single(make_node("ConvTranspose", 2, attrs), 17, {r, w});
    ASSERT_EQ(xt.shape, c.x);
    double lhs = 0, rhs = 0;
    for (int64_t i = 0; i < y.numel(); ++i) lhs += double(y.ptr<T>()[i]) * double(r.ptr<T>()[i]);
    for (int64_t i = 0; i < x.numel(); ++i) rhs += double(x.ptr<T>()[i]) * double(xt.ptr<T>()[i]);
    EXPECT_NEAR(lhs, rhs, tol * (1 + std::abs(lhs))) << "case x" << shape_string(c.x) << " w" << shape_string(c.w);
  }
}

TEST(ConvTranspose, IsTheAdjointOfConvFloat64) { check_adjoint<double>(1e-12); }
TEST(ConvTranspose, IsTheAdjointOfConvFloat32) { check_adjoint<float>(1e-4); }

// float32 ConvTranspose with 8 or more output channels per group runs DirectConv's backward data (flipped kernel at
// stride 1, scatter path otherwise): against float64 (the direct loop) on the same values, with a bias, strides,
// output_padding, groups and a dilation.
TEST(ConvTranspose, Float32MatchesFloat64OnTheOwnKernels) {
  struct Case {
    I x, w;
    std::map<std::string, Attribute> attrs;
  };
  const std::vector<Case> cases = {
      {{2, 16, 7, 7}, {16, 8, 3, 3}, {{"pads", I{1, 1, 1, 1}}}},
      {{2, 16, 7, 7}, {16, 12, 3, 3}, {{"strides", I{2, 2}}, {"pads", I{1, 1, 1, 1}}, {"output_padding", I{1, 1}}}},
      {{1, 8, 5, 6}, {8, 8, 2, 3}, {{"strides", I{2, 1}}, {"dilations", I{1, 2}}, {"group", int64_t{2}}}},
  };
  uint32_t seed = 70;
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "x" << shape_string(c.x) << " w" << shape_string(c.w));
    Tensor x = random_tensor<double>(c.x, seed++, -1, 1), w = random_tensor<double>(c.w, seed++, -1, 1);
    const int64_t group = c.attrs.count("group") ? std::get<int64_t>(c.attrs.at("group")) : 1;
    Tensor b = random_tensor<double>({c.w[1] * group}, seed++, -1, 1);
    auto as_float = [](const Tensor& t) {
      Tensor f = Tensor::empty(DType::Float32, t.shape);
      for (int64_t i = 0; i < t.numel(); ++i) f.ptr<float>()[i] = static_cast<float>(t.ptr<double>()[i]);
      return f;
    };
    Node n = make_node("ConvTranspose", 3, c.attrs);
    Tensor y64 = run_single(n, 17, {x, w, b});
    Tensor y32 = run_single(n, 17, {as_float(x), as_float(w), as_float(b)});
    ASSERT_EQ(y32.shape, y64.shape);
    for (int64_t i = 0; i < y64.numel(); ++i)
      ASSERT_NEAR(double(y32.ptr<float>()[i]), y64.ptr<double>()[i], 1e-5 * (1 + std::abs(y64.ptr<double>()[i])))
          << "element " << i;
  }
}

TEST(ConvTranspose, OutputShapeAttributeSetsThePads) {
  // Spec: total padding = s*(in-1) + output_padding + ((k-1)*d + 1) - output_shape = 2*2 + 3 - 6 = 1, split with the
  // odd unit at the start for NOTSET, so the result is the full [7] output cropped at its first element.
  Tensor x = Tensor::from_vector<double>({1, 1, 3}, {1, 2, 3});
  Tensor w = Tensor::from_vector<double>({1, 1, 3}, {1, 10, 100});
  Tensor full = run_single(make_node("ConvTranspose", 2, {{"strides", I{2}}}), 17, {x, w});
  ASSERT_EQ(full.shape, (I{1, 1, 7}));
  const std::vector<double> want_full{1, 10, 102, 20, 203, 30, 300};
  for (size_t i = 0; i < 7; ++i) EXPECT_EQ(full.ptr<double>()[i], want_full[i]);
  Tensor cut = run_single(make_node("ConvTranspose", 2, {{"strides", I{2}}, {"output_shape", I{6}}}), 17, {x, w});
  ASSERT_EQ(cut.shape, (I{1, 1, 6}));
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(cut.ptr<double>()[i], want_full[i + 1]);
}

TEST(MaxPool, IndicesPointAtTheMaxima) {
  Tensor x = random_tensor<float>({2, 3, 7, 6}, 7, -1, 1);
  Node n = make_node("MaxPool", 1, {{"kernel_shape", I{3, 2}}, {"strides", I{2, 2}}, {"pads", I{1, 0, 1, 1}}}, "", 2);
  std::vector<Tensor> out = test::run_node(n, 12, {x});
  ASSERT_EQ(out[0].shape, (I{2, 3, 4, 3}));  // H: (7+2-3)/2+1, W: (6+1-2)/2+1
  for (int64_t i = 0; i < out[0].numel(); ++i) {
    const int64_t at = out[1].ptr<int64_t>()[i];
    ASSERT_GE(at, 0);
    ASSERT_LT(at, x.numel());
    EXPECT_EQ(x.ptr<float>()[at], out[0].ptr<float>()[i]);
    // The index lies in the same (image, channel) plane as the output element.
    EXPECT_EQ(at / (7 * 6), i / 12);
  }
}

TEST(AveragePool, CountIncludePadChangesOnlyTheBorder) {
  Tensor x = Tensor::from_vector<double>({1, 1, 3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9});
  std::map<std::string, Attribute> a{{"kernel_shape", I{3, 3}}, {"pads", I{1, 1, 1, 1}}};
  Tensor ex = run_single(make_node("AveragePool", 1, a), 17, {x});
  a["count_include_pad"] = int64_t{1};
  Tensor in = run_single(make_node("AveragePool", 1, a), 17, {x});
  // Corner (0,0) window covers 1, 2, 4, 5; centre covers everything.
  EXPECT_DOUBLE_EQ(ex.ptr<double>()[0], 12.0 / 4);
  EXPECT_DOUBLE_EQ(in.ptr<double>()[0], 12.0 / 9);
  EXPECT_DOUBLE_EQ(ex.ptr<double>()[4], 5.0);
  EXPECT_DOUBLE_EQ(in.ptr<double>()[4], 5.0);
}

// float32 ConvGrad (our AVX-512 kernels where the build has them, else oneDNN's backward primitives) against float64
// ConvGrad (the direct loops) on the same values, at W2's two shapes (smaller batch) and one whose channels are not
// a multiple of 16, and a depthwise one. Output names left empty are not computed.
TEST(ConvGrad, Float32MatchesFloat64AtBlockedShapes) {
  struct Case {
    I x, w;
    std::vector<std::string> outs;
    int64_t group = 1;
  };
  const std::vector<Case> cases = {
      {{4, 16, 14, 14}, {32, 16, 3, 3}, {"dX", "dW", "dB"}},  // W2 conv2
      {{4, 1, 28, 28}, {16, 1, 3, 3}, {"", "dW", "dB"}},      // W2 conv1: x needs no gradient
      {{3, 20, 9, 9}, {24, 20, 3, 3}, {"dX", "dW", ""}},
      {{2, 16, 10, 10}, {32, 16, 3, 3}, {"dX", "", ""}},
      {{2, 24, 9, 9}, {24, 1, 3, 3}, {"dX", "dW", "dB"}, 24},  // depthwise
  };
  uint32_t seed = 40;
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "x" << shape_string(c.x) << " w" << shape_string(c.w));
    const I ys{c.x[0], c.w[0], c.x[2], c.x[3]};
    Tensor x = random_tensor<double>(c.x, seed++, -1, 1), w = random_tensor<double>(c.w, seed++, -1, 1);
    Tensor dy = random_tensor<double>(ys, seed++, -1, 1);
    auto as_float = [](const Tensor& t) {
      Tensor f = Tensor::empty(DType::Float32, t.shape);
      for (int64_t i = 0; i < t.numel(); ++i) f.ptr<float>()[i] = static_cast<float>(t.ptr<double>()[i]);
      return f;
    };
    Node n = make_node("ConvGrad", 3, {{"pads", I{1, 1, 1, 1}}, {"strides", I{1, 1}}, {"group", c.group}}, "onnxtrain",
                       3);
    for (size_t i = 0; i < 3; ++i) n.outputs[i] = c.outs[i];
    std::vector<Tensor> d64 = test::run_node(n, 1, {dy, x, w});
    std::vector<Tensor> d32 = test::run_node(n, 1, {as_float(dy), as_float(x), as_float(w)});
    for (size_t o = 0; o < 3; ++o) {
      if (c.outs[o].empty()) continue;
      SCOPED_TRACE(c.outs[o]);
      ASSERT_EQ(d32.at(o).shape, d64.at(o).shape);
      for (int64_t i = 0; i < d64[o].numel(); ++i)
        ASSERT_NEAR(double(d32[o].ptr<float>()[i]), d64[o].ptr<double>()[i], 1e-4 * (1 + std::abs(d64[o].ptr<double>()[i])))
            << "element " << i;
    }
  }
}

TEST(Conv, BadGroupIsAnErrorNamingTheNode) {
  Tensor x = random_tensor<float>({1, 3, 4, 4}, 1, -1, 1), w = random_tensor<float>({4, 1, 3, 3}, 2, -1, 1);
  try {
    run_single(make_node("Conv", 2, {{"group", int64_t{2}}}), 17, {x, w});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("n_Conv"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("group"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace onnxtrain
