// Kernel tests for Softmax, LogSoftmax, the fused onnxtrain.SoftmaxGrad/LogSoftmaxGrad, the scatters and
// gathers, and Pad. Each kernel runs through default_kernels() and is compared with a naive reference written
// here from the ONNX definitions: coordinate loops in double, no shared code with the kernels.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "executor/kernel.h"
#include "executor/kernel_test_util.h"
#include "graph/error.h"

namespace onnxtrain {
namespace {

using namespace test;

template <class T> std::vector<double> as_doubles(const Tensor& t) {
  std::vector<double> v;
  for (T x : t.span<T>()) v.push_back(static_cast<double>(x));
  return v;
}

std::vector<double> doubles(const Tensor& t) {
  if (t.dtype == DType::Float32) return as_doubles<float>(t);
  if (t.dtype == DType::Float64) return as_doubles<double>(t);
  if (t.dtype == DType::Int64) return as_doubles<int64_t>(t);
  if (t.dtype == DType::Int32) return as_doubles<int32_t>(t);
  throw Error("test: unsupported dtype");
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], tol * (1 + std::abs(want[i]))) << what << " element " << i;
}

Tensor i64(std::vector<int64_t> shape, std::vector<int64_t> v) { return Tensor::from_vector<int64_t>(std::move(shape), v); }

// ---- Softmax ---------------------------------------------------------------------------------------------

// Elements i and j are in the same normalisation group when they agree on every coordinate outside `group`.
std::vector<double> naive_softmax(const std::vector<double>& x, const std::vector<int64_t>& shape,
                                  const std::vector<bool>& group, bool log) {
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    auto ci = unravel(static_cast<int64_t>(i), shape);
    double m = -INFINITY;
    for (size_t j = 0; j < x.size(); ++j) {
      auto cj = unravel(static_cast<int64_t>(j), shape);
      bool same = true;
      for (size_t d = 0; d < shape.size(); ++d) same = same && (group[d] || ci[d] == cj[d]);
      if (same) m = std::max(m, x[j]);
    }
    double s = 0;
    for (size_t j = 0; j < x.size(); ++j) {
      auto cj = unravel(static_cast<int64_t>(j), shape);
      bool same = true;
      for (size_t d = 0; d < shape.size(); ++d) same = same && (group[d] || ci[d] == cj[d]);
      if (same) s += std::exp(x[j] - m);
    }
    y[i] = log ? x[i] - m - std::log(s) : std::exp(x[i] - m) / s;
  }
  return y;
}

std::vector<bool> single_axis(size_t rank, int64_t axis) {
  std::vector<bool> g(rank, false);
  g[axis < 0 ? axis + static_cast<int64_t>(rank) : axis] = true;
  return g;
}

std::vector<bool> from_axis(size_t rank, int64_t axis) {
  std::vector<bool> g(rank, false);
  for (size_t d = axis < 0 ? axis + rank : axis; d < rank; ++d) g[d] = true;
  return g;
}

TEST(Softmax, Opset13EveryAxisBothDtypesMatchNaive) {
  const std::vector<int64_t> shape{3, 4, 5};
  for (const char* op : {"Softmax", "LogSoftmax"})
    for (int64_t axis : {0, 1, 2, -1, -3}) {
      const bool log = std::string(op) == "LogSoftmax";
      Tensor x64 = random_tensor<double>(shape, 7 + static_cast<uint32_t>(axis + 3), -3, 3);
      auto want = naive_softmax(doubles(x64), shape, single_axis(3, axis), log);
      Node n = make_node(op, 1, {{"axis", axis}});
      expect_close(doubles(run_single(n, 13, {x64})), want, 1e-12,
                   std::string(op) + " f64 axis " + std::to_string(axis));
      Tensor x32 = Tensor::empty(DType::Float32, shape);
      for (int64_t i = 0; i < x32.numel(); ++i) x32.ptr<float>()[i] = static_cast<float>(x64.ptr<double>()[i]);
      auto want32 = naive_softmax(doubles(x32), shape, single_axis(3, axis), log);
      expect_close(doubles(run_single(n, 13, {x32})), want32, 1e-5,
                   std::string(op) + " f32 axis " + std::to_string(axis));
    }
}

