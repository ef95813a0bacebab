// onnxtrain's own float32 convolutions (executor/cpu/direct_conv.h) against float64 loops written from the
// definition: forward, backward data and backward weights (with the bias gradient), over geometries that reach
// every tail of the 14-pixel x 32-channel tile, strides, dilations, asymmetric pads, groups, 1-D to 3-D, and a
// single image (whose rows are split across threads), on one and two threads. Each element must be within
// float32's accumulation bound: (terms + 4) u times the sum of the terms' magnitudes (the same loops on |x|, |w|).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "executor/cpu/direct_conv.h"
#include "kernel_test_util.h"

namespace onnxtrain {
namespace {

using cpu::Dims3;
using cpu::Geo;

struct Case {
  const char* name;
  int64_t N, C, M, G;
  size_t rank;
  Dims3 in, k, s, d, pb, pe;
  bool forward, data, weights;  // which directions the kernels take
};

// Spatial dims are right-aligned into three, as conv_geometry does (unused leading dims are 1). Forward and
// backward weights need 8 output channels per group, backward data 8 input channels; a depthwise convolution
// (groups = channels in = channels out) needs 8 channels. Backward data runs the
// flipped kernel for stride 1 and begin pads within the dilated kernel, else the scatter path: both are checked here
// (strided, wide_pads, three_d and strided_pointwise_groups take the scatter path).
const Case kCases[] = {
    {"w2_conv2", 3, 16, 32, 1, 2, {1, 14, 14}, {1, 3, 3}, {1, 1, 1}, {1, 1, 1}, {0, 1, 1}, {0, 1, 1}, 1, 1, 1},
    {"w2_conv1", 2, 1, 16, 1, 2, {1, 28, 28}, {1, 3, 3}, {1, 1, 1}, {1, 1, 1}, {0, 1, 1}, {0, 1, 1}, 1, 0, 1},
    {"channel_tails", 2, 9, 9, 1, 2, {1, 9, 11}, {1, 3, 3}, {1, 1, 1}, {1, 1, 1}, {0, 1, 1}, {0, 1, 1}, 1, 1, 1},
    {"two_panels_pixel_tail", 2, 17, 33, 1, 2, {1, 7, 20}, {1, 3, 3}, {1, 1, 1}, {1, 1, 1}, {0, 1, 1}, {0, 1, 1},
     1, 1, 1},
    {"strided_dilated_asymmetric", 2, 8, 12, 1, 2, {1, 11, 13}, {1, 3, 2}, {1, 2, 3}, {1, 1, 2}, {0, 1, 0},
     {0, 2, 1}, 1, 1, 1},
    {"dilated", 2, 10, 14, 1, 2, {1, 10, 12}, {1, 3, 3}, {1, 1, 1}, {1, 2, 2}, {0, 2, 1}, {0, 1, 2}, 1, 1, 1},
    {"groups", 2, 16, 24, 2, 2, {1, 6, 9}, {1, 3, 3}, {1, 1, 1}, {1, 1, 1}, {0, 1, 1}, {0, 1, 1}, 1, 1, 1},
    {"one_d", 3, 8, 20, 1, 1, {1, 1, 30}, {1, 1, 5}, {1, 1, 1}, {1, 1, 1}, {0, 0, 2}, {0, 0, 2}, 1, 1, 1},
    {"three_d", 2, 8, 8, 1, 3, {4, 5, 6}, {3, 3, 3}, {1, 2, 1}, {1, 1, 1}, {1, 1, 1}, {1, 1, 1}, 1, 1, 1},
    {"three_d_stride1", 2, 8, 9, 1, 3, {3, 4, 5}, {2, 3, 3}, {1, 1, 1}, {1, 1, 1}, {1, 1, 1}, {0, 1, 1}, 1, 1, 1},
    {"pointwise", 2, 48, 64, 1, 2, {1, 5, 6}, {1, 1, 1}, {1, 1, 1}, {1, 1, 1}, {0, 0, 0}, {0, 0, 0}, 1, 1, 1},
    {"single_image", 1, 16, 32, 1, 2, {1, 12, 15}, {1, 3, 3}, {1, 1, 1}, {1, 1, 1}, {0, 1, 1}, {0, 1, 1}, 1, 1, 1},
    {"wide_pads", 2, 8, 9, 1, 2, {1, 5, 5}, {1, 3, 3}, {1, 1, 1}, {1, 1, 1}, {0, 3, 2}, {0, 4, 3}, 1, 1, 1},
    {"wide_end_pads", 2, 8, 9, 1, 2, {1, 5, 5}, {1, 3, 3}, {1, 1, 1}, {1, 1, 1}, {0, 1, 0}, {0, 4, 3}, 1, 1, 1},
    {"few_channels", 2, 3, 5, 1, 2, {1, 9, 11}, {1, 3, 3}, {1, 1, 1}, {1, 1, 1}, {0, 1, 1}, {0, 1, 1}, 0, 0, 0},
    // Depthwise (one channel per group): vectors along the channels, 8 pixels a tile, dW by tiles of 12 taps.
    {"depthwise", 2, 16, 16, 16, 2, {1, 8, 8}, {1, 3, 3}, {1, 1, 1}, {1, 1, 1}, {0, 1, 1}, {0, 1, 1}, 1, 1, 1},
    {"depthwise_channel_tail_5x5", 2, 20, 20, 20, 2, {1, 9, 11}, {1, 5, 5}, {1, 1, 1}, {1, 1, 1}, {0, 2, 2},
     {0, 2, 2}, 1, 1, 1},
    {"depthwise_strided", 2, 24, 24, 24, 2, {1, 11, 12}, {1, 3, 3}, {1, 2, 2}, {1, 1, 1}, {0, 1, 1}, {0, 1, 0},
     1, 1, 1},
    {"depthwise_dilated_asymmetric", 2, 8, 8, 8, 2, {1, 10, 13}, {1, 3, 2}, {1, 1, 3}, {1, 2, 2}, {0, 2, 0},
     {0, 1, 1}, 1, 1, 1},
    {"depthwise_single_image_wide_pads", 1, 33, 33, 33, 2, {1, 6, 7}, {1, 3, 3}, {1, 1, 1}, {1, 1, 1}, {0, 3, 1},
     {0, 1, 3}, 1, 1, 1},
    {"depthwise_one_d", 3, 16, 16, 16, 1, {1, 1, 25}, {1, 1, 7}, {1, 1, 1}, {1, 1, 1}, {0, 0, 3}, {0, 0, 3}, 1, 1, 1},
    {"depthwise_few_channels", 2, 4, 4, 4, 2, {1, 8, 8}, {1, 3, 3}, {1, 1, 1}, {1, 1, 1}, {0, 1, 1}, {0, 1, 1}, 0, 0,
     0},
    {"depthwise_rows_strided", 2, 16, 16, 16, 2, {1, 9, 20}, {1, 3, 3}, {1, 2, 1}, {1, 1, 1}, {0, 1, 1}, {0, 1, 1},
     1, 1, 1},  // backward data scatters along unit-stride rows
    {"depthwise_three_d", 2, 8, 8, 8, 3, {4, 5, 6}, {3, 3, 3}, {1, 2, 2}, {1, 1, 1}, {1, 1, 1}, {1, 1, 1}, 1, 1, 1},
    {"depthwise_wide_rows_strided", 1, 8, 8, 8, 2, {1, 3, 70}, {1, 3, 3}, {1, 1, 2}, {1, 1, 1}, {0, 1, 1}, {0, 1, 1},
     1, 1, 1},  // 35 pixels a row: four tiles of 8 and a tail of 3
    {"depthwise_multiplier_2", 2, 4, 8, 4, 2, {1, 8, 8}, {1, 3, 3}, {1, 1, 1}, {1, 1, 1}, {0, 1, 1}, {0, 1, 1}, 0, 0,
     0},  // two output channels per group: neither depthwise nor 8 per group
    {"one_channel_pointwise", 2, 1, 16, 1, 2, {1, 5, 7}, {1, 1, 1}, {1, 1, 1}, {1, 1, 1}, {0, 0, 0}, {0, 0, 0}, 1, 0,
     1},
    {"strided_pointwise_groups", 2, 40, 32, 2, 2, {1, 10, 10}, {1, 1, 1}, {1, 2, 2}, {1, 1, 1}, {0, 0, 0}, {0, 0, 0},
     1, 1, 1},  // the last input row and column are in no window
};

Geo geometry(const Case& c) {
  Geo g;
  g.N = c.N, g.C = c.C, g.M = c.M, g.G = c.G, g.rank = c.rank;
  g.in = c.in, g.k = c.k, g.s = c.s, g.d = c.d, g.pb = c.pb, g.pe = c.pe;
  for (int i = 0; i < cpu::kMaxSpatial; ++i)
    g.out[i] = (c.in[i] + c.pb[i] + c.pe[i] - (c.k[i] - 1) * c.d[i] - 1) / c.s[i] + 1;
  return g;
}

// Calls f(n, m, c, x offset within the image, w offset, y offset within the image) for every term of the sum.
template <class F> void for_each_term(const Geo& g, F&& f) {
  const int64_t cg = g.C / g.G, mg = g.M / g.G;
  for (int64_t n = 0; n < g.N; ++n)
    for (int64_t m = 0; m < g.M; ++m)
      for (int64_t ci = 0; ci < cg; ++ci) {
        const int64_t c = m / mg * cg + ci;
        for (int64_t o0 = 0; o0 < g.out[0]; ++o0)
          for (int64_t o1 = 0; o1 < g.out[1]; ++o1)
            for (int64_t o2 = 0; o2 < g.out[2]; ++o2)
              for (int64_t j0 = 0; j0 < g.k[0]; ++j0)
                for (int64_t j1 = 0; j1 < g.k[1]; ++j1)
                  for (int64_t j2 = 0; j2 < g.k[2]; ++j2) {
                    const int64_t i0 = o0 * g.s[0] - g.pb[0] + j0 * g.d[0];
                    const int64_t i1 = o1 * g.s[1] - g.pb[1] + j1 * g.d[1];
                    const int64_t i2 = o2 * g.s[2] - g.pb[2] + j2 * g.d[2];
                    if (i0 < 0 || i0 >= g.in[0] || i1 < 0 || i1 >= g.in[1] || i2 < 0 || i2 >= g.in[2]) continue;
                    const int64_t xi = ((n * g.C + c) * g.in[0] + i0) * g.in[1] * g.in[2] + i1 * g.in[2] + i2;
                    const int64_t wi = ((m * cg + ci) * g.k[0] + j0) * g.k[1] * g.k[2] + j1 * g.k[2] + j2;
                    const int64_t yi = ((n * g.M + m) * g.out[0] + o0) * g.out[1] * g.out[2] + o1 * g.out[2] + o2;
                    f(m, xi, wi, yi);
                  }
      }
}

std::vector<float> random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& e : v) e = u(rng);
  return v;
}

