// Kernel-level tests for reductions, shape ops and MatMul/Gemm: each node is built by hand, bound through
// default_kernels(), run on tensors and compared with a naive reference computed here in double (or with
// values worked out by hand for the data-movement ops).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numeric>
#include <optional>

#include "executor/kernel.h"
#include "executor/kernel_test_util.h"
#include "graph/error.h"

namespace onnxtrain {
namespace {

using namespace test;

Tensor iota_f(std::vector<int64_t> shape) {
  Tensor t = Tensor::empty(DType::Float32, std::move(shape));
  std::iota(t.span<float>().begin(), t.span<float>().end(), 0.0f);
  return t;
}

Tensor ints(std::vector<int64_t> v) { return Tensor::from_vector<int64_t>({static_cast<int64_t>(v.size())}, v); }

std::vector<float> values(const Tensor& t) {
  auto s = t.span<float>();
  return {s.begin(), s.end()};
}

// ---------------------------------------------------------------------------------------------------------
// Reductions

struct ReduceCase {
  std::vector<int64_t> shape;
  std::vector<int64_t> axes;  // empty: all
  bool keepdims;
};

// Naive reduction in double: op is "sum", "mean", "max", "min", "prod", "sumsq", "l2", "lse".
std::vector<double> reduce_ref(const Tensor& x, const std::string& op, std::vector<int64_t> axes,
                               std::vector<int64_t>* out_shape_keep) {
  const int64_t rank = static_cast<int64_t>(x.rank());
  if (axes.empty())
    for (int64_t i = 0; i < rank; ++i) axes.push_back(i);
  std::vector<bool> red(x.rank(), false);
  for (int64_t a : axes) red[static_cast<size_t>(a < 0 ? a + rank : a)] = true;
  std::vector<int64_t> oshape;
  for (size_t i = 0; i < x.rank(); ++i) oshape.push_back(red[i] ? 1 : x.shape[i]);
  *out_shape_keep = oshape;
  const int64_t nout = numel_of(oshape);
  std::vector<std::vector<double>> groups(static_cast<size_t>(nout));
  for (int64_t i = 0; i < x.numel(); ++i) {
    std::vector<int64_t> idx = unravel(i, x.shape);
    for (size_t k = 0; k < idx.size(); ++k)
      if (red[k]) idx[k] = 0;
    const double v = x.dtype == DType::Float32 ? x.ptr<float>()[i] : x.ptr<double>()[i];
    groups[static_cast<size_t>(ravel(idx, oshape))].push_back(v);
  }
  std::vector<double> out;
  for (const auto& g : groups) {
    double r = 0;
    if (op == "sum" || op == "mean") {
      for (double v : g) r += v;
      if (op == "mean") r /= static_cast<double>(g.size());
    } else if (op == "max") {
      r = -INFINITY;
      for (double v : g) r = std::max(r, v);
    } else if (op == "min") {
      r = INFINITY;
      for (double v : g) r = std::min(r, v);
    } else if (op == "prod") {
      r = 1;
      for (double v : g) r *= v;
    } else if (op == "sumsq" || op == "l2") {
      for (double v : g) r += v * v;
      if (op == "l2") r = std::sqrt(r);
    } else if (op == "lse") {
      for (double v : g) r += std::exp(v);
      r = std::log(r);
    }
    out.push_back(r);
  }
  return out;
}

const std::map<std::string, std::string> kReduceOps = {{"ReduceSum", "sum"},     {"ReduceMean", "mean"},
                                                       {"ReduceMax", "max"},     {"ReduceMin", "min"},
                                                       {"ReduceProd", "prod"},   {"ReduceSumSquare", "sumsq"},
                                                       {"ReduceL2", "l2"},       {"ReduceLogSumExp", "lse"}};

const std::vector<ReduceCase> kReduceCases = {
    {{6, 7}, {1}, true},          {{6, 7}, {1}, false},        {{6, 7}, {0}, false},  // rows, columns
    {{6, 7}, {}, false},          {{6, 7}, {}, true},          {{2, 3, 4}, {1}, true},  // middle axis
    {{2, 3, 4}, {0, 2}, false},   {{2, 3, 4}, {-1, -3}, true}, {{2, 3, 4, 5}, {0, 2}, false},  // general
    {{2, 3, 4, 5}, {1, 3}, true}, {{3, 1, 4}, {1}, false},     {{5}, {0}, true},  // size-1 axis
    {{300, 257}, {0}, false},     {{257, 300}, {1}, false},    {{70000}, {}, false},  // threaded paths
};

void check_reduce(const std::string& op, int64_t opset, bool as_input, DType dt) {
  for (const ReduceCase& c : kReduceCases) {
    SCOPED_TRACE(op + " opset " + std::to_string(opset) + " " + shape_string(c.shape) + " axes " +
                 shape_string(c.axes) + " keepdims " + std::to_string(c.keepdims));
    // Prod over many values under/overflows; keep it to values near 1 and small groups.
    const bool prod = op == "ReduceProd";
    if (prod && numel_of(c.shape) > 1000) continue;
    Tensor x = dt == DType::Float32 ? random_tensor<float>(c.shape, 7, prod ? 0.5 : -2, prod ? 1.5 : 2)
                                    : random_tensor<double>(c.shape, 7, prod ? 0.5 : -2, prod ? 1.5 : 2);
    std::map<std::string, Attribute> attrs{{"keepdims", int64_t{c.keepdims}}};
    std::vector<Tensor> inputs{x};
    std::vector<size_t> known;
    if (as_input) {
      if (!c.axes.empty()) {
        inputs.push_back(ints(c.axes));
        known.push_back(1);
      }
    } else if (!c.axes.empty()) {
      attrs["axes"] = c.axes;
    }
    Node n = make_node(op, inputs.size(), attrs);
    std::vector<Tensor> y = run_node(n, opset, inputs, known);
    std::vector<int64_t> keep_shape;
    std::vector<double> ref = reduce_ref(x, kReduceOps.at(op), c.axes, &keep_shape);
    std::vector<int64_t> want_shape;
    for (size_t i = 0; i < keep_shape.size(); ++i) {
      bool reduced = c.axes.empty();
      for (int64_t a : c.axes) reduced |= (a < 0 ? a + static_cast<int64_t>(c.shape.size()) : a) == int64_t(i);
      if (!reduced || c.keepdims) want_shape.push_back(keep_shape[i]);
    }
    ASSERT_EQ(y[0].shape, want_shape);
    ASSERT_EQ(y[0].dtype, dt);
    ASSERT_EQ(static_cast<size_t>(y[0].numel()), ref.size());
    for (size_t i = 0; i < ref.size(); ++i) {
      const double got = dt == DType::Float32 ? y[0].ptr<float>()[i] : y[0].ptr<double>()[i];
      const double tol = (dt == DType::Float32 ? 2e-5 : 1e-12) * std::max(1.0, std::abs(ref[i])) *
                         (numel_of(c.shape) > 1000 ? 50 : 1);
      ASSERT_NEAR(got, ref[i], tol) << "at " << i;
    }
  }
}

TEST(ReduceKernels, AllOpsAxesAsAttribute) {
  for (const auto& [op, _] : kReduceOps) check_reduce(op, op == "ReduceSum" ? 11 : 13, false, DType::Float32);
}

TEST(ReduceKernels, AllOpsAxesAsInput) {
  for (const auto& [op, _] : kReduceOps) check_reduce(op, 18, true, DType::Float32);
  check_reduce("ReduceSum", 13, true, DType::Float32);
}

TEST(ReduceKernels, Float64) {
  for (const char* op : {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceLogSumExp", "ReduceL2"})
    check_reduce(op, 18, true, DType::Float64);
}

TEST(ReduceKernels, SumOfInt64) {
  Tensor x = Tensor::from_vector<int64_t>({2, 3}, {1, 2, 3, 4, 5, 6});
  Node n = make_node("ReduceSum", 2, {{"keepdims", int64_t{0}}});
  auto y = run_node(n, 13, {x, ints({0})}, {1});
  ASSERT_EQ(y[0].shape, (std::vector<int64_t>{3}));
  EXPECT_EQ(y[0].ptr<int64_t>()[0], 5);
  EXPECT_EQ(y[0].ptr<int64_t>()[1], 7);
  EXPECT_EQ(y[0].ptr<int64_t>()[2], 9);
  Node m = make_node("ReduceMax", 2, {{"keepdims", int64_t{0}}});
  auto z = run_node(m, 18, {x, ints({1})}, {1});
  EXPECT_EQ(z[0].ptr<int64_t>()[0], 3);
  EXPECT_EQ(z[0].ptr<int64_t>()[1], 6);
}

TEST(ReduceKernels, NoopWithEmptyAxesAndEmptySets) {
  Tensor x = iota_f({2, 3});
  Node noop = make_node("ReduceSum", 1, {{"noop_with_empty_axes", int64_t{1}}});
  auto y = run_node(noop, 13, {x});
  EXPECT_EQ(y[0].shape, x.shape);
  EXPECT_EQ(values(y[0]), values(x));
  // Reducing over a zero-size axis gives the identity of each op.
  Tensor e = Tensor::empty(DType::Float32, {2, 0, 3});
  auto run_empty = [&](const char* op) {
    return run_node(make_node(op, 2, {{"keepdims", int64_t{0}}}), 18, {e, ints({1})}, {1})[0];
  };
  EXPECT_EQ(values(run_empty("ReduceSum")), std::vector<float>(6, 0.0f));
  EXPECT_EQ(values(run_empty("ReduceProd")), std::vector<float>(6, 1.0f));
  EXPECT_EQ(values(run_empty("ReduceMax")), std::vector<float>(6, -INFINITY));
  EXPECT_EQ(values(run_empty("ReduceMin")), std::vector<float>(6, INFINITY));
  EXPECT_EQ(values(run_empty("ReduceLogSumExp")), std::vector<float>(6, -INFINITY));
}

TEST(ReduceKernels, LogSumExpIsStableForLargeInputs) {
  Tensor x = Tensor::from_vector<float>({1, 3}, {1000.0f, 1000.0f, 1000.0f});
  auto y = run_node(make_node("ReduceLogSumExp", 2, {{"keepdims", int64_t{0}}}), 18, {x, ints({1})}, {1});
  EXPECT_NEAR(y[0].ptr<float>()[0], 1000.0f + std::log(3.0f), 1e-3);
}

TEST(ReduceKernels, AxesInputMustBeKnownAtPlanTime) {
  Tensor x = iota_f({2, 3});
  Node n = make_node("ReduceSum", 2);
  EXPECT_THROW(run_node(n, 13, {x, ints({1})}, {}), Error);
  Node bad = make_node("ReduceMean", 1, {{"axes", std::vector<int64_t>{2}}});
  try {
    run_node(bad, 13, {x});
    FAIL() << "axis 2 of a rank-2 input must be rejected";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("n_ReduceMean"), std::string::npos) << e.what();
  }
}

TEST(ReduceKernels, ArgMaxArgMin) {
  // Ties at 5 (indices 1 and 3 of row 0) tell first from last.
  Tensor x = Tensor::from_vector<float>({2, 4}, {1, 5, 2, 5, 7, 0, 7, -1});
  auto y = run_node(make_node("ArgMax", 1, {{"axis", int64_t{1}}}), 13, {x});
  ASSERT_EQ(y[0].shape, (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(y[0].ptr<int64_t>()[0], 1);
  EXPECT_EQ(y[0].ptr<int64_t>()[1], 0);
  auto last = run_node(
      make_node("ArgMax", 1, {{"axis", int64_t{-1}}, {"keepdims", int64_t{0}}, {"select_last_index", int64_t{1}}}),
      13, {x});
  ASSERT_EQ(last[0].shape, (std::vector<int64_t>{2}));
  EXPECT_EQ(last[0].ptr<int64_t>()[0], 3);
  EXPECT_EQ(last[0].ptr<int64_t>()[1], 2);
  auto mn = run_node(make_node("ArgMin", 1, {{"axis", int64_t{0}}, {"keepdims", int64_t{0}}}), 13, {x});
  ASSERT_EQ(mn[0].shape, (std::vector<int64_t>{4}));
  EXPECT_EQ(std::vector<int64_t>(mn[0].ptr<int64_t>(), mn[0].ptr<int64_t>() + 4), (std::vector<int64_t>{0, 1, 0, 1}));
}

// ---------------------------------------------------------------------------------------------------------
// Shape ops

TEST(ShapeKernels, ReshapeZeroAndMinusOne) {
  Tensor x = iota_f({2, 3, 4});
  struct Case {
    std::vector<int64_t> shape, want;
  };
  for (const Case& c : std::vector<Case>{{{0, -1}, {2, 12}},
                                         {{-1, 4}, {6, 4}},
                                         {{0, 0, 2, 2}, {2, 3, 2, 2}},
                                         {{24}, {24}},
                                         {{4, 0, -1}, {4, 3, 2}}}) {
    auto y = run_node(make_node("Reshape", 2), 14, {x, ints(c.shape)}, {1});
    EXPECT_EQ(y[0].shape, c.want);
    EXPECT_EQ(values(y[0]), values(x));
  }
  // allowzero keeps a literal 0 dim.
  Tensor e = Tensor::empty(DType::Float32, {0, 3});
  auto z = run_node(make_node("Reshape", 2, {{"allowzero", int64_t{1}}}), 14, {e, ints({3, 0})}, {1});
  EXPECT_EQ(z[0].shape, (std::vector<int64_t>{3, 0}));
  EXPECT_THROW(run_node(make_node("Reshape", 2), 14, {x, ints({5, -1})}, {1}), Error);
  EXPECT_THROW(run_node(make_node("Reshape", 2), 14, {x, ints({-1, -1})}, {1}), Error);
}

TEST(ShapeKernels, TransposeMatchesIndexMapping) {
  struct Case {
    std::vector<int64_t> shape, perm;
  };
  for (const Case& c : std::vector<Case>{{{3, 5}, {1, 0}},
                                         {{40, 70}, {1, 0}},  // tiled path
                                         {{2, 3, 4}, {}},     // default: reversed
                                         {{2, 3, 4}, {0, 2, 1}},
                                         {{2, 3, 4}, {1, 0, 2}},
                                         {{3, 33, 17}, {0, 2, 1}},
                                         {{2, 3, 4, 5}, {2, 0, 3, 1}},
                                         {{1, 3, 1, 5}, {3, 2, 1, 0}}}) {
    SCOPED_TRACE(shape_string(c.shape) + " perm " + shape_string(c.perm));
    Tensor x = iota_f(c.shape);
    std::map<std::string, Attribute> attrs;
    if (!c.perm.empty()) attrs["perm"] = c.perm;
    auto y = run_node(make_node("Transpose", 1, attrs), 13, {x});
    std::vector<int64_t> perm = c.perm;
    if (perm.empty())
      for (size_t i = c.shape.size(); i-- > 0;) perm.push_back(static_cast<int64_t>(i));
    std::vector<int64_t> oshape;
    for (int64_t p : perm) oshape.push_back(c.shape[static_cast<size_t>(p)]);
    ASSERT_EQ(y[0].shape, oshape);
    for (int64_t i = 0; i < y[0].numel(); ++i) {
      std::vector<int64_t> oi = unravel(i, oshape), ii(c.shape.size());
      for (size_t k = 0; k < perm.size(); ++k) ii[static_cast<size_t>(perm[k])] = oi[k];
      ASSERT_EQ(y[0].ptr<float>()[i], x.ptr<float>()[ravel(ii, c.shape)]) << "at " << i;
    }
  }
}

// Inputs over a megabyte take the threaded copy paths.
TEST(ShapeKernels, LargeCopiesMatchNaiveLoops) {
  Tensor x = iota_f({600, 500});
  auto t = run_node(make_node("Transpose", 1), 13, {x});
  ASSERT_EQ(t[0].shape, (std::vector<int64_t>{500, 600}));
  for (int64_t i = 0; i < 500; ++i)
    for (int64_t j = 0; j < 600; ++j) ASSERT_EQ(t[0].ptr<float>()[i * 600 + j], x.ptr<float>()[j * 500 + i]);
  Tensor row = iota_f({300});
  auto e = run_node(make_node("Expand", 2), 13, {row, ints({1000, 300})}, {1});
  for (int64_t i = 0; i < 1000; ++i)
    for (int64_t j = 0; j < 300; ++j) ASSERT_EQ(e[0].ptr<float>()[i * 300 + j], float(j));
  Tensor idx = Tensor::from_vector<int64_t>({4}, {599, 0, -1, 7});
  auto g = run_node(make_node("Gather", 2, {{"axis", int64_t{1}}}), 13, {t[0], idx});
  ASSERT_EQ(g[0].shape, (std::vector<int64_t>{500, 4}));
  for (int64_t i = 0; i < 500; ++i) {
    ASSERT_EQ(g[0].ptr<float>()[i * 4 + 0], x.ptr<float>()[599 * 500 + i]);
    ASSERT_EQ(g[0].ptr<float>()[i * 4 + 2], x.ptr<float>()[599 * 500 + i]);
    ASSERT_EQ(g[0].ptr<float>()[i * 4 + 3], x.ptr<float>()[7 * 500 + i]);
  }
  auto c = run_node(make_node("Concat", 2, {{"axis", int64_t{1}}}), 13, {x, x});
  ASSERT_EQ(c[0].shape, (std::vector<int64_t>{600, 1000}));
  for (int64_t i = 0; i < 600; ++i)
    for (int64_t j = 0; j < 1000; ++j) ASSERT_EQ(c[0].ptr<float>()[i * 1000 + j], x.ptr<float>()[i * 500 + j % 500]);
}

TEST(ShapeKernels, SliceIncludingNegativeSteps) {
  Tensor x = iota_f({3, 4});  // rows 0..3, 4..7, 8..11
  auto slice = [&](std::vector<int64_t> s, std::vector<int64_t> e, std::vector<int64_t> axes,
                   std::vector<int64_t> steps) {
    return run_node(make_node("Slice", 5), 13, {x, ints(s), ints(e), ints(axes), ints(steps)}, {1, 2, 3, 4})[0];
  };
  Tensor a = slice({0, 1}, {2, 3}, {0, 1}, {1, 1});
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(values(a), (std::vector<float>{1, 2, 5, 6}));
  // Reverse both axes with the usual "to the beginning" sentinel.
  Tensor b = slice({-1, -1}, {std::numeric_limits<int64_t>::min(), -1000}, {0, 1}, {-1, -1});
  EXPECT_EQ(b.shape, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(values(b), (std::vector<float>{11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0}));
  Tensor c = slice({3}, {0}, {-1}, {-2});  // columns 3, 1
  EXPECT_EQ(c.shape, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(values(c), (std::vector<float>{3, 1, 7, 5, 11, 9}));
  Tensor d = slice({1}, {1000}, {1}, {2});  // out-of-range end is clamped
  EXPECT_EQ(values(d), (std::vector<float>{1, 3, 5, 7, 9, 11}));
  Tensor e = slice({2}, {1}, {0}, {1});  // empty
  EXPECT_EQ(e.shape, (std::vector<int64_t>{0, 4}));
  // Opset 1: attributes.
  auto f = run_node(make_node("Slice", 1,
                              {{"starts", std::vector<int64_t>{1}}, {"ends", std::vector<int64_t>{-1}},
                               {"axes", std::vector<int64_t>{1}}}),
                    9, {x});
  EXPECT_EQ(values(f[0]), (std::vector<float>{1, 2, 5, 6, 9, 10}));
}

TEST(ShapeKernels, GatherNegativeIndicesAndAxes) {
  Tensor x = iota_f({3, 4});
  Tensor idx = Tensor::from_vector<int64_t>({2, 2}, {0, -1, 2, -3});
  auto y = run_node(make_node("Gather", 2, {{"axis", int64_t{0}}}), 13, {x, idx});
  EXPECT_EQ(y[0].shape, (std::vector<int64_t>{2, 2, 4}));
  EXPECT_EQ(values(y[0]),
            (std::vector<float>{0, 1, 2, 3, 8, 9, 10, 11, 8, 9, 10, 11, 0, 1, 2, 3}));
  Tensor idx32 = Tensor::from_vector<int32_t>({2}, {-1, 1});
  auto z = run_node(make_node("Gather", 2, {{"axis", int64_t{-1}}}), 13, {x, idx32});
  EXPECT_EQ(z[0].shape, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(values(z[0]), (std::vector<float>{3, 1, 7, 5, 11, 9}));
  Tensor scalar = Tensor::from_vector<int64_t>({}, {1});
  auto s = run_node(make_node("Gather", 2, {{"axis", int64_t{1}}}), 13, {x, scalar});
  EXPECT_EQ(s[0].shape, (std::vector<int64_t>{3}));
  EXPECT_EQ(values(s[0]), (std::vector<float>{1, 5, 9}));
  Tensor bad = Tensor::from_vector<int64_t>({1}, {3});
  EXPECT_THROW(run_node(make_node("Gather", 2), 13, {x, bad}), Error);
}

TEST(ShapeKernels, SplitAcrossOpsets) {
  Tensor x = iota_f({2, 5});
  // Opset 13: split sizes as an input.
  auto a = run_node(make_node("Split", 2, {{"axis", int64_t{1}}}, "", 2), 13, {x, ints({2, 3})}, {1});
  EXPECT_EQ(a[0].shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(values(a[0]), (std::vector<float>{0, 1, 5, 6}));
  EXPECT_EQ(values(a[1]), (std::vector<float>{2, 3, 4, 7, 8, 9}));
  // Opset 11: sizes as an attribute.
  auto b = run_node(make_node("Split", 1, {{"axis", int64_t{-1}}, {"split", std::vector<int64_t>{4, 1}}}, "", 2), 11,
                    {x});
  EXPECT_EQ(values(b[1]), (std::vector<float>{4, 9}));
  // Opset 18: num_outputs, the last part smaller (5 = 2 + 2 + 1).
  auto c = run_node(make_node("Split", 1, {{"axis", int64_t{1}}, {"num_outputs", int64_t{3}}}, "", 3), 18, {x});
  EXPECT_EQ(c[0].shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(c[2].shape, (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(values(c[2]), (std::vector<float>{4, 9}));
  // No sizes: equal parts.
  auto d = run_node(make_node("Split", 1, {}, "", 2), 13, {x});
  EXPECT_EQ(values(d[1]), (std::vector<float>{5, 6, 7, 8, 9}));
  EXPECT_THROW(run_node(make_node("Split", 2, {{"axis", int64_t{1}}}, "", 2), 13, {x, ints({2, 2})}, {1}), Error);
}

TEST(ShapeKernels, ConcatExpandTile) {
  Tensor a = iota_f({2, 2}), b = iota_f({2, 1});
  auto c = run_node(make_node("Concat", 2, {{"axis", int64_t{-1}}}), 13, {a, b});
  EXPECT_EQ(c[0].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(values(c[0]), (std::vector<float>{0, 1, 0, 2, 3, 1}));
  Tensor row = iota_f({3});
  auto e = run_node(make_node("Expand", 2), 13, {row, ints({2, 1, 3})}, {1});
  EXPECT_EQ(e[0].shape, (std::vector<int64_t>{2, 1, 3}));
  EXPECT_EQ(values(e[0]), (std::vector<float>{0, 1, 2, 0, 1, 2}));
  Tensor col = iota_f({2, 1});
  auto e2 = run_node(make_node("Expand", 2), 13, {col, ints({1, 3})}, {1});
  EXPECT_EQ(e2[0].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(values(e2[0]), (std::vector<float>{0, 0, 0, 1, 1, 1}));
  auto t = run_node(make_node("Tile", 2), 13, {a, ints({2, 2})}, {1});
  EXPECT_EQ(t[0].shape, (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(values(t[0]), (std::vector<float>{0, 1, 0, 1, 2, 3, 2, 3, 0, 1, 0, 1, 2, 3, 2, 3}));
}

TEST(ShapeKernels, SqueezeUnsqueezeFlatten) {
  Tensor x = iota_f({1, 3, 1, 2});
  auto s = run_node(make_node("Squeeze", 2), 13, {x, ints({0, -2})}, {1});
  EXPECT_EQ(s[0].shape, (std::vector<int64_t>{3, 2}));
  auto all = run_node(make_node("Squeeze", 1), 13, {x});
  EXPECT_EQ(all[0].shape, (std::vector<int64_t>{3, 2}));
  EXPECT_THROW(run_node(make_node("Squeeze", 2), 13, {x, ints({1})}, {1}), Error);
  auto u = run_node(make_node("Unsqueeze", 2), 13, {s[0], ints({-1, 0})}, {1});
  EXPECT_EQ(u[0].shape, (std::vector<int64_t>{1, 3, 2, 1}));
  auto u11 = run_node(make_node("Unsqueeze", 1, {{"axes", std::vector<int64_t>{1}}}), 11, {s[0]});
  EXPECT_EQ(u11[0].shape, (std::vector<int64_t>{3, 1, 2}));
  EXPECT_EQ(values(u11[0]), values(x));
  auto f = run_node(make_node("Flatten", 1, {{"axis", int64_t{-1}}}), 13, {x});
  EXPECT_EQ(f[0].shape, (std::vector<int64_t>{3, 2}));
  auto f0 = run_node(make_node("Flatten", 1, {{"axis", int64_t{0}}}), 13, {x});
  EXPECT_EQ(f0[0].shape, (std::vector<int64_t>{1, 6}));
}

TEST(ShapeKernels, ShapeSizeConstantRange) {
  Tensor x = iota_f({2, 3, 4});
  const KernelDef* def = default_kernels().find("", "Shape", 21, Device::CPU, DType::Float32);
  ASSERT_TRUE(def);
  EXPECT_TRUE(def->shape_only);
  auto sh = run_node(make_node("Shape", 1), 13, {x});
  EXPECT_EQ(std::vector<int64_t>(sh[0].ptr<int64_t>(), sh[0].ptr<int64_t>() + 3), (std::vector<int64_t>{2, 3, 4}));
  auto part = run_node(make_node("Shape", 1, {{"start", int64_t{-2}}, {"end", int64_t{100}}}), 15, {x});
  EXPECT_EQ(part[0].shape, (std::vector<int64_t>{2}));
  EXPECT_EQ(part[0].ptr<int64_t>()[0], 3);
  auto sz = run_node(make_node("Size", 1), 13, {x});
  EXPECT_TRUE(sz[0].shape.empty());
  EXPECT_EQ(sz[0].ptr<int64_t>()[0], 24);
  auto c = run_node(make_node("Constant", 0, {{"value_floats", std::vector<float>{1.5f, -2}}}), 13, {});
  EXPECT_EQ(values(c[0]), (std::vector<float>{1.5f, -2}));
  auto ci = run_node(make_node("Constant", 0, {{"value_int", int64_t{7}}}), 13, {});
  EXPECT_EQ(ci[0].dtype, DType::Int64);
  EXPECT_EQ(ci[0].ptr<int64_t>()[0], 7);
  auto cs = run_node(make_node("ConstantOfShape", 1, {{"value", TensorData::scalar<float>(2.5f)}}), 13,
                     {ints({2, 2})}, {0});
  EXPECT_EQ(values(cs[0]), (std::vector<float>{2.5f, 2.5f, 2.5f, 2.5f}));
  auto r = run_node(make_node("Range", 3), 13,
                    {Tensor::from_vector<int32_t>({}, {10}), Tensor::from_vector<int32_t>({}, {4}),
                     Tensor::from_vector<int32_t>({}, {-3})},
                    {0, 1, 2});
  EXPECT_EQ(r[0].shape, (std::vector<int64_t>{2}));
  EXPECT_EQ(r[0].ptr<int32_t>()[1], 7);
}

// ---------------------------------------------------------------------------------------------------------
// MatMul and Gemm

// numpy matmul in double, by definition.
std::vector<double> matmul_ref(const Tensor& a, const Tensor& b, std::vector<int64_t>* out_shape) {
  std::vector<int64_t> as = a.shape, bs = b.shape;
  if (as.size() == 1) as.insert(as.begin(), 1);
  if (bs.size() == 1) bs.push_back(1);
  const size_t r = std::max(as.size(), bs.size());
  as.insert(as.begin(), r - as.size(), 1);
  bs.insert(bs.begin(), r - bs.size(), 1);
  std::vector<int64_t> os(r);
  for (size_t i = 0; i < r - 2; ++i) os[i] = std::max(as[i], bs[i]);
  const int64_t M = as[r - 2], K = as[r - 1], N = bs[r - 1];
  os[r - 2] = M;
  os[r - 1] = N;
  std::vector<double> out(static_cast<size_t>(numel_of(os)));
  auto get = [](const Tensor& t, int64_t i) {
    return t.dtype == DType::Float32 ? double(t.ptr<float>()[i]) : t.ptr<double>()[i];
  };
  for (int64_t o = 0; o < numel_of(os); ++o) {
    std::vector<int64_t> oi = unravel(o, os), ai(r), bi(r);
    for (size_t k = 0; k < r - 2; ++k) {
      ai[k] = as[k] == 1 ? 0 : oi[k];
      bi[k] = bs[k] == 1 ? 0 : oi[k];
    }
    double s = 0;
    for (int64_t k = 0; k < K; ++k) {
      ai[r - 2] = oi[r - 2];
      ai[r - 1] = k;
      bi[r - 2] = k;
      bi[r - 1] = oi[r - 1];
      s += get(a, ravel(ai, as)) * get(b, ravel(bi, bs));
    }
    out[static_cast<size_t>(o)] = s;
  }
  *out_shape = std::vector<int64_t>(os.begin(), os.end() - 2);
  if (a.rank() > 1) out_shape->push_back(M);
  if (b.rank() > 1) out_shape->push_back(N);
  return out;
}

template <class T> void check_matmul(std::vector<int64_t> sa, std::vector<int64_t> sb) {
  SCOPED_TRACE(shape_string(sa) + " x " + shape_string(sb) + " " + dtype_name(dtype_of<T>()));
  Tensor a = random_tensor<T>(sa, 1, -1, 1), b = random_tensor<T>(sb, 2, -1, 1);
  auto y = run_node(make_node("MatMul", 2), 13, {a, b});
  std::vector<int64_t> want_shape;
  std::vector<double> ref = matmul_ref(a, b, &want_shape);
  ASSERT_EQ(y[0].shape, want_shape);
  ASSERT_EQ(static_cast<size_t>(y[0].numel()), ref.size());
  for (size_t i = 0; i < ref.size(); ++i)
    ASSERT_NEAR(static_cast<double>(y[0].ptr<T>()[i]), ref[i], (std::is_same_v<T, float> ? 1e-4 : 1e-12)) << i;
}

TEST(MatMulKernels, NumpySemantics) {
  const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> cases = {
      {{3, 4}, {4, 5}},          {{2, 3, 4}, {4, 5}},     {{3, 4}, {2, 4, 5}},       {{2, 1, 3, 4}, {5, 4, 6}},
      {{1, 3, 4}, {2, 4, 2}},    {{4}, {4, 5}},           {{3, 4}, {4}},             {{4}, {4}},
      {{2, 3, 4}, {4}},          {{4}, {2, 4, 3}},        {{1, 1}, {1, 1}},          {{64, 130}, {130, 33}},
      {{3, 0}, {0, 2}},          {{0, 4}, {4, 2}},
      // Batches of attention-head-sized matrices (W3's 64x64x32 heads), including a broadcast batch on either
      // side.
      {{2, 4, 64, 32}, {2, 4, 32, 64}}, {{2, 4, 64, 32}, {4, 32, 64}}, {{1, 4, 64, 64}, {2, 4, 64, 32}},
  };
  for (const auto& [sa, sb] : cases) {
    check_matmul<float>(sa, sb);
    check_matmul<double>(sa, sb);
  }
  EXPECT_THROW(run_node(make_node("MatMul", 2), 13, {iota_f({3, 4}), iota_f({5, 2})}), Error);
  EXPECT_THROW(run_node(make_node("MatMul", 2), 13, {iota_f({2, 3, 4}), iota_f({3, 4, 2})}), Error);
}

template <class T> void check_gemm(int64_t M, int64_t K, int64_t N, bool ta, bool tb, float alpha, float beta,
                                   std::optional<std::vector<int64_t>> c_shape) {
  SCOPED_TRACE("M" + std::to_string(M) + " K" + std::to_string(K) + " N" + std::to_string(N) + " ta" +
               std::to_string(ta) + " tb" + std::to_string(tb) + " alpha " + std::to_string(alpha) + " beta " +
               std::to_string(beta) + " C " + (c_shape ? shape_string(*c_shape) : "none") + " " +
               dtype_name(dtype_of<T>()));
  Tensor a = random_tensor<T>(ta ? std::vector<int64_t>{K, M} : std::vector<int64_t>{M, K}, 3, -1, 1);
  Tensor b = random_tensor<T>(tb ? std::vector<int64_t>{N, K} : std::vector<int64_t>{K, N}, 4, -1, 1);
  std::vector<Tensor> inputs{a, b};
  if (c_shape) inputs.push_back(random_tensor<T>(*c_shape, 5, -1, 1));
  Node n = make_node("Gemm", inputs.size(),
                     {{"transA", int64_t{ta}}, {"transB", int64_t{tb}}, {"alpha", alpha}, {"beta", beta}});
  auto y = run_node(n, 13, inputs);
  ASSERT_EQ(y[0].shape, (std::vector<int64_t>{M, N}));
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k)
        s += double(a.ptr<T>()[ta ? k * M + i : i * K + k]) * double(b.ptr<T>()[tb ? j * K + k : k * N + j]);
      double want = alpha * s;
      if (c_shape) {
        const std::vector<int64_t>& cs = *c_shape;
        int64_t ci = 0;
        if (cs.size() == 1) ci = cs[0] == 1 ? 0 : j;
        if (cs.size() == 2) ci = (cs[0] == 1 ? 0 : i) * cs[1] + (cs[1] == 1 ? 0 : j);
        want += beta * double(inputs[2].ptr<T>()[ci]);
      }
      ASSERT_NEAR(double(y[0].ptr<T>()[i * N + j]), want, (std::is_same_v<T, float> ? 1e-4 : 1e-12)) << i << "," << j;
    }
}

TEST(MatMulKernels, GemmAllTransposesAndBiasShapes) {
  const int64_t M = 3, K = 5, N = 4;
  const std::vector<std::optional<std::vector<int64_t>>> cs = {
      std::nullopt, std::vector<int64_t>{}, std::vector<int64_t>{N}, std::vector<int64_t>{M, 1},
      std::vector<int64_t>{1, N}, std::vector<int64_t>{M, N}};
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (const auto& c : cs)
        for (auto [alpha, beta] : {std::pair{1.0f, 1.0f}, std::pair{0.5f, -2.0f}, std::pair{2.0f, 0.0f}}) {
          check_gemm<float>(M, K, N, ta, tb, alpha, beta, c);
          check_gemm<double>(M, K, N, ta, tb, alpha, beta, c);
        }
  check_gemm<float>(70, 33, 65, true, false, 0.25f, 3.0f, std::vector<int64_t>{65});
  check_gemm<float>(2, 0, 3, false, false, 1.0f, 1.0f, std::vector<int64_t>{3});  // empty inner dim
  EXPECT_THROW(run_node(make_node("Gemm", 3), 13, {iota_f({2, 3}), iota_f({3, 4}), iota_f({3, 4})}), Error);
}

}  // namespace
}  // namespace onnxtrain