TEST(Softmax, Opset13DefaultAxisIsLast) {
  Tensor x = random_tensor<double>({2, 3, 4}, 3, -3, 3);
  auto want = naive_softmax(doubles(x), {2, 3, 4}, single_axis(3, 2), false);
  expect_close(doubles(run_single(make_node("Softmax", 1), 13, {x})), want, 1e-12, "default axis");
}

TEST(Softmax, Opset11CoercesTo2dAtAxis) {
  const std::vector<int64_t> shape{2, 3, 4};
  Tensor x = random_tensor<double>(shape, 11, -3, 3);
  for (const char* op : {"Softmax", "LogSoftmax"}) {
    const bool log = std::string(op) == "LogSoftmax";
    // Default axis 1: each of the 2 rows normalises over its 12 trailing elements.
    expect_close(doubles(run_single(make_node(op, 1), 11, {x})), naive_softmax(doubles(x), shape, from_axis(3, 1), log),
                 1e-12, std::string(op) + " default axis");
    expect_close(doubles(run_single(make_node(op, 1, {{"axis", int64_t{0}}}), 11, {x})),
                 naive_softmax(doubles(x), shape, from_axis(3, 0), log), 1e-12, std::string(op) + " axis 0");
    expect_close(doubles(run_single(make_node(op, 1, {{"axis", int64_t{-1}}}), 1, {x})),
                 naive_softmax(doubles(x), shape, from_axis(3, 2), log), 1e-12, std::string(op) + " axis -1 opset 1");
  }
  // The same axis means something else at 13: only axis 1 itself.
  expect_close(doubles(run_single(make_node("Softmax", 1, {{"axis", int64_t{1}}}), 13, {x})),
               naive_softmax(doubles(x), shape, single_axis(3, 1), false), 1e-12, "opset 13 axis 1");
}

TEST(Softmax, StridedPathWithPartialBlocksAndThreads) {
  // inner = 130 lanes: two full blocks of 64 and a partial one; 4*50*130 elements take the parallel path.
  const std::vector<int64_t> shape{4, 50, 130};
  Tensor x = random_tensor<float>(shape, 5, -10, 10);
  std::vector<double> xd = doubles(x);
  // The naive reference is quadratic, so check lanes of a reduced copy: the middle axis is the group.
  for (const char* op : {"Softmax", "LogSoftmax"}) {
    const bool log = std::string(op) == "LogSoftmax";
    auto got = doubles(run_single(make_node(op, 1, {{"axis", int64_t{1}}}), 13, {x}));
    for (int64_t o = 0; o < 4; ++o)
      for (int64_t i = 0; i < 130; i += 7) {
        std::vector<double> lane;
        for (int64_t j = 0; j < 50; ++j) lane.push_back(xd[(o * 50 + j) * 130 + i]);
        auto want = naive_softmax(lane, {50}, {true}, log);
        for (int64_t j = 0; j < 50; ++j)
          ASSERT_NEAR(got[(o * 50 + j) * 130 + i], want[j], 1e-5 * (1 + std::abs(want[j])))
              << op << " o=" << o << " i=" << i << " j=" << j;
      }
  }
}

TEST(Softmax, LargeInputsStayFinite) {
  Tensor x = Tensor::from_vector<float>({2, 3}, {1000.f, 1001.f, 1002.f, -1000.f, -1001.f, -1002.f});
  auto y = doubles(run_single(make_node("Softmax", 1), 13, {x}));
  // softmax is shift invariant: the same as softmax([0, 1, 2]) and softmax([0, -1, -2]).
  const double e1 = std::exp(1.0), e2 = std::exp(2.0);
  std::vector<double> want{1 / (1 + e1 + e2), e1 / (1 + e1 + e2), e2 / (1 + e1 + e2),
                           e2 / (1 + e1 + e2), e1 / (1 + e1 + e2), 1 / (1 + e1 + e2)};
  expect_close(y, want, 1e-6, "softmax of large values");
  auto ly = doubles(run_single(make_node("LogSoftmax", 1), 13, {x}));
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(ly[i], std::log(want[i]), 1e-4) << i;
}