// got within (terms + 4) u * magnitude of want, element by element.
void expect_close(const std::vector<float>& got, const std::vector<double>& want, const std::vector<double>& mag,
                  int64_t terms, const std::string& what) {
  const double u = std::ldexp(1.0, -24);
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double bound = static_cast<double>(terms + 4) * u * mag[i] + 1e-30;
    if (!(std::abs(got[i] - want[i]) <= bound) && ++bad <= 5)
      ADD_FAILURE() << what << "[" << i << "] = " << got[i] << ", expected " << want[i] << " (bound " << bound << ")";
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " elements off";
}

class DirectConvTest : public test::ThreadsTest {
 protected:
  void SetUp() override {
    if (!cpu::DirectConv::supports_forward(geometry(kCases[0])))
      GTEST_SKIP() << "this build has no AVX-512 convolutions (Conv uses oneDNN)";
    ThreadsTest::SetUp();
  }
};

TEST_P(DirectConvTest, ForwardMatchesFloat64Reference) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    const Geo g = geometry(c);
    ASSERT_EQ(cpu::DirectConv::supports_forward(g), c.forward);
    if (!c.forward) continue;
    const int64_t cg = g.C / g.G;
    const auto x = random(static_cast<size_t>(g.N * g.C * g.in_size()), 1);
    const auto w = random(static_cast<size_t>(g.M * cg * g.k_size()), 2);
    const auto b = random(static_cast<size_t>(g.M), 3);
    std::vector<float> y(static_cast<size_t>(g.N * g.M * g.out_size()), 7.0f);
    cpu::DirectConv conv(g);
    conv.forward(x.data(), w.data(), b.data(), y.data());
    std::vector<double> want(y.size()), mag(y.size());
    for (size_t i = 0; i < y.size(); ++i) {
      const size_t m = i / static_cast<size_t>(g.out_size()) % static_cast<size_t>(g.M);
      want[i] = b[m];
      mag[i] = std::abs(b[m]);
    }
    for_each_term(g, [&](int64_t, int64_t xi, int64_t wi, int64_t yi) {
      want[yi] += double(x[xi]) * w[wi];
      mag[yi] += std::abs(double(x[xi]) * w[wi]);
    });
    expect_close(y, want, mag, cg * g.k_size(), "y");
    // Without a bias.
    conv.forward(x.data(), w.data(), nullptr, y.data());
    for (size_t i = 0; i < y.size(); ++i) {
      const size_t m = i / static_cast<size_t>(g.out_size()) % static_cast<size_t>(g.M);
      want[i] -= b[m];
    }
    expect_close(y, want, mag, cg * g.k_size(), "y without bias");
  }
}

