// The native bfloat16 GEMM (executor/cpu/bf16_gemm.h, AVX-512 BF16) and the bfloat16 MatMul/Gemm kernels built on
// it, against a float64 reference on the same bfloat16 inputs. The products of bfloat16 values are exact in
// float32 and the sums are float32, so each element must be within half an ulp of bfloat16 (2^-8 relative) of the
// exact result, the one rounding of the output, plus float32 accumulation error (K 2^-24 of the sum of |terms|).
// A kernel that rounded a partial sum, or the operands, to bfloat16 would not be. On a CPU without AVX-512 BF16 the
// native cases skip and the emulation (test_half_matmul.cpp) is what runs.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <random>

#include "common/test_env.h"
#include "executor/cpu/bf16_gemm.h"
#include "executor/half.h"
#include "executor/kernel_test_util.h"
#include "executor/plan_fusion.h"

namespace onnxtrain {
namespace {

using namespace test;

double bf(uint16_t v) { return BFloat16ToFloat{}(v); }

std::vector<uint16_t> random_bf16(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<uint16_t> v(n);
  for (uint16_t& x : v) x = FloatToBFloat16{}(u(rng));
  return v;
}

// |got - want| within the output's rounding and float32 accumulation over K terms whose |values| sum to abs_sum.
void expect_bf16_close(uint16_t got, double want, double abs_sum, int64_t K, const std::string& what) {
  const double tol = std::ldexp(1.0, -8) * std::abs(want) * (1 + 1e-3) + (K + 2) * std::ldexp(1.0, -24) * abs_sum + 1e-30;
  ASSERT_NEAR(bf(got), want, tol) << what;
}

// The parameter: OpenMP threads, and whether to use the vdpbf16ps kernel where the CPU also has AMX (each CPU runs
// the kernels it has; the AMX cases skip on a CPU without AMX).
struct Config {
  int threads;
  bool vector_kernel;
};

class Bf16Native : public ::testing::TestWithParam<Config> {
 protected:
  void SetUp() override {
    if (!cpu::bf16_native_supported()) GTEST_SKIP() << "this CPU has no AVX-512 BF16: " << cpu::bf16_path_description();
    if (!GetParam().vector_kernel && !cpu::bf16_amx_supported()) GTEST_SKIP() << "this CPU has no AMX-BF16";
    saved_ = omp_get_max_threads();
    omp_set_num_threads(GetParam().threads);
    cpu::force_bf16_avx512_kernel(GetParam().vector_kernel);
  }
  void TearDown() override {
    cpu::force_bf16_avx512_kernel(false);
    if (saved_) omp_set_num_threads(saved_);
  }
  int saved_ = 0;
};

// Operands stored row-major, transposed, or with neither stride 1 (every 3rd element of a wider buffer), over
// sizes that cover partial strips of rows (of 14 and of 32), panels of <= 16 and > 16 columns, more than one block
// of columns, odd K, K a multiple of 32 (A read in place by the AMX tiles) and not, and C broadcast as a row, a
// column, or in full.
TEST_P(Bf16Native, GemmMatchesFloat64OnEveryLayout) {
  struct Size {
    int64_t M, N, K;
  };
  const Size sizes[] = {{1, 1, 1},   {3, 5, 7},     {14, 32, 16},  {15, 33, 9},   {29, 17, 64},
                        {40, 530, 33}, {70, 20, 300}, {50, 40, 96}, {16, 70, 128}, {33, 1100, 40}};
  enum Layout { kRows, kCols, kStrided };
  uint32_t seed = 1;
  for (const Size& s : sizes)
    for (int la = kRows; la <= kStrided; ++la)
      for (int lb = kRows; lb <= kStrided; ++lb)
        for (int bias = 0; bias < 4; ++bias) {  // none, row [N], column [M, 1], full [M, N]
          const int64_t M = s.M, N = s.N, K = s.K;
          const int64_t step = 3;  // the strided layout's element spacing
          auto view = [&](const std::vector<uint16_t>& buf, int layout, int64_t rows, int64_t cols) {
            if (layout == kRows) return cpu::Bf16Matrix{buf.data(), cols, 1};
            if (layout == kCols) return cpu::Bf16Matrix{buf.data(), 1, rows};
            return cpu::Bf16Matrix{buf.data(), cols * step, step};
          };
          const std::vector<uint16_t> abuf = random_bf16(static_cast<size_t>(M * K * step), seed++);
          const std::vector<uint16_t> bbuf = random_bf16(static_cast<size_t>(K * N * step), seed++);
          const std::vector<uint16_t> cbuf = random_bf16(static_cast<size_t>(M * N), seed++);
          const cpu::Bf16Matrix a = view(abuf, la, M, K), b = view(bbuf, lb, K, N);
          cpu::Bf16Matrix c;
          if (bias == 1) c = {cbuf.data(), 0, 1};
          if (bias == 2) c = {cbuf.data(), 1, 0};
          if (bias == 3) c = {cbuf.data(), N, 1};
          const float alpha = bias ? 0.75f : 1.0f, beta = 1.5f;
          const int64_t ldy = N + 3;  // Y's rows apart by more than N: nothing may be written between them
          std::vector<uint16_t> y(static_cast<size_t>(M * ldy), 0x7FC0);  // NaN: every element must be written
          const int64_t off[3] = {0, 0, 0};
          cpu::bf16_gemm(M, N, K, a, b, alpha, c, beta, y.data(), ldy, off);
          const std::string what = "M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K) +
                                   " A layout " + std::to_string(la) + " B layout " + std::to_string(lb) + " bias " +
                                   std::to_string(bias);
          for (int64_t i = 0; i < M; ++i) {
            for (int64_t j = 0; j < N; ++j) {
              double sum = 0, abs_sum = 0;
              for (int64_t k = 0; k < K; ++k) {
                const double p = bf(a.p[i * a.rs + k * a.cs]) * bf(b.p[k * b.rs + j * b.cs]);
                sum += p;
                abs_sum += std::abs(p);
              }
              double want = alpha * sum;
              abs_sum *= std::abs(alpha);
              if (bias) {
                const double cv = beta * bf(c.p[i * c.rs + j * c.cs]);
                want += cv;
                abs_sum += std::abs(cv);
              }
              expect_bf16_close(y[static_cast<size_t>(i * ldy + j)], want, abs_sum, K,
                                what + " element (" + std::to_string(i) + ", " + std::to_string(j) + ")");
            }
            for (int64_t j = N; j < ldy && i + 1 < M; ++j)
              ASSERT_EQ(y[static_cast<size_t>(i * ldy + j)], 0x7FC0) << what << ": wrote past row " << i;
          }
        }
}

// A batch of products at their own offsets: fewer products than threads (each split across the threads) and more
// (one per thread), the way attention's heads come.
TEST_P(Bf16Native, BatchOfProductsAtOffsets) {
  for (const int64_t count : {1, 3, 16}) {
    const int64_t M = 20, N = 24, K = 18;
    const std::vector<uint16_t> abuf = random_bf16(static_cast<size_t>(count * M * K), 5);
    const std::vector<uint16_t> bbuf = random_bf16(static_cast<size_t>(K * N), 6);  // shared by the batch
    std::vector<uint16_t> y(static_cast<size_t>(count * M * N), 0x7FC0);
    std::vector<int64_t> off;
    for (int64_t t = 0; t < count; ++t) off.insert(off.end(), {t * M * K, 0, t * M * N});
    cpu::bf16_gemm(M, N, K, {abuf.data(), K, 1}, {bbuf.data(), N, 1}, 1.0f, {}, 0.0f, y.data(), N, off);
    for (int64_t t = 0; t < count; ++t)
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) {
          double sum = 0, abs_sum = 0;
          for (int64_t k = 0; k < K; ++k) {
            const double p = bf(abuf[static_cast<size_t>(t * M * K + i * K + k)]) * bf(bbuf[static_cast<size_t>(k * N + j)]);
            sum += p;
            abs_sum += std::abs(p);
          }
          expect_bf16_close(y[static_cast<size_t>(t * M * N + i * N + j)], sum, abs_sum, K,
                            "batch of " + std::to_string(count) + ", product " + std::to_string(t));
        }
  }
}

// NaN and infinity in an operand reach the output as they do in float32 (NaN stays NaN when rounded).
TEST_P(Bf16Native, NonFiniteOperandsPropagate) {
  std::vector<uint16_t> a(4 * 6, FloatToBFloat16{}(1.0f)), b(6 * 5, FloatToBFloat16{}(0.5f));
  a[0] = 0x7FC0;                                               // NaN in row 0
  a[6] = FloatToBFloat16{}(std::numeric_limits<float>::infinity());  // +inf in row 1
  std::vector<uint16_t> y(4 * 5);
  const int64_t off[3] = {0, 0, 0};
  cpu::bf16_gemm(4, 5, 6, {a.data(), 6, 1}, {b.data(), 5, 1}, 1.0f, {}, 0.0f, y.data(), 5, off);
  for (int64_t j = 0; j < 5; ++j) {
    EXPECT_TRUE(std::isnan(bf(y[static_cast<size_t>(j)])));
    EXPECT_EQ(bf(y[static_cast<size_t>(5 + j)]), std::numeric_limits<double>::infinity());
    EXPECT_EQ(bf(y[static_cast<size_t>(10 + j)]), 3.0);
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, Bf16Native,
                         ::testing::Values(Config{1, false}, Config{2, false}, Config{1, true}, Config{2, true}),
                         [](const ::testing::TestParamInfo<Config>& i) {
                           return std::string(i.param.vector_kernel ? "vdpbf16ps_" : "amx_") +
                                  std::to_string(i.param.threads) + "_threads";
                         });

Tensor bf16_tensor(std::vector<int64_t> shape, uint32_t seed) {
  Tensor t = Tensor::empty(DType::BFloat16, shape);
  const std::vector<uint16_t> v = random_bf16(static_cast<size_t>(t.numel()), seed);
  std::copy(v.begin(), v.end(), t.ptr<uint16_t>());
  return t;
}

// The bfloat16 MatMul with the Transposes the plan folds into it (onnxtrain.perm_a/perm_b/perm_y), which the native
// kernel reads and writes in place, against the same MatMul with the transposes done first; and the native and
// emulated kernels agree within the output's rounding.
TEST(Bf16MatMul, FoldedTransposesAndBothPathsMatchFloat64) {
  if (!cpu::bf16_native_supported()) GTEST_SKIP() << cpu::bf16_path_description();
  // A stored [2, 5, 3, 4] read as perm (0, 2, 3, 1) -> [2, 3, 4, 5]; B stored [2, 3, 6, 5] read as (0, 1, 3, 2)
  // -> [2, 3, 5, 6]; Y [2, 3, 4, 6] written as perm (0, 2, 1, 3) -> [2, 4, 3, 6].
  const Tensor a = bf16_tensor({2, 5, 3, 4}, 31), b = bf16_tensor({2, 3, 6, 5}, 32);
  Node n = make_node("MatMul", 2);
  n.attributes[kMatMulPermA] = std::vector<int64_t>{0, 2, 3, 1};
  n.attributes[kMatMulPermB] = std::vector<int64_t>{0, 1, 3, 2};
  n.attributes[kMatMulPermY] = std::vector<int64_t>{0, 2, 1, 3};
  const Tensor y = run_single(n, 13, {a, b});
  ASSERT_EQ(y.dtype, DType::BFloat16);
  ASSERT_EQ(y.shape, (std::vector<int64_t>{2, 4, 3, 6}));
  auto A = [&](int64_t b0, int64_t h, int64_t i, int64_t k) { return bf(a.ptr<uint16_t>()[((b0 * 5 + k) * 3 + h) * 4 + i]); };
  auto B = [&](int64_t b0, int64_t h, int64_t k, int64_t j) { return bf(b.ptr<uint16_t>()[((b0 * 3 + h) * 6 + j) * 5 + k]); };
  for (int64_t b0 = 0; b0 < 2; ++b0)
    for (int64_t h = 0; h < 3; ++h)
      for (int64_t i = 0; i < 4; ++i)
        for (int64_t j = 0; j < 6; ++j) {
          double sum = 0, abs_sum = 0;
          for (int64_t k = 0; k < 5; ++k) {
            sum += A(b0, h, i, k) * B(b0, h, k, j);
            abs_sum += std::abs(A(b0, h, i, k) * B(b0, h, k, j));
          }
          expect_bf16_close(y.ptr<uint16_t>()[((b0 * 4 + i) * 3 + h) * 6 + j], sum, abs_sum, 5, "permuted MatMul");
        }

  // The emulation (widen, float32 GEMM, round once) on the same plain product: both round the same float32-
  // accumulated sums once, so they differ by at most one bfloat16 ulp (the sums' order differs).
  const Tensor p = bf16_tensor({3, 40, 70}, 33), q = bf16_tensor({70, 50}, 34);
  const Tensor native = run_single(make_node("MatMul", 2), 13, {p, q});
  cpu::force_bf16_emulation(true);
  EXPECT_NE(cpu::bf16_path_description().find("emulation"), std::string::npos);
  const Tensor emulated = run_single(make_node("MatMul", 2), 13, {p, q});
  cpu::force_bf16_emulation(false);
  EXPECT_NE(cpu::bf16_path_description().find("native"), std::string::npos);
  ASSERT_EQ(native.shape, emulated.shape);
  for (int64_t i = 0; i < native.numel(); ++i) {
    const double x = bf(native.ptr<uint16_t>()[i]), e = bf(emulated.ptr<uint16_t>()[i]);
    ASSERT_LE(std::abs(x - e), std::ldexp(std::abs(e), -7) + 1e-6) << "element " << i;
  }
}

// Bad shapes fail naming the node and both shapes, on the native path as on the float32 one.
TEST(Bf16MatMul, MismatchedShapesFailNamingThem) {
  const Tensor a = bf16_tensor({2, 3}, 1), b = bf16_tensor({4, 2}, 2);
  const std::string err = error_of([&] { run_single(make_node("MatMul", 2), 13, {a, b}); });
  EXPECT_NE(err.find("[2,3]"), std::string::npos) << err;
  EXPECT_NE(err.find("[4,2]"), std::string::npos) << err;
}

}  // namespace
}  // namespace onnxtrain
