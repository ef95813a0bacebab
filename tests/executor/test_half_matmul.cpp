// The float16/bfloat16 MatMul and Gemm kernels (mixed precision) against a float64 reference on the same
// half-precision inputs. The kernels accumulate in float32 and round the result once, so each element must be
// within half an ulp of the half type (relative 2^-11 for float16, 2^-8 for bfloat16) of the exact product,
// plus float32 accumulation error; a kernel that rounded operands of the sum or the result twice would not be.
#include <gtest/gtest.h>

#include <cmath>

#include "common/test_env.h"
#include "executor/half.h"
#include "executor/kernel_test_util.h"

namespace onnxtrain {
namespace {

using namespace test;

Tensor to_half(const Tensor& f, DType t) {
  Tensor h = Tensor::empty(t, f.shape);
  for (int64_t i = 0; i < f.numel(); ++i)
    h.ptr<uint16_t>()[i] = t == DType::Float16 ? FloatToHalf{}(f.ptr<float>()[i]) : FloatToBFloat16{}(f.ptr<float>()[i]);
  return h;
}

double value(const Tensor& h, int64_t i) {
  const uint16_t v = h.ptr<uint16_t>()[i];
  return h.dtype == DType::Float16 ? HalfToFloat{}(v) : BFloat16ToFloat{}(v);
}

Tensor random_half(std::vector<int64_t> shape, uint32_t seed, DType t) {
  return to_half(random_tensor<float>(std::move(shape), seed, -2.0, 2.0), t);
}

// Reference element and the sum of |terms| it came from (for the float32 accumulation bound).
struct Ref {
  std::vector<double> y, abs_sum;
};

void expect_close(const Tensor& got, const Ref& ref, const std::string& what) {
  ASSERT_EQ(got.numel(), static_cast<int64_t>(ref.y.size())) << what;
  const double half_ulp = got.dtype == DType::Float16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
  for (size_t i = 0; i < ref.y.size(); ++i) {
    const double tol = half_ulp * std::abs(ref.y[i]) * (1 + 1e-3) + 1e-6 * ref.abs_sum[i] + 1e-7;
    EXPECT_NEAR(value(got, static_cast<int64_t>(i)), ref.y[i], tol) << what << " element " << i;
  }
}

const DType kHalves[] = {DType::Float16, DType::BFloat16};

TEST(HalfMatMul, GemmEveryTransposeAndBiasMatchesFloat64) {
  const int64_t M = 7, N = 5, K = 9;
  for (DType t : kHalves)
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb)
        for (int bias = 0; bias < 3; ++bias) {  // none, [N], [M, 1]
          const float alpha = 0.75f, beta = bias ? 1.5f : 1.0f;
          const Tensor a = random_half(ta ? std::vector<int64_t>{K, M} : std::vector<int64_t>{M, K}, 1, t);
          const Tensor b = random_half(tb ? std::vector<int64_t>{N, K} : std::vector<int64_t>{K, N}, 2, t);
          const Tensor c = random_half(bias == 1 ? std::vector<int64_t>{N} : std::vector<int64_t>{M, 1}, 3, t);
          const Node n = make_node("Gemm", bias ? 3 : 2,
                                   {{"transA", int64_t{ta}}, {"transB", int64_t{tb}}, {"alpha", alpha}, {"beta", beta}});
          const Tensor y = bias ? run_single(n, 13, {a, b, c}) : run_single(n, 13, {a, b});
          ASSERT_EQ(y.dtype, t);
          ASSERT_EQ(y.shape, (std::vector<int64_t>{M, N}));
          Ref ref;
          for (int64_t i = 0; i < M; ++i)
            for (int64_t j = 0; j < N; ++j) {
              double s = 0, as = 0;
              for (int64_t k = 0; k < K; ++k) {
                const double p = value(a, ta ? k * M + i : i * K + k) * value(b, tb ? j * K + k : k * N + j);
                s += p;
                as += std::abs(p);
              }
              double y_ij = alpha * s;
              if (bias) y_ij += beta * value(c, bias == 1 ? j : i);
              ref.y.push_back(y_ij);
              ref.abs_sum.push_back(std::abs(alpha) * as + (bias ? std::abs(beta * value(c, bias == 1 ? j : i)) : 0));
            }
          expect_close(y, ref, dtype_name(t) + " transA=" + std::to_string(ta) + " transB=" + std::to_string(tb) +
                                   " bias=" + std::to_string(bias));
        }
}

// numpy matmul reference on [batch..., M, K] x [batch..., K, N] with broadcasting batch dims.
Ref matmul_ref(const Tensor& a, const Tensor& b, const std::vector<int64_t>& out_shape) {
  std::vector<int64_t> as = a.shape, bs = b.shape;
  if (as.size() == 1) as.insert(as.begin(), 1);
  if (bs.size() == 1) bs.push_back(1);
  const int64_t M = as[as.size() - 2], K = as.back(), N = bs.back();
  const std::vector<int64_t> ab(as.begin(), as.end() - 2), bb(bs.begin(), bs.end() - 2);
  const size_t r = std::max(ab.size(), bb.size());
  std::vector<int64_t> ob(r);
  for (size_t i = 0; i < r; ++i) {
    const int64_t da = i + ab.size() >= r ? ab[i + ab.size() - r] : 1, db = i + bb.size() >= r ? bb[i + bb.size() - r] : 1;
    ob[i] = std::max(da, db);
  }
  int64_t batches = 1;
  for (int64_t d : ob) batches *= d;
  Ref ref;
  for (int64_t bi = 0; bi < batches; ++bi) {
    const std::vector<int64_t> idx = unravel(bi, ob);
    auto pick = [&](const std::vector<int64_t>& dims) {
      std::vector<int64_t> own(dims.size());
      for (size_t i = 0; i < dims.size(); ++i) own[i] = dims[i] == 1 ? 0 : idx[i + r - dims.size()];
      return dims.empty() ? int64_t{0} : ravel(own, dims);
    };
    const int64_t oa = pick(ab) * M * K, obb = pick(bb) * K * N;
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double s = 0, abs_s = 0;
        for (int64_t k = 0; k < K; ++k) {
          const double p = value(a, oa + i * K + k) * value(b, obb + k * N + j);
          s += p;
          abs_s += std::abs(p);
        }
        ref.y.push_back(s);
        ref.abs_sum.push_back(abs_s);
      }
  }
  int64_t total = 1;
  for (int64_t d : out_shape) total *= d;
  EXPECT_EQ(total, static_cast<int64_t>(ref.y.size()));
  return ref;
}