TEST_P(DirectConvTest, BackwardDataMatchesFloat64Reference) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    const Geo g = geometry(c);
    ASSERT_EQ(cpu::DirectConv::supports_backward_data(g), c.data);
    if (!c.data) continue;
    const int64_t cg = g.C / g.G, mg = g.M / g.G;
    const auto dy = random(static_cast<size_t>(g.N * g.M * g.out_size()), 4);
    const auto w = random(static_cast<size_t>(g.M * cg * g.k_size()), 5);
    std::vector<float> dx(static_cast<size_t>(g.N * g.C * g.in_size()), 7.0f);
    cpu::DirectConv conv(g);
    conv.backward_data(dy.data(), w.data(), dx.data());
    std::vector<double> want(dx.size()), mag(dx.size());
    for_each_term(g, [&](int64_t, int64_t xi, int64_t wi, int64_t yi) {
      want[xi] += double(dy[yi]) * w[wi];
      mag[xi] += std::abs(double(dy[yi]) * w[wi]);
    });
    expect_close(dx, want, mag, mg * g.k_size(), "dx");
  }
}

TEST_P(DirectConvTest, BackwardWeightsAndBiasMatchFloat64Reference) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    const Geo g = geometry(c);
    ASSERT_EQ(cpu::DirectConv::supports_backward_weights(g), c.weights);
    if (!c.weights) continue;
    const int64_t cg = g.C / g.G;
    const auto dy = random(static_cast<size_t>(g.N * g.M * g.out_size()), 6);
    const auto x = random(static_cast<size_t>(g.N * g.C * g.in_size()), 7);
    std::vector<float> dw(static_cast<size_t>(g.M * cg * g.k_size()), 7.0f), db(static_cast<size_t>(g.M), 7.0f);
    cpu::DirectConv conv(g);
    conv.backward_weights(dy.data(), x.data(), dw.data(), db.data());
    std::vector<double> want(dw.size()), mag(dw.size()), want_b(db.size()), mag_b(db.size());
    for_each_term(g, [&](int64_t, int64_t xi, int64_t wi, int64_t yi) {
      want[wi] += double(dy[yi]) * x[xi];
      mag[wi] += std::abs(double(dy[yi]) * x[xi]);
    });
    for (size_t i = 0; i < dy.size(); ++i) {
      const size_t m = i / static_cast<size_t>(g.out_size()) % static_cast<size_t>(g.M);
      want_b[m] += dy[i];
      mag_b[m] += std::abs(dy[i]);
    }
    expect_close(dw, want, mag, g.N * g.out_size(), "dw");
    expect_close(db, want_b, mag_b, g.N * g.out_size(), "db");
    // Either output alone.
    std::fill(dw.begin(), dw.end(), 7.0f);
    conv.backward_weights(dy.data(), x.data(), dw.data(), nullptr);
    expect_close(dw, want, mag, g.N * g.out_size(), "dw alone");
    std::fill(db.begin(), db.end(), 7.0f);
    conv.backward_weights(dy.data(), x.data(), nullptr, db.data());
    expect_close(db, want_b, mag_b, g.N * g.out_size(), "db alone");
  }
}