TEST(Softmax, RejectsBadAxisAndScalars) {
  Tensor x = random_tensor<float>({2, 3}, 1, -3, 3);
  EXPECT_THROW(run_single(make_node("Softmax", 1, {{"axis", int64_t{2}}}), 13, {x}), Error);
  EXPECT_THROW(run_single(make_node("LogSoftmax", 1, {{"axis", int64_t{-3}}}), 11, {x}), Error);
  EXPECT_THROW(run_single(make_node("Softmax", 1), 13, {Tensor::from_vector<float>({}, {1.f})}), Error);
}

// ---- fused gradients -------------------------------------------------------------------------------------

TEST(SoftmaxGrad, MatchesNaiveFormulaPerAxis) {
  const std::vector<int64_t> shape{3, 4, 5};
  for (int64_t axis : {-1, 1, 0}) {
    Tensor dy = random_tensor<double>(shape, 21, -3, 3);
    Tensor y = random_tensor<double>(shape, 22, 0.01, 1.0);
    auto dyd = doubles(dy), yd = doubles(y);
    std::vector<double> want_sm(dyd.size()), want_lsm(dyd.size());
    const int64_t a = axis < 0 ? axis + 3 : axis;
    for (int64_t i = 0; i < dy.numel(); ++i) {
      auto c = unravel(i, shape);
      double dot = 0, total = 0;
      for (int64_t k = 0; k < shape[a]; ++k) {
        auto cj = c;
        cj[a] = k;
        const int64_t j = ravel(cj, shape);
        dot += dyd[j] * yd[j];
        total += dyd[j];
      }
      want_sm[i] = yd[i] * (dyd[i] - dot);
      want_lsm[i] = dyd[i] - std::exp(yd[i]) * total;
    }
    std::map<std::string, Attribute> attrs;
    if (axis != -1) attrs["axis"] = axis;
    // The fused ops take opset 13 semantics whatever the model's ai.onnx opset.
    expect_close(doubles(run_single(make_node("SoftmaxGrad", 2, attrs, "onnxtrain"), 1, {dy, y})), want_sm, 1e-12,
                 "SoftmaxGrad axis " + std::to_string(axis));
    expect_close(doubles(run_single(make_node("LogSoftmaxGrad", 2, attrs, "onnxtrain"), 1, {dy, y})), want_lsm, 1e-12,
                 "LogSoftmaxGrad axis " + std::to_string(axis));
  }
}

TEST(SoftmaxGrad, RejectsMismatchedShapes) {
  Tensor a = random_tensor<float>({2, 3}, 1, -3, 3), b = random_tensor<float>({3, 2}, 2, -3, 3);
  EXPECT_THROW(run_single(make_node("SoftmaxGrad", 2, {}, "onnxtrain"), 1, {a, b}), Error);
}

// ---- ScatterND -------------------------------------------------------------------------------------------

double reduce_ref(const std::string& r, double a, double b) {
  if (r == "add") return a + b;
  if (r == "mul") return a * b;
  if (r == "max") return std::max(a, b);
  if (r == "min") return std::min(a, b);
  return b;
}

TEST(ScatterND, EveryReductionMatchesNaive) {
  const std::vector<int64_t> dshape{4, 3, 2};
  // Index tuples of length 2 (slices of 2 elements), with a repeat and a negative index.
  const std::vector<int64_t> idx{0, 1, 3, -1, 0, 1, 2, 0};
  Tensor indices = i64({4, 2}, idx);
  for (const char* red : {"none", "add", "mul", "max", "min"}) {
    Tensor data = random_tensor<double>(dshape, 31, -3, 3);
    Tensor upd = random_tensor<double>({4, 2}, 32, -3, 3);
    std::vector<double> want = doubles(data), u = doubles(upd);
    for (int64_t t = 0; t < 4; ++t) {
      int64_t i0 = idx[t * 2], i1 = idx[t * 2 + 1];
      if (i1 < 0) i1 += 3;
      for (int64_t e = 0; e < 2; ++e) {
        double& w = want[ravel({i0, i1, e}, dshape)];
        w = reduce_ref(red, w, u[t * 2 + e]);
      }
    }
    Node n = make_node("ScatterND", 3, {{"reduction", std::string(red)}});
    if (std::string(red) == "none") {
      // Duplicates with 'none' have no defined winner; check with the duplicate removed.
      Tensor uniq = i64({3, 2}, {0, 1, 3, -1, 2, 0});
      Tensor upd3 = Tensor::from_vector<double>({3, 2}, {u[0], u[1], u[2], u[3], u[6], u[7]});
      std::vector<double> w3 = doubles(data);
      const int64_t t_idx[3][2] = {{0, 1}, {3, 2}, {2, 0}};
      for (int t = 0; t < 3; ++t)
        for (int64_t e = 0; e < 2; ++e)
          w3[ravel({t_idx[t][0], t_idx[t][1], e}, dshape)] = upd3.ptr<double>()[t * 2 + e];
      expect_close(doubles(run_single(n, 18, {data, uniq, upd3})), w3, 0, "ScatterND none");
      continue;
    }
    expect_close(doubles(run_single(n, 18, {data, indices, upd})), want, 1e-14, std::string("ScatterND ") + red);
  }
}

