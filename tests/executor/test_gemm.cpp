// onnxtrain's own float32 GEMM (executor/cpu/gemm.h) against a float64 reference: every pair of transposes, row
// and column counts around the 14 x 32 tile and the 512-column block, K across the 256-step blocks, padded
// leading dimensions, alpha and beta, on one and two threads. Each element must be within float32's accumulation
// bound of the exact product, and C's padding (between ldc and N) must come back untouched.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "executor/cpu/gemm.h"
#include "kernel_test_util.h"

namespace onnxtrain {
namespace {

struct Shape {
  int64_t M, N, K;
};

// Tails of every blocking level: 1, 13/14/15 rows (tile 14), 15/16/17 and 31/32/33 columns (two 16-lane vectors),
// 600 and 1100 columns (512-column blocks), K 255/256/257 and 600 (256-step blocks).
const Shape kShapes[] = {{1, 1, 1},     {13, 31, 7},    {14, 32, 256}, {15, 33, 257}, {29, 100, 600},
                         {100, 17, 513}, {3, 600, 40},  {20, 1100, 30}, {64, 16, 255}, {130, 15, 9}};

struct Operands {
  std::vector<float> a, b, c;
  int64_t lda, ldb, ldc;
};

// Stored A is [M, K] or, transposed, [K, M]; the same for B. Leading dimensions are padded by `pad` elements.
Operands make(const Shape& s, bool ta, bool tb, int64_t pad, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Operands o;
  o.lda = (ta ? s.M : s.K) + pad;
  o.ldb = (tb ? s.K : s.N) + pad;
  o.ldc = s.N + pad;
  o.a.resize(static_cast<size_t>((ta ? s.K : s.M) * o.lda));
  o.b.resize(static_cast<size_t>((tb ? s.N : s.K) * o.ldb));
  o.c.resize(static_cast<size_t>(s.M * o.ldc));
  for (float& v : o.a) v = u(rng);
  for (float& v : o.b) v = u(rng);
  for (float& v : o.c) v = u(rng);
  return o;
}

void check(const Shape& s, bool ta, bool tb, int64_t pad, float alpha, float beta, bool nan_c) {
  Operands o = make(s, ta, tb, pad, static_cast<uint32_t>(s.M * 131 + s.N * 7 + s.K));
  if (nan_c)
    for (int64_t i = 0; i < s.M; ++i)
      for (int64_t j = 0; j < s.N; ++j)
        o.c[static_cast<size_t>(i * o.ldc + j)] = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> c0 = o.c;
  cpu::own_sgemm(ta, tb, s.M, s.N, s.K, alpha, o.a.data(), o.lda, o.b.data(), o.ldb, beta, o.c.data(), o.ldc);
  const double u = std::ldexp(1.0, -24);
  int bad = 0;
  for (int64_t i = 0; i < s.M; ++i) {
    for (int64_t j = 0; j < o.ldc; ++j) {
      const size_t at = static_cast<size_t>(i * o.ldc + j);
      if (j >= s.N) {  // padding between rows
        if (o.c[at] != c0[at] && bad++ < 5) ADD_FAILURE() << "padding C[" << i << "," << j << "] was written";
        continue;
      }
      double exact = 0, abs_sum = 0;
      for (int64_t k = 0; k < s.K; ++k) {
        const double x = o.a[static_cast<size_t>(ta ? k * o.lda + i : i * o.lda + k)];
        const double y = o.b[static_cast<size_t>(tb ? j * o.ldb + k : k * o.ldb + j)];
        exact += x * y;
        abs_sum += std::abs(x * y);
      }
      exact *= alpha;
      abs_sum *= std::abs(alpha);
      if (beta != 0.0f) {
        exact += double(beta) * c0[at];
        abs_sum += std::abs(double(beta) * c0[at]);
      }
      // A sum of K + 1 float32 terms, scaled twice: (K + 4) u of the sum of |terms| bounds the rounding.
      const double tol = double(s.K + 4) * u * abs_sum + 1e-30;
      if (!(std::abs(o.c[at] - exact) <= tol) && bad++ < 5)
        ADD_FAILURE() << "C[" << i << "," << j << "] = " << o.c[at] << ", expected " << exact << " (tolerance " << tol
                      << ")";
    }
  }
}

class OwnSgemm : public test::ThreadsTest {
 protected:
  void SetUp() override {
    if (!cpu::own_sgemm_available()) GTEST_SKIP() << "this build has no AVX-512 GEMM (MatMul uses dnnl_sgemm)";
    ThreadsTest::SetUp();
  }
};

TEST_P(OwnSgemm, MatchesFloat64ReferenceForEveryTransposeAndTail) {
  for (const Shape& s : kShapes)
    for (int t = 0; t < 4; ++t) {
      const bool ta = t & 1, tb = t & 2;
      SCOPED_TRACE("M=" + std::to_string(s.M) + " N=" + std::to_string(s.N) + " K=" + std::to_string(s.K) +
                   (ta ? " A^T" : " A") + (tb ? " B^T" : " B"));
      check(s, ta, tb, 0, 1.0f, 0.0f, false);
      check(s, ta, tb, 5, 1.0f, 0.0f, false);  // padded rows: strided reads, masked writes
    }
}

TEST_P(OwnSgemm, AppliesAlphaAndBeta) {
  for (const Shape& s : kShapes) {
    SCOPED_TRACE("M=" + std::to_string(s.M) + " N=" + std::to_string(s.N) + " K=" + std::to_string(s.K));
    check(s, false, false, 3, 0.5f, 2.0f, false);
    check(s, true, false, 0, -1.5f, 1.0f, false);  // beta 1: weight gradients accumulating
    check(s, false, true, 0, 2.0f, -0.25f, false);
  }
}

TEST_P(OwnSgemm, BetaZeroNeverReadsC) {
  for (const Shape& s : kShapes) {
    SCOPED_TRACE("M=" + std::to_string(s.M) + " N=" + std::to_string(s.N) + " K=" + std::to_string(s.K));
    check(s, false, false, 2, 1.0f, 0.0f, true);
    check(s, true, true, 0, 0.5f, 0.0f, true);
  }
}

TEST_P(OwnSgemm, EmptySumScalesC) {
  Operands o = make({3, 5, 0}, false, false, 1, 9);
  const std::vector<float> c0 = o.c;
  cpu::own_sgemm(false, false, 3, 5, 0, 1.0f, o.a.data(), 1, o.b.data(), 5, 3.0f, o.c.data(), o.ldc);
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 6; ++j) {
      const size_t at = static_cast<size_t>(i * o.ldc + j);
      EXPECT_EQ(o.c[at], j < 5 ? 3.0f * c0[at] : c0[at]) << i << "," << j;
    }
  std::vector<float> nan(4, std::numeric_limits<float>::quiet_NaN());
  cpu::own_sgemm(false, false, 2, 2, 0, 1.0f, nullptr, 1, nullptr, 2, 0.0f, nan.data(), 2);
  for (float v : nan) EXPECT_EQ(v, 0.0f);
}

INSTANTIATE_TEST_SUITE_P(Threads, OwnSgemm, ::testing::Values(1, 2), test::threads_name);

}  // namespace
}  // namespace onnxtrain