// ConvGrad asks for dX, dW and dB in one pass over the images: the same numbers as each direction alone.
TEST_P(DirectConvTest, AllGradientsInOnePassMatchEachDirectionAlone) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    if (!c.data || !c.weights) continue;
    const Geo g = geometry(c);
    const int64_t cg = g.C / g.G;
    const auto dy = random(static_cast<size_t>(g.N * g.M * g.out_size()), 8);
    const auto x = random(static_cast<size_t>(g.N * g.C * g.in_size()), 9);
    const auto w = random(static_cast<size_t>(g.M * cg * g.k_size()), 10);
    std::vector<float> dx(x.size()), dw(w.size()), db(static_cast<size_t>(g.M));
    std::vector<float> dx1(x.size()), dw1(w.size()), db1(static_cast<size_t>(g.M));
    cpu::DirectConv conv(g);
    conv.backward(dy.data(), x.data(), w.data(), dx.data(), dw.data(), db.data());
    conv.backward_data(dy.data(), w.data(), dx1.data());
    conv.backward_weights(dy.data(), x.data(), dw1.data(), db1.data());
    EXPECT_EQ(dx, dx1);
    EXPECT_EQ(dw, dw1);
    EXPECT_EQ(db, db1);
  }
}

// What a ConvGrad node may ask of it: exactly the directions it wants.
TEST_P(DirectConvTest, TakesABackwardPassWhenEveryWantedDirectionIsTaken) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    const Geo g = geometry(c);
    for (int want = 0; want < 4; ++want) {
      const bool dx = want & 1, dw = want & 2;
      EXPECT_EQ(cpu::DirectConv::supports_backward(g, dx, dw), (!dx || c.data) && (!dw || c.weights)) << dx << dw;
    }
  }
}

TEST(DirectConv, RefusesNegativePads) {
  Geo g = geometry(kCases[0]);
  g.pb[2] = -1;
  EXPECT_FALSE(cpu::DirectConv::supports_forward(g));
  EXPECT_FALSE(cpu::DirectConv::supports_backward_data(g));
  EXPECT_FALSE(cpu::DirectConv::supports_backward_weights(g));
  EXPECT_FALSE(cpu::DirectConv::supports_backward(g, false, false));
}

INSTANTIATE_TEST_SUITE_P(Threads, DirectConvTest, ::testing::Values(1, 2), test::threads_name);

}  // namespace
}  // namespace onnxtrain