TEST(ScatterND, FullIndexAndIntegerData) {
  Tensor data = Tensor::from_vector<int64_t>({2, 2}, {1, 2, 3, 4});
  Tensor idx = i64({3, 2}, {1, 1, 0, 0, 1, 1});
  Tensor upd = Tensor::from_vector<int64_t>({3}, {10, 20, 30});
  Tensor y = run_single(make_node("ScatterND", 3, {{"reduction", std::string("add")}}), 16, {data, idx, upd});
  EXPECT_EQ(doubles(y), (std::vector<double>{21, 2, 3, 44}));
}

TEST(ScatterND, OutOfRangeIndexThrowsNamingNodeAndIndex) {
  Tensor data = random_tensor<float>({4, 3}, 1, -3, 3);
  Tensor upd = random_tensor<float>({2, 3}, 2, -3, 3);
  for (int64_t bad : {4, -5, 100}) {
    try {
      run_single(make_node("ScatterND", 3), 13, {data, i64({2, 1}, {0, bad}), upd});
      ADD_FAILURE() << "index " << bad << " was accepted";
    } catch (const Error& e) {
      std::string m = e.what();
      EXPECT_NE(m.find("n_ScatterND"), std::string::npos) << m;
      EXPECT_NE(m.find("index " + std::to_string(bad)), std::string::npos) << m;
    }
  }
}

TEST(ScatterND, RejectsReductionsNotInTheOpset) {
  Tensor data = random_tensor<float>({4}, 1, -3, 3);
  Tensor upd = random_tensor<float>({1}, 2, -3, 3);
  Tensor idx = i64({1, 1}, {0});
  EXPECT_THROW(run_single(make_node("ScatterND", 3, {{"reduction", std::string("max")}}), 16, {data, idx, upd}), Error);
  EXPECT_THROW(run_single(make_node("ScatterND", 3, {{"reduction", std::string("add")}}), 13, {data, idx, upd}), Error);
  EXPECT_THROW(run_single(make_node("ScatterND", 3), 13, {data, idx, random_tensor<float>({2}, 3, -3, 3)}), Error);
}

// ---- ScatterElements and GatherElements ------------------------------------------------------------------

TEST(ScatterElements, AxesReductionsAndInt32IndicesMatchNaive) {
  const std::vector<int64_t> dshape{3, 4};
  const std::vector<int64_t> ishape{2, 3};  // smaller than data on both axes
  for (int64_t axis : {0, 1, -1})
    for (const char* red : {"add", "mul", "max", "min"}) {
      const int64_t a = axis < 0 ? axis + 2 : axis;
      std::vector<int64_t> idx = a == 0 ? std::vector<int64_t>{2, 0, -1, 2, 2, 1} : std::vector<int64_t>{3, 3, 0, -4, 1, 1};
      Tensor data = random_tensor<float>(dshape, 41, -3, 3);
      Tensor upd = random_tensor<float>(ishape, 42, -3, 3);
      std::vector<double> want = doubles(data), u = doubles(upd);
      for (int64_t i = 0; i < 6; ++i) {
        auto c = unravel(i, ishape);
        c[a] = idx[i] < 0 ? idx[i] + dshape[a] : idx[i];
        double& w = want[ravel(c, dshape)];
        w = static_cast<float>(reduce_ref(red, w, u[i]));
      }
      std::vector<int32_t> idx32(idx.begin(), idx.end());
      Node n = make_node("ScatterElements", 3, {{"axis", axis}, {"reduction", std::string(red)}});
      expect_close(doubles(run_single(n, 18, {data, i64(ishape, idx), upd})), want, 1e-6,
                   std::string("ScatterElements ") + red + " axis " + std::to_string(axis));
      expect_close(doubles(run_single(n, 18, {data, Tensor::from_vector<int32_t>(ishape, idx32), upd})), want, 1e-6,
                   std::string("ScatterElements int32 ") + red);
    }
}

