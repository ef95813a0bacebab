// Elementwise, unary and fused-gradient kernels, driven through the registry exactly as a plan would bind
// them. Expectations are written out by hand or computed by an independent naive index loop.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "executor/broadcast.h"
#include "executor/functors.h"
#include "executor/kernel.h"
#include "executor/kernel_test_util.h"
#include "graph/error.h"

namespace onnxtrain {
namespace {

using namespace test;

template <class T> Tensor T_(std::vector<int64_t> shape, std::vector<T> v) { return Tensor::from_vector<T>(shape, v); }
Tensor F(std::vector<int64_t> shape, std::vector<float> v) { return T_<float>(std::move(shape), std::move(v)); }

template <class T> std::vector<T> values(const Tensor& t) {
  EXPECT_EQ(t.dtype, dtype_of<T>());
  auto s = t.span<T>();
  return {s.begin(), s.end()};
}

// A float test ramp with both signs and no zeros.
std::vector<float> ramp(int64_t n, float scale = 0.01f) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = scale * static_cast<float>((i * 37) % 1001 - 500) + 0.003f;
  return v;
}

// ---- broadcast helper ----------------------------------------------------------------------------------

TEST(Broadcast, Shapes) {
  using S = std::vector<std::vector<int64_t>>;
  EXPECT_EQ(*broadcast_shapes(S{{2, 3}, {3}}), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(*broadcast_shapes(S{{2, 1, 4}, {3, 1}}), (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(*broadcast_shapes(S{{}, {5}}), (std::vector<int64_t>{5}));
  EXPECT_EQ(*broadcast_shapes(S{{0, 3}, {1, 3}}), (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(*broadcast_shapes(S{{1}, {0}}), (std::vector<int64_t>{0}));
  EXPECT_FALSE(broadcast_shapes(S{{2, 3}, {4}}));
  EXPECT_FALSE(broadcast_shapes(S{{0}, {2}}));
  EXPECT_EQ(*broadcast_shapes(S{{2, 1, 1}, {1, 3, 1}, {4}}), (std::vector<int64_t>{2, 3, 4}));
}

TEST(Broadcast, PlanCollapsesDims) {
  using S = std::vector<std::vector<int64_t>>;
  std::vector<int64_t> out = {2, 3, 4};
  // [3,4] onto [2,3,4]: the last two dims merge; input 1 is broadcast along the first.
  BroadcastPlan p = plan_broadcast(S{{2, 3, 4}, {3, 4}}, out);
  EXPECT_EQ(p.dims, (std::vector<int64_t>{2, 12}));
  EXPECT_EQ(p.strides, (std::vector<int64_t>{12, 1, 0, 1}));
  EXPECT_FALSE(p.all_contiguous());
  // Same shapes (up to leading 1s) collapse to one dim.
  p = plan_broadcast(S{{2, 3, 4}, {1, 2, 3, 4}}, std::vector<int64_t>{1, 2, 3, 4});
  EXPECT_EQ(p.dims, (std::vector<int64_t>{24}));
  EXPECT_TRUE(p.all_contiguous());
  // [2,1,4] and [3,1] onto [2,3,4]: nothing merges.
  p = plan_broadcast(S{{2, 1, 4}, {3, 1}}, out);
  EXPECT_EQ(p.dims, (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(p.strides, (std::vector<int64_t>{4, 0, 1, 0, 1, 0}));
  EXPECT_THROW(plan_broadcast(S{{2, 4}}, out), Error);
  EXPECT_THROW(plan_broadcast(S{{1, 2, 3, 4}}, out), Error);
}

// ---- binary ----------------------------------------------------------------------------------------------

TEST(Elementwise, AddRowBroadcast) {
  Tensor a = F({2, 3}, {1, 2, 3, 4, 5, 6}), b = F({3}, {10, 20, 30});
  Tensor y = run1(make_node("Add", 2), 14, {&a, &b});
  EXPECT_EQ(y.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(values<float>(y), (std::vector<float>{11, 22, 33, 14, 25, 36}));
  // Swapped operands give the same (Add commutes) but exercise the other stride pattern.
  y = run1(make_node("Sub", 2), 14, {&b, &a});
  EXPECT_EQ(values<float>(y), (std::vector<float>{9, 18, 27, 6, 15, 24}));
}

TEST(Elementwise, MulTwoWayBroadcast) {
  // [2,1,4] * [3,1] -> [2,3,4]: out[i,j,k] = a[i,0,k] * b[j,0].
  Tensor a = F({2, 1, 4}, {1, 2, 3, 4, 5, 6, 7, 8}), b = F({3, 1}, {1, 10, 100});
  Tensor y = run1(make_node("Mul", 2), 14, {&a, &b});
  ASSERT_EQ(y.shape, (std::vector<int64_t>{2, 3, 4}));
  std::vector<float> expect = {1,   2,   3,   4,   10,  20,  30,  40,  100, 200, 300, 400,
                               5,   6,   7,   8,   50,  60,  70,  80,  500, 600, 700, 800};
  EXPECT_EQ(values<float>(y), expect);
}

TEST(Elementwise, ScalarOperands) {
  Tensor s = F({}, {10}), v = F({4}, {1, 2, 3, 4});
  EXPECT_EQ(values<float>(run1(make_node("Sub", 2), 14, {&s, &v})), (std::vector<float>{9, 8, 7, 6}));
  EXPECT_EQ(values<float>(run1(make_node("Div", 2), 14, {&v, &s})), (std::vector<float>{0.1f, 0.2f, 0.3f, 0.4f}));
  Tensor t = F({}, {3});
  Tensor y = run1(make_node("Mul", 2), 14, {&s, &t});
  EXPECT_TRUE(y.shape.empty());
  EXPECT_EQ(values<float>(y), (std::vector<float>{30}));
  // [1,1] with a scalar keeps rank 2.
  Tensor one = F({1, 1}, {2});
  y = run1(make_node("Add", 2), 14, {&one, &s});
  EXPECT_EQ(y.shape, (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(values<float>(y), (std::vector<float>{12}));
}

TEST(Elementwise, ZeroSizedDims) {
  Tensor a = Tensor::empty(DType::Float32, {0, 3}), b = F({3}, {1, 2, 3});
  Tensor y = run1(make_node("Add", 2), 14, {&a, &b});
  EXPECT_EQ(y.shape, (std::vector<int64_t>{0, 3}));
  Tensor c = Tensor::empty(DType::Float32, {2, 0}), d = F({2, 1}, {1, 2});
  y = run1(make_node("Mul", 2), 14, {&c, &d});
  EXPECT_EQ(y.shape, (std::vector<int64_t>{2, 0}));
  Tensor e = Tensor::empty(DType::Float32, {0});
  y = run1(make_node("Sum", 3), 13, {&e, &e, &e});
  EXPECT_EQ(y.shape, (std::vector<int64_t>{0}));
  Tensor bad = F({2}, {1, 2});
  EXPECT_THROW(run1(make_node("Add", 2), 14, {&e, &bad}), Error);
}

TEST(Elementwise, IncompatibleShapesNameThem) {
  Tensor a = F({2, 3}, {1, 2, 3, 4, 5, 6}), b = F({4}, {1, 2, 3, 4});
  try {
    run1(make_node("Add", 2), 14, {&a, &b});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("[2,3]"), std::string::npos) << m;
    EXPECT_NE(m.find("[4]"), std::string::npos) << m;
    EXPECT_NE(m.find("n_Add"), std::string::npos) << m;
  }
  Tensor i = T_<int64_t>({3}, {1, 2, 3}), f = F({3}, {1, 2, 3});
  EXPECT_THROW(run1(make_node("Add", 2), 14, {&f, &i}), Error);
}

TEST(Elementwise, IntegerArithmetic) {
  Tensor a = T_<int64_t>({4}, {7, -7, 9, 5}), b = T_<int64_t>({4}, {2, 2, -4, 0});
  EXPECT_EQ(values<int64_t>(run1(make_node("Add", 2), 14, {&a, &b})), (std::vector<int64_t>{9, -5, 5, 5}));
  EXPECT_EQ(values<int64_t>(run1(make_node("Mul", 2), 14, {&a, &b})), (std::vector<int64_t>{14, -14, -36, 0}));
  // Truncating division; division by zero gives 0 rather than trapping.
  EXPECT_EQ(values<int64_t>(run1(make_node("Div", 2), 14, {&a, &b})), (std::vector<int64_t>{3, -3, -2, 0}));
  Tensor c = T_<int32_t>({2, 2}, {1, 2, 3, 4}), d = T_<int32_t>({2, 1}, {10, 20});
  EXPECT_EQ(values<int32_t>(run1(make_node("Sub", 2), 14, {&c, &d})), (std::vector<int32_t>{-9, -8, -17, -16}));
  Tensor mn = T_<int32_t>({1}, {std::numeric_limits<int32_t>::min()}), m1 = T_<int32_t>({1}, {-1});
  EXPECT_EQ(values<int32_t>(run1(make_node("Div", 2), 14, {&mn, &m1})),
            (std::vector<int32_t>{std::numeric_limits<int32_t>::min()}));
}

TEST(Elementwise, PowMixedTypes) {
  Tensor x = F({3}, {2, 3, 4}), e = T_<int64_t>({3}, {3, 2, -1});
  std::vector<float> y = values<float>(run1(make_node("Pow", 2), 15, {&x, &e}));
  EXPECT_FLOAT_EQ(y[0], 8);
  EXPECT_FLOAT_EQ(y[1], 9);
  EXPECT_FLOAT_EQ(y[2], 0.25f);
  Tensor h = F({}, {0.5f});
  y = values<float>(run1(make_node("Pow", 2), 15, {&x, &h}));
  EXPECT_FLOAT_EQ(y[2], 2);
}

TEST(Elementwise, Mod) {
  Tensor a = T_<int64_t>({4}, {-7, 7, -7, 7}), b = T_<int64_t>({4}, {3, 3, -3, -3});
  EXPECT_EQ(values<int64_t>(run1(make_node("Mod", 2), 13, {&a, &b})), (std::vector<int64_t>{2, 1, -1, -2}));
  EXPECT_EQ(values<int64_t>(run1(make_node("Mod", 2, {{"fmod", int64_t{1}}}), 13, {&a, &b})),
            (std::vector<int64_t>{-1, 1, -1, 1}));
  Tensor fa = F({2}, {-7.5f, 7.5f}), fb = F({2}, {2, 2});
  EXPECT_EQ(values<float>(run1(make_node("Mod", 2, {{"fmod", int64_t{1}}}), 13, {&fa, &fb})),
            (std::vector<float>{-1.5f, 1.5f}));
}

TEST(Elementwise, Comparisons) {
  Tensor a = F({2, 2}, {1, 2, 3, 4}), b = F({2}, {2, 2});
  auto as_bools = [](const Tensor& t) {
    std::vector<int> r;
    EXPECT_EQ(t.dtype, DType::Bool);
    for (bool v : t.span<bool>()) r.push_back(v);
    return r;
  };
  EXPECT_EQ(as_bools(run1(make_node("Less", 2), 13, {&a, &b})), (std::vector<int>{1, 0, 0, 0}));
  EXPECT_EQ(as_bools(run1(make_node("Greater", 2), 13, {&a, &b})), (std::vector<int>{0, 0, 1, 1}));
  EXPECT_EQ(as_bools(run1(make_node("LessOrEqual", 2), 16, {&a, &b})), (std::vector<int>{1, 1, 0, 0}));
  EXPECT_EQ(as_bools(run1(make_node("GreaterOrEqual", 2), 16, {&a, &b})), (std::vector<int>{0, 1, 1, 1}));
  EXPECT_EQ(as_bools(run1(make_node("Equal", 2), 13, {&a, &b})), (std::vector<int>{0, 1, 0, 0}));
  Tensor i = T_<int64_t>({3}, {5, 6, 7}), j = T_<int64_t>({}, {6});
  EXPECT_EQ(as_bools(run1(make_node("Equal", 2), 13, {&i, &j})), (std::vector<int>{0, 1, 0}));
  Tensor p = T_<bool>({4}, {true, true, false, false}), q = T_<bool>({2, 1}, {true, false});
  // [4] with [2,1] -> [2,4]; rows are q = true, then q = false.
  EXPECT_EQ(as_bools(run1(make_node("And", 2), 7, {&p, &q})), (std::vector<int>{1, 1, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(as_bools(run1(make_node("Or", 2), 7, {&p, &q})), (std::vector<int>{1, 1, 1, 1, 1, 1, 0, 0}));
  EXPECT_EQ(as_bools(run1(make_node("Xor", 2), 7, {&p, &q})), (std::vector<int>{0, 0, 1, 1, 1, 1, 0, 0}));
  EXPECT_EQ(as_bools(run1(make_node("Not", 1), 1, {&p})), (std::vector<int>{0, 0, 1, 1}));
}

TEST(Elementwise, Where) {
  Tensor c = T_<bool>({2, 1}, {true, false}), x = F({2, 3}, {1, 2, 3, 4, 5, 6}), y = F({}, {-1});
  Tensor r = run1(make_node("Where", 3), 16, {&c, &x, &y});
  EXPECT_EQ(r.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(values<float>(r), (std::vector<float>{1, 2, 3, -1, -1, -1}));
  Tensor c2 = T_<bool>({3}, {true, false, true}), xi = T_<int64_t>({2, 1}, {10, 20}), yi = T_<int64_t>({3}, {7, 8, 9});
  r = run1(make_node("Where", 3), 16, {&c2, &xi, &yi});
  EXPECT_EQ(values<int64_t>(r), (std::vector<int64_t>{10, 8, 10, 20, 8, 20}));
  Tensor bad = T_<int64_t>({2}, {1, 2});
  EXPECT_THROW(run1(make_node("Where", 3), 16, {&c2, &xi, &bad}), Error);
}

TEST(Elementwise, VariadicSumMaxMinMean) {
  Tensor a = F({2, 2}, {1, 5, 3, 8}), b = F({2}, {4, 4}), c = F({2, 1}, {0, 10});
  EXPECT_EQ(values<float>(run1(make_node("Sum", 3), 13, {&a, &b, &c})), (std::vector<float>{5, 9, 17, 22}));
  EXPECT_EQ(values<float>(run1(make_node("Max", 3), 13, {&a, &b, &c})), (std::vector<float>{4, 5, 10, 10}));
  EXPECT_EQ(values<float>(run1(make_node("Min", 3), 13, {&a, &b, &c})), (std::vector<float>{0, 0, 3, 4}));
  std::vector<float> m = values<float>(run1(make_node("Mean", 3), 13, {&a, &b, &c}));
  std::vector<float> expect = {5.f / 3, 3, 17.f / 3, 22.f / 3};
  for (size_t i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(m[i], expect[i]);
  // The output can be larger than the first two inputs' broadcast.
  Tensor s1 = F({1}, {1}), s2 = F({}, {2}), v = F({3}, {1, 2, 3});
  EXPECT_EQ(values<float>(run1(make_node("Sum", 3), 13, {&s1, &s2, &v})), (std::vector<float>{4, 5, 6}));
  EXPECT_EQ(values<float>(run1(make_node("Sum", 1), 13, {&v})), (std::vector<float>{1, 2, 3}));
  Tensor i = T_<int32_t>({3}, {3, -1, 2}), j = T_<int32_t>({3}, {1, 1, 1});
  EXPECT_EQ(values<int32_t>(run1(make_node("Max", 2), 13, {&i, &j})), (std::vector<int32_t>{3, 1, 2}));
  // NaN propagates as in numpy.maximum.
  Tensor n = F({2}, {std::nanf(""), 1}), k = F({2}, {1, std::nanf("")});
  std::vector<float> mx = values<float>(run1(make_node("Max", 2), 13, {&n, &k}));
  EXPECT_TRUE(std::isnan(mx[0]) && std::isnan(mx[1]));
}

TEST(Elementwise, InPlaceOutput) {
  Tensor a = F({3}, {1, 2, 3}), b = F({3}, {10, 20, 30});
  run_kernel(make_node("Add", 2), 14, {&a, &b}, {}, &a);
  EXPECT_EQ(values<float>(a), (std::vector<float>{11, 22, 33}));
}

// Large tensors take the threaded paths, with chunks starting mid-row; check them against a naive loop.
TEST(Elementwise, LargeBroadcastMatchesNaiveLoop) {
  const int64_t A = 37, B = 53, C = 61;  // out [A,B,C] = 119,561 elements
  std::vector<float> x = ramp(A * C), y = ramp(B, 0.1f), z = ramp(A * B * C, 0.001f);
  Tensor tx = F({A, 1, C}, x), ty = F({B, 1}, y), tz = F({A, B, C}, z);
  std::vector<float> r = values<float>(run1(make_node("Mul", 2), 14, {&tx, &ty}));
  std::vector<float> row = values<float>(run1(make_node("Add", 2), 14, {&tz, &tx}));  // [A,B,C] + [A,1,C]
  Tensor tc = F({C}, ramp(C));
  std::vector<float> bias = values<float>(run1(make_node("Add", 2), 14, {&tz, &tc}));  // bias row
  ASSERT_EQ(r.size(), size_t(A * B * C));
  int bad = 0;
  for (int64_t i = 0; i < A; ++i)
    for (int64_t j = 0; j < B; ++j)
      for (int64_t k = 0; k < C; ++k) {
        const int64_t o = (i * B + j) * C + k;
        bad += r[o] != x[i * C + k] * y[j];
        bad += row[o] != z[o] + x[i * C + k];
        bad += bias[o] != z[o] + tc.ptr<float>()[k];
      }
  EXPECT_EQ(bad, 0);
  std::vector<float> same = values<float>(run1(make_node("Div", 2), 14, {&tz, &tz}));
  for (float v : same) ASSERT_EQ(v, 1.0f);
}

// ---- unary -----------------------------------------------------------------------------------------------

template <class T> void check_unary(const std::string& op, double (*ref)(double), std::vector<T> in,
                                   std::map<std::string, Attribute> attrs = {}, double rtol = 1e-6) {
  SCOPED_TRACE(op + " " + dtype_name(dtype_of<T>()));
  Tensor x = Tensor::from_vector<T>({static_cast<int64_t>(in.size())}, in);
  std::vector<T> y = values<T>(run1(make_node(op, 1, attrs), 13, {&x}));
  ASSERT_EQ(y.size(), in.size());
  int bad = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    double e = ref(static_cast<double>(in[i]));
    if (!(std::abs(y[i] - e) <= 1e-6 + rtol * std::abs(e)) && bad++ < 5)
      ADD_FAILURE() << op << "(" << in[i] << ") = " << y[i] << ", expected " << e;
  }
}

TEST(Unary, FloatOpsAgainstLibm) {
  // 100k elements: vectorised and threaded paths.
  std::vector<float> v = ramp(100000);
  std::vector<float> pos;
  for (float f : v) pos.push_back(std::abs(f) + 0.01f);
  check_unary<float>("Neg", [](double x) { return -x; }, v);
  check_unary<float>("Abs", [](double x) { return std::abs(x); }, v);
  check_unary<float>("Sign", [](double x) { return double((x > 0) - (x < 0)); }, {-2, 0, 3});
  check_unary<float>("Relu", [](double x) { return x > 0 ? x : 0; }, v);
  check_unary<float>("Sigmoid", [](double x) { return 1 / (1 + std::exp(-x)); }, v);
  check_unary<float>("Sigmoid", [](double x) { return 1 / (1 + std::exp(-x)); }, {-100, -20, 0, 20, 100});
  check_unary<float>("Tanh", [](double x) { return std::tanh(x); }, v);
  check_unary<float>("Exp", [](double x) { return std::exp(x); }, v);
  check_unary<float>("Log", [](double x) { return std::log(x); }, pos);
  check_unary<float>("Sqrt", [](double x) { return std::sqrt(x); }, pos);
  check_unary<float>("Reciprocal", [](double x) { return 1 / x; }, v);
  check_unary<float>("Floor", [](double x) { return std::floor(x); }, v);
  check_unary<float>("Ceil", [](double x) { return std::ceil(x); }, v);
  check_unary<float>("Erf", [](double x) { return std::erf(x); }, v);
  check_unary<float>("Softplus", [](double x) { return std::log(1 + std::exp(x)); }, v);
  check_unary<float>("Softplus", [](double x) { return x; }, {100, 200});  // no overflow to inf
  check_unary<float>("LeakyRelu", [](double x) { return x >= 0 ? x : 0.01 * x; }, v);
  check_unary<float>("LeakyRelu", [](double x) { return x >= 0 ? x : 0.2 * x; }, v, {{"alpha", 0.2f}});
  check_unary<float>("Elu", [](double x) { return x >= 0 ? x : std::exp(x) - 1; }, v);
  check_unary<float>("Elu", [](double x) { return x >= 0 ? x : 2 * (std::exp(x) - 1); }, v, {{"alpha", 2.0f}});
}

TEST(Unary, DoubleAndIntOps) {
  std::vector<double> v = {-3.5, -1e-3, 0.25, 2, 7.75};
  check_unary<double>("Exp", [](double x) { return std::exp(x); }, v, {}, 1e-13);
  check_unary<double>("Tanh", [](double x) { return std::tanh(x); }, v, {}, 1e-13);
  check_unary<double>("Sigmoid", [](double x) { return 1 / (1 + std::exp(-x)); }, v, {}, 1e-13);
  check_unary<double>("Log", [](double x) { return std::log(x); }, {0.5, 1, 3}, {}, 1e-13);
  Tensor i = T_<int64_t>({4}, {-3, 0, 2, -1});
  EXPECT_EQ(values<int64_t>(run1(make_node("Neg", 1), 13, {&i})), (std::vector<int64_t>{3, 0, -2, 1}));
  EXPECT_EQ(values<int64_t>(run1(make_node("Abs", 1), 13, {&i})), (std::vector<int64_t>{3, 0, 2, 1}));
  EXPECT_EQ(values<int64_t>(run1(make_node("Relu", 1), 14, {&i})), (std::vector<int64_t>{0, 0, 2, 0}));
  EXPECT_EQ(values<int64_t>(run1(make_node("Sign", 1), 13, {&i})), (std::vector<int64_t>{-1, 0, 1, -1}));
  Tensor s = T_<int32_t>({2, 2}, {1, 2, 3, 4});
  Tensor id = run1(make_node("Identity", 1), 21, {&s});
  EXPECT_EQ(id.shape, s.shape);
  EXPECT_EQ(values<int32_t>(id), (std::vector<int32_t>{1, 2, 3, 4}));
  Tensor u = T_<uint8_t>({2}, {200, 7});
  EXPECT_EQ(values<uint8_t>(run1(make_node("Identity", 1), 21, {&u})), (std::vector<uint8_t>{200, 7}));
}

TEST(Unary, Cast) {
  auto cast = [](const Tensor& x, DType to, int64_t opset = 21) {
    return run1(make_node("Cast", 1, {{"to", int64_t(to)}}), opset, {&x});
  };
  Tensor f = F({5}, {2.7f, -2.7f, 0.f, 0.5f, 100.f});
  EXPECT_EQ(values<int32_t>(cast(f, DType::Int32)), (std::vector<int32_t>{2, -2, 0, 0, 100}));
  EXPECT_EQ(values<int64_t>(cast(f, DType::Int64)), (std::vector<int64_t>{2, -2, 0, 0, 100}));
  EXPECT_EQ(values<double>(cast(f, DType::Float64)), (std::vector<double>{2.7f, -2.7f, 0.f, 0.5f, 100.f}));
  Tensor b = cast(f, DType::Bool);
  std::vector<int> bs;
  for (bool v : b.span<bool>()) bs.push_back(v);
  EXPECT_EQ(bs, (std::vector<int>{1, 1, 0, 1, 1}));
  EXPECT_EQ(values<float>(cast(b, DType::Float32)), (std::vector<float>{1, 1, 0, 1, 1}));
  Tensor i = T_<int64_t>({3}, {-5, 0, 1LL << 40});
  EXPECT_EQ(values<float>(cast(i, DType::Float32)), (std::vector<float>{-5.f, 0.f, 1099511627776.f}));
  Tensor d = T_<double>({2}, {250.9, 3.2});
  EXPECT_EQ(values<uint8_t>(cast(d, DType::UInt8, 13)), (std::vector<uint8_t>{250, 3}));
  EXPECT_EQ(values<int8_t>(cast(T_<int32_t>({2}, {-100, 27}), DType::Int8)), (std::vector<int8_t>{-100, 27}));
  EXPECT_EQ(values<float>(cast(f, DType::Float32)), values<float>(f));  // same-type cast copies
  try {
    cast(d, DType::Float16);  // half types cast only to and from float32 (executor/cpu/half.cpp)
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("float16"), std::string::npos) << e.what();
  }
  EXPECT_THROW(run1(make_node("Cast", 1), 13, {&f}), Error);  // no 'to'
}

TEST(Unary, Clip) {
  Tensor x = F({5}, {-3, -1, 0, 2, 5}), lo = F({}, {-1.5f}), hi = F({}, {2.5f});
  Node n = make_node("Clip", 3);
  EXPECT_EQ(values<float>(run1(n, 13, {&x, &lo, &hi})), (std::vector<float>{-1.5f, -1, 0, 2, 2.5f}));
  EXPECT_EQ(values<float>(run1(n, 13, {&x, &lo, nullptr})), (std::vector<float>{-1.5f, -1, 0, 2, 5}));
  EXPECT_EQ(values<float>(run1(n, 13, {&x, nullptr, &hi})), (std::vector<float>{-3, -1, 0, 2, 2.5f}));
  EXPECT_EQ(values<float>(run1(make_node("Clip", 1), 13, {&x})), (std::vector<float>{-3, -1, 0, 2, 5}));
  // min > max: every value becomes max.
  Tensor big = F({}, {4}), small = F({}, {1});
  EXPECT_EQ(values<float>(run1(n, 13, {&x, &big, &small})), (std::vector<float>{1, 1, 1, 1, 1}));
  // Opset 6 takes attributes.
  Node a = make_node("Clip", 1, {{"min", -0.5f}, {"max", 1.0f}});
  EXPECT_EQ(values<float>(run1(a, 6, {&x})), (std::vector<float>{-0.5f, -0.5f, 0, 1, 1}));
  Tensor xi = T_<int32_t>({4}, {-9, 0, 4, 9}), li = T_<int32_t>({}, {-2}), hi_i = T_<int32_t>({}, {5});
  EXPECT_EQ(values<int32_t>(run1(n, 13, {&xi, &li, &hi_i})), (std::vector<int32_t>{-2, 0, 4, 5}));
  Tensor vec = F({2}, {0, 1});
  EXPECT_THROW(run1(n, 13, {&x, &vec, nullptr}), Error);  // bounds must be scalars
  Tensor li64 = T_<int64_t>({}, {0});
  EXPECT_THROW(run1(n, 13, {&x, &li64, nullptr}), Error);  // and share the input's dtype
}

// ---- fused gradients -------------------------------------------------------------------------------------

template <class T> void check_grad(const std::string& op, T (*formula)(T, T)) {
  SCOPED_TRACE(op + " " + dtype_name(dtype_of<T>()));
  const int64_t n = 70007;  // threaded path; 7 x 10001
  std::vector<T> dy(n), y(n);
  for (int64_t i = 0; i < n; ++i) {
    dy[i] = static_cast<T>((i % 13) - 6) * T(0.25);
    y[i] = static_cast<T>((i * 7) % 201 - 100) * T(0.01);
  }
  Tensor tdy = Tensor::from_vector<T>({7, n / 7}, dy), ty = Tensor::from_vector<T>({7, n / 7}, y);
  Tensor dx = run1(make_node(op, 2, {}, "onnxtrain"), 1, {&tdy, &ty});
  EXPECT_EQ(dx.shape, tdy.shape);
  std::vector<T> got = values<T>(dx);
  int bad = 0;
  // A hair of tolerance: the compiler may fuse 1 - y*y into an FMA in one place and not the other.
  const double tol = std::is_same_v<T, float> ? 1e-6 : 1e-14;
  for (int64_t i = 0; i < n; ++i) {
    const double e = formula(dy[i], y[i]);
    bad += !(std::abs(got[i] - e) <= tol * (1 + std::abs(e)));
  }
  EXPECT_EQ(bad, 0);
}

TEST(FusedGrad, MatchFormulas) {
  check_grad<float>("ReluGrad", [](float dy, float y) { return y > 0 ? dy : 0.f; });
  check_grad<double>("ReluGrad", [](double dy, double y) { return y > 0 ? dy : 0.; });
  check_grad<float>("SigmoidGrad", [](float dy, float y) { return dy * y * (1 - y); });
  check_grad<double>("SigmoidGrad", [](double dy, double y) { return dy * y * (1 - y); });
  check_grad<float>("TanhGrad", [](float dy, float y) { return dy * (1 - y * y); });
  check_grad<double>("TanhGrad", [](double dy, double y) { return dy * (1 - y * y); });
  // Spot values by hand: dY=2, Y=0.5 -> Sigmoid 2*0.5*0.5 = 0.5, Tanh 2*(1-0.25) = 1.5; Relu of Y=0 is 0.
  Tensor dy = F({2}, {2, 2}), y = F({2}, {0.5f, 0});
  EXPECT_EQ(values<float>(run1(make_node("SigmoidGrad", 2, {}, "onnxtrain"), 1, {&dy, &y})),
            (std::vector<float>{0.5f, 0}));
  EXPECT_EQ(values<float>(run1(make_node("TanhGrad", 2, {}, "onnxtrain"), 1, {&dy, &y})),
            (std::vector<float>{1.5f, 2}));
  EXPECT_EQ(values<float>(run1(make_node("ReluGrad", 2, {}, "onnxtrain"), 1, {&dy, &y})),
            (std::vector<float>{2, 0}));
  Tensor y3 = F({3}, {1, 2, 3});
  EXPECT_THROW(run1(make_node("ReluGrad", 2, {}, "onnxtrain"), 1, {&dy, &y3}), Error);
}

TEST(Functors, SharedMathsAtEdges) {
  EXPECT_EQ(SigmoidOp{}(-1000.0f), 0.0f);
  EXPECT_EQ(SigmoidOp{}(1000.0f), 1.0f);
  EXPECT_TRUE(std::isinf(SoftplusOp{}(std::numeric_limits<float>::infinity())));
  EXPECT_FLOAT_EQ(SoftplusOp{}(0.0f), std::log(2.0f));
  EXPECT_TRUE(std::isnan(ClipOp{}(std::numeric_limits<float>::quiet_NaN(), 0.f, 1.f)));
  EXPECT_EQ(ModOp{}(int64_t{5}, int64_t{0}), 0);
}

}  // namespace
}  // namespace onnxtrain