TEST(HalfMatMul, BatchedBroadcastAndVectorMatMulMatchFloat64) {
  struct Case {
    std::vector<int64_t> a, b, y;
  };
  const std::vector<Case> cases = {
      {{4, 6}, {6, 3}, {4, 3}},
      {{64, 48}, {48, 40}, {64, 40}},  // large enough for the float32 kernel's sgemm path
      {{2, 3, 4, 5}, {5, 6}, {2, 3, 4, 6}},
      {{2, 1, 4, 5}, {3, 5, 2}, {2, 3, 4, 2}},
      {{5}, {5, 3}, {3}},
      {{4, 5}, {5}, {4}},
      {{3, 2, 5}, {3, 5, 4}, {3, 2, 4}},
  };
  for (DType t : kHalves)
    for (const Case& c : cases) {
      const Tensor a = random_half(c.a, 11, t), b = random_half(c.b, 12, t);
      const Tensor y = run_single(make_node("MatMul", 2), 13, {a, b});
      ASSERT_EQ(y.dtype, t);
      ASSERT_EQ(y.shape, c.y);
      expect_close(y, matmul_ref(a, b, c.y), dtype_name(t) + " " + shape_string(c.a) + " x " + shape_string(c.b));
    }
}

// The gradient of a half Gemm's bias sums a half gradient over the batch.
TEST(HalfMatMul, ReduceSumMatchesFloat64) {
  for (DType t : kHalves) {
    const Tensor x = random_half({6, 5}, 21, t);
    const Tensor y = run_single(make_node("ReduceSum", 2, {{"keepdims", int64_t{0}}}), 13,
                                {x, Tensor::from_vector<int64_t>({1}, {0})}, {1});
    ASSERT_EQ(y.dtype, t);
    ASSERT_EQ(y.shape, (std::vector<int64_t>{5}));
    Ref ref;
    for (int64_t j = 0; j < 5; ++j) {
      double s = 0, as = 0;
      for (int64_t i = 0; i < 6; ++i) {
        s += value(x, i * 5 + j);
        as += std::abs(value(x, i * 5 + j));
      }
      ref.y.push_back(s);
      ref.abs_sum.push_back(as);
    }
    expect_close(y, ref, dtype_name(t) + " ReduceSum");
  }
}

TEST(HalfMatMul, MixedDtypesFailNamingBoth) {
  const Tensor a = random_half({2, 3}, 1, DType::Float16), b = random_tensor<float>({3, 2}, 2, -1, 1);
  const std::string err = error_of([&] { run_single(make_node("MatMul", 2), 13, {a, b}); });
  EXPECT_NE(err.find("float32"), std::string::npos) << err;
  EXPECT_NE(err.find("float16"), std::string::npos) << err;
  EXPECT_NE(err.find("n_MatMul"), std::string::npos) << err;
}

}  // namespace
}  // namespace onnxtrain