TEST(ScatterElements, OutOfRangeIndexThrows) {
  Tensor data = random_tensor<double>({3, 4}, 1, -3, 3);
  try {
    run_single(make_node("ScatterElements", 3, {{"axis", int64_t{1}}}), 13,
             {data, i64({1, 2}, {0, 4}), random_tensor<double>({1, 2}, 2, -3, 3)});
    ADD_FAILURE() << "index 4 on an axis of 4 was accepted";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("n_ScatterElements"), std::string::npos) << m;
    EXPECT_NE(m.find("index 4"), std::string::npos) << m;
  }
}

TEST(GatherElements, MatchesNaiveAndThrowsOnBadIndex) {
  const std::vector<int64_t> dshape{3, 4, 2};
  Tensor data = random_tensor<double>(dshape, 51, -3, 3);
  std::mt19937 rng(52);
  for (int64_t axis : {0, 1, 2}) {
    std::vector<int64_t> ishape{2, 5, 2};  // longer than data along axis 1 is fine only when axis == 1
    if (axis != 1) ishape = {3, 3, 2};
    std::vector<int64_t> idx(numel_of(ishape));
    for (int64_t& v : idx) v = static_cast<int64_t>(rng() % (2 * dshape[axis])) - dshape[axis];
    std::vector<double> d = doubles(data), want;
    for (int64_t i = 0; i < numel_of(ishape); ++i) {
      auto c = unravel(i, ishape);
      c[axis] = idx[i] < 0 ? idx[i] + dshape[axis] : idx[i];
      want.push_back(d[ravel(c, dshape)]);
    }
    Node n = make_node("GatherElements", 2, {{"axis", axis}});
    Tensor y = run_single(n, 13, {data, i64(ishape, idx)});
    EXPECT_EQ(y.shape, ishape);
    expect_close(doubles(y), want, 0, "GatherElements axis " + std::to_string(axis));
  }
  // Large enough for the parallel path; the bad index sits in the middle.
  Tensor big = random_tensor<float>({200, 300}, 53, -3, 3);
  std::vector<int64_t> idx(200 * 300, 1);
  idx[31337] = 300;
  try {
    run_single(make_node("GatherElements", 2, {{"axis", int64_t{1}}}), 13, {big, i64({200, 300}, idx)});
    ADD_FAILURE() << "index 300 on an axis of 300 was accepted";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("n_GatherElements"), std::string::npos) << m;
    EXPECT_NE(m.find("index 300"), std::string::npos) << m;
    EXPECT_NE(m.find("[104,137]"), std::string::npos) << m;  // 31337 = 104 * 300 + 137
  }
}

// ---- GatherND --------------------------------------------------------------------------------------------

TEST(GatherND, BatchDimsMatchNaive) {
  const std::vector<int64_t> dshape{2, 3, 4};
  Tensor data = random_tensor<float>(dshape, 61, -3, 3);
  std::vector<double> d = doubles(data);
  {
    // batch_dims 0, tuples of 2: out[t, :] = data[i0, i1, :]
    std::vector<int64_t> idx{1, 2, 0, -1, 1, 0};
    Tensor y = run_single(make_node("GatherND", 2), 13, {data, i64({3, 2}, idx)});
    ASSERT_EQ(y.shape, (std::vector<int64_t>{3, 4}));
    std::vector<double> want;
    for (int t = 0; t < 3; ++t)
      for (int64_t e = 0; e < 4; ++e)
        want.push_back(d[ravel({idx[t * 2], idx[t * 2 + 1] < 0 ? idx[t * 2 + 1] + 3 : idx[t * 2 + 1], e}, dshape)]);
    expect_close(doubles(y), want, 0, "GatherND batch_dims 0");
  }
  {
    // batch_dims 1, tuples of 2 over the last two axes: out[b, t] = data[b, i0, i1]
    std::vector<int64_t> idx{0, 3, 2, 1, 1, 1, 2, 2};
    Tensor y = run_single(make_node("GatherND", 2, {{"batch_dims", int64_t{1}}}), 13, {data, i64({2, 2, 2}, idx)});
    ASSERT_EQ(y.shape, (std::vector<int64_t>{2, 2}));
    std::vector<double> want;
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t t = 0; t < 2; ++t)
        want.push_back(d[ravel({b, idx[(b * 2 + t) * 2], idx[(b * 2 + t) * 2 + 1]}, dshape)]);
    expect_close(doubles(y), want, 0, "GatherND batch_dims 1");
  }
  EXPECT_THROW(run_single(make_node("GatherND", 2), 13, {data, i64({1, 2}, {2, 0})}), Error);
}

// ---- Pad -------------------------------------------------------------------------------------------------

std::vector<double> naive_pad(const std::vector<double>& x, const std::vector<int64_t>& shape,
                              const std::vector<int64_t>& begins, const std::vector<int64_t>& ends, double value,
                              std::vector<int64_t>& out_shape) {
  out_shape.clear();
  for (size_t d = 0; d < shape.size(); ++d) out_shape.push_back(shape[d] + begins[d] + ends[d]);
  std::vector<double> y;
  for (int64_t i = 0; i < numel_of(out_shape); ++i) {
    auto c = unravel(i, out_shape);
    bool inside = true;
    for (size_t d = 0; d < shape.size(); ++d) {
      c[d] -= begins[d];
      inside = inside && c[d] >= 0 && c[d] < shape[d];
    }
    y.push_back(inside ? x[ravel(c, shape)] : value);
  }
  return y;
}

TEST(Pad, ConstantModeWithPositiveAndNegativePads) {
  const std::vector<int64_t> shape{3, 4, 5};
  Tensor x = random_tensor<float>(shape, 71, -3, 3);
  struct Case {
    std::vector<int64_t> b, e;
    std::optional<float> value;
  };
  for (const Case& c : {Case{{1, 0, 2}, {0, 3, 1}, std::nullopt}, Case{{-1, 2, 0}, {1, -2, -3}, 1.5f},
                        Case{{0, 0, 0}, {0, 0, 0}, 2.f}, Case{{-3, 0, 0}, {0, 0, 1}, std::nullopt}}) {
    std::vector<int64_t> pads = c.b;
    pads.insert(pads.end(), c.e.begin(), c.e.end());
    std::vector<int64_t> out_shape;
    auto want = naive_pad(doubles(x), shape, c.b, c.e, c.value.value_or(0.f), out_shape);
    std::vector<Tensor> in{x, i64({6}, pads)};
    if (c.value) in.push_back(Tensor::from_vector<float>({}, {*c.value}));
    Tensor y = run_single(make_node("Pad", in.size()), 13, in, {1});
    EXPECT_EQ(y.shape, out_shape);
    expect_close(doubles(y), want, 0, "Pad " + shape_string(pads));
  }
}

TEST(Pad, Opset18AxesAndOpset2Attributes) {
  const std::vector<int64_t> shape{2, 3};
  Tensor x = random_tensor<double>(shape, 72, -3, 3);
  std::vector<int64_t> out_shape;
  auto want = naive_pad(doubles(x), shape, {0, 2}, {0, -1}, -7.0, out_shape);
  Tensor y = run_single(make_node("Pad", 4), 18,
                      {x, i64({2}, {2, -1}), Tensor::from_vector<double>({1}, {-7.0}), i64({1}, {-1})}, {1, 3});
  EXPECT_EQ(y.shape, out_shape);
  expect_close(doubles(y), want, 0, "Pad with axes");
  Node old = make_node("Pad", 1, {{"pads", std::vector<int64_t>{0, 2, 0, -1}}, {"value", -7.0f}});
  Tensor y2 = run_single(old, 2, {x});
  expect_close(doubles(y2), want, 0, "Pad opset 2");
  EXPECT_THROW(
      run_single(make_node("Pad", 2, {{"mode", std::string("reflect")}}), 13, {x, i64({4}, {0, 1, 0, 1})}, {1}),
      Error);
  EXPECT_THROW(run_single(make_node("Pad", 2), 13, {x, i64({4}, {-3, 0, 0, 0})}, {1}), Error);
}

}  // namespace
}  // namespace onnxtrain
