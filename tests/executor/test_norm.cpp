// Kernel tests for LayerNormalization, InstanceNormalization, GroupNormalization and BatchNormalization
// beyond the ONNX node tests (which cover small float32 cases): float64, inputs large enough for the
// threaded paths, broadcast scales, opset 18's per-group GroupNormalization, training-mode running
// statistics, and errors. The reference is written here from the ONNX definitions: for each element, the
// mean and variance of the elements sharing its "group key", computed by a coordinate loop in double.
// epsilon and momentum are float attributes, so the reference uses their float values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>

#include "executor/kernel.h"
#include "executor/kernel_test_util.h"
#include "graph/error.h"

namespace onnxtrain {
namespace {

using namespace test;

template <class T> std::vector<double> doubles(const Tensor& t) {
  std::vector<double> v;
  for (T x : t.span<T>()) v.push_back(static_cast<double>(x));
  return v;
}

// Per element: the key of the set it is normalised in (elements with equal keys share mean and variance).
using KeyFn = std::function<int64_t(const std::vector<int64_t>&)>;

struct Stats {
  std::map<int64_t, double> mean, var;
};

Stats stats(const std::vector<double>& x, const std::vector<int64_t>& shape, const KeyFn& key) {
  std::map<int64_t, double> sum, cnt;
  Stats s;
  for (size_t i = 0; i < x.size(); ++i) {
    int64_t k = key(unravel(static_cast<int64_t>(i), shape));
    sum[k] += x[i];
    cnt[k] += 1;
  }
  for (auto& [k, v] : sum) s.mean[k] = v / cnt[k];
  std::map<int64_t, double> sq;
  for (size_t i = 0; i < x.size(); ++i) {
    int64_t k = key(unravel(static_cast<int64_t>(i), shape));
    double d = x[i] - s.mean[k];
    sq[k] += d * d;
  }
  for (auto& [k, v] : sq) s.var[k] = v / cnt[k];
  return s;
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], tol * (1 + std::abs(want[i]))) << what << " element " << i;
}

template <class T> void check_layer_norm(std::vector<int64_t> shape, int64_t axis, std::vector<int64_t> sshape,
                                         bool bias, double tol) {
  const int64_t r = static_cast<int64_t>(shape.size());
  const int64_t a = axis < 0 ? axis + r : axis;
  Tensor x = random_tensor<T>(shape, 1, -2, 3);
  Tensor s = random_tensor<T>(sshape, 2, 0.5, 1.5);
  Tensor b = random_tensor<T>(sshape, 3, -1, 1);
  Node n = make_node("LayerNormalization", bias ? 3 : 2, {{"axis", axis}, {"epsilon", 1e-3f}}, "", 3);
  std::vector<Tensor> out = run_node(n, 17, bias ? std::vector<Tensor>{x, s, b} : std::vector<Tensor>{x, s});
  std::vector<double> xv = doubles<T>(x), sv = doubles<T>(s), bv = doubles<T>(b);
  std::vector<int64_t> row(shape.begin() + a, shape.end());
  KeyFn key = [&](const std::vector<int64_t>& idx) {
    std::vector<int64_t> lead(idx.begin(), idx.begin() + a), lshape(shape.begin(), shape.begin() + a);
    return lead.empty() ? 0 : ravel(lead, lshape);
  };
  Stats st = stats(xv, shape, key);
  // Scale and bias broadcast (numpy rules) against the normalised dims.
  auto param = [&](const std::vector<double>& p, const std::vector<int64_t>& idx) {
    std::vector<int64_t> pi(sshape.size());
    for (size_t d = 0; d < sshape.size(); ++d) pi[d] = sshape[d] == 1 ? 0 : idx[r - sshape.size() + d];
    return p[ravel(pi, sshape)];
  };
  std::vector<double> want(xv.size()), mean, inv;
  for (size_t i = 0; i < xv.size(); ++i) {
    auto idx = unravel(static_cast<int64_t>(i), shape);
    int64_t k = key(idx);
    want[i] = (xv[i] - st.mean[k]) / std::sqrt(st.var[k] + double(1e-3f)) * param(sv, idx) + (bias ? param(bv, idx) : 0.0);
  }
  for (auto& [k, m] : st.mean) {
    mean.push_back(m);
    inv.push_back(1 / std::sqrt(st.var[k] + double(1e-3f)));
  }
  expect_close(doubles<T>(out[0]), want, tol, "Y");
  // Mean and InvStdDev have the default stash type, float.
  expect_close(doubles<float>(out[1]), mean, std::max(tol, 1e-6), "Mean");
  expect_close(doubles<float>(out[2]), inv, std::max(tol, 1e-6), "InvStdDev");
  std::vector<int64_t> stat_shape(shape.begin(), shape.begin() + a);
  stat_shape.resize(r, 1);
  EXPECT_EQ(out[1].shape, stat_shape);
  EXPECT_EQ(out[1].dtype, DType::Float32);
  EXPECT_EQ(out[2].dtype, DType::Float32);
}

TEST(LayerNormKernel, Float64LastAxis) { check_layer_norm<double>({3, 4, 7}, -1, {7}, true, 1e-12); }
TEST(LayerNormKernel, Float64Axis1NoBias) { check_layer_norm<double>({3, 4, 7}, 1, {4, 7}, false, 1e-12); }
TEST(LayerNormKernel, BroadcastScale) { check_layer_norm<double>({2, 3, 4, 5}, 1, {3, 1, 5}, true, 1e-12); }
TEST(LayerNormKernel, Float32LargeThreaded) { check_layer_norm<float>({256, 384}, -1, {384}, true, 1e-4); }

TEST(LayerNormKernel, BadScaleShapeNamesIt) {
  Node n = make_node("LayerNormalization", 2);
  Tensor x = random_tensor<float>({2, 3}, 1, -1, 1), s = random_tensor<float>({4}, 2, -1, 1);
  try {
    run_node(n, 17, {x, s});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Scale"), std::string::npos) << e.what();
  }
}

// Instance (groups == channels) and group normalisation: key = (n, channel / (C / groups)).
template <class T> void check_group(const std::string& op, int64_t opset, std::vector<int64_t> shape, int64_t groups,
                                    double tol) {
  const int64_t c = shape[1], per = c / groups;
  const bool per_group_params = op == "GroupNormalization" && opset < 21;
  const int64_t np = per_group_params ? groups : c;
  Tensor x = random_tensor<T>(shape, 4, -1, 2);
  Tensor s = random_tensor<T>({np}, 5, 0.5, 1.5);
  Tensor b = random_tensor<T>({np}, 6, -1, 1);
  std::map<std::string, Attribute> attrs{{"epsilon", 1e-2f}};
  if (op == "GroupNormalization") attrs["num_groups"] = groups;
  Tensor y = run_single(make_node(op, 3, attrs), opset, {x, s, b});
  std::vector<double> xv = doubles<T>(x), sv = doubles<T>(s), bv = doubles<T>(b);
  KeyFn key = [&](const std::vector<int64_t>& idx) { return idx[0] * groups + idx[1] / per; };
  Stats st = stats(xv, shape, key);
  std::vector<double> want(xv.size());
  for (size_t i = 0; i < xv.size(); ++i) {
    auto idx = unravel(static_cast<int64_t>(i), shape);
    int64_t k = key(idx), p = per_group_params ? idx[1] / per : idx[1];
    want[i] = (xv[i] - st.mean[k]) / std::sqrt(st.var[k] + double(1e-2f)) * sv[p] + bv[p];
  }
  expect_close(doubles<T>(y), want, tol, op);
}

// onnxtrain.LayerNormalizationGrad on an input large enough for the threaded path (per-thread column sums).
// Reference: dScale and dBias by their definitions (column sums), dX by the closed form
// inv * (g - mean(g) - xhat * mean(g * xhat)) with g = dY * scale, evaluated per row in double.
TEST(LayerNormGradKernel, Float32LargeThreaded) {
  const int64_t rows = 512, d = 64;
  Tensor dy = random_tensor<float>({rows, d}, 21, -1, 1), x = random_tensor<float>({rows, d}, 22, -2, 2);
  Tensor s = random_tensor<float>({d}, 23, 0.5, 1.5);
  Tensor mean = random_tensor<float>({rows, 1}, 24, -0.5, 0.5), inv = random_tensor<float>({rows, 1}, 25, 0.5, 2);
  std::vector<Tensor> out =
      run_node(make_node("LayerNormalizationGrad", 5, {}, "onnxtrain", 3), 1, {dy, x, s, mean, inv});
  std::vector<double> dxw(rows * d), dsw(d, 0.0), dbw(d, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    double mg = 0, mgx = 0;
    const double m = mean.ptr<float>()[r], is = inv.ptr<float>()[r];
    auto xhat = [&](int64_t j) { return (x.ptr<float>()[r * d + j] - m) * is; };
    auto g = [&](int64_t j) { return static_cast<double>(dy.ptr<float>()[r * d + j]) * s.ptr<float>()[j]; };
    for (int64_t j = 0; j < d; ++j) {
      mg += g(j) / d;
      mgx += g(j) * xhat(j) / d;
      dsw[j] += dy.ptr<float>()[r * d + j] * xhat(j);
      dbw[j] += dy.ptr<float>()[r * d + j];
    }
    for (int64_t j = 0; j < d; ++j) dxw[r * d + j] = is * (g(j) - mg - xhat(j) * mgx);
  }
  expect_close(doubles<float>(out[0]), dxw, 1e-4, "dX");
  expect_close(doubles<float>(out[1]), dsw, 1e-4, "dScale");
  expect_close(doubles<float>(out[2]), dbw, 1e-4, "dBias");
  EXPECT_EQ(out[1].shape, (std::vector<int64_t>{d}));
}

TEST(InstanceNormKernel, Float64) { check_group<double>("InstanceNormalization", 6, {2, 3, 4, 5}, 3, 1e-12); }
TEST(InstanceNormKernel, Float32LargeThreaded) {
  check_group<float>("InstanceNormalization", 6, {4, 16, 32, 32}, 16, 1e-4);
}
TEST(GroupNormKernel, Opset21PerChannel) { check_group<double>("GroupNormalization", 21, {2, 6, 3, 2}, 3, 1e-12); }
TEST(GroupNormKernel, Opset18PerGroup) { check_group<double>("GroupNormalization", 18, {2, 6, 5}, 2, 1e-12); }
TEST(GroupNormKernel, Float32LargeThreaded) { check_group<float>("GroupNormalization", 21, {4, 32, 24, 24}, 8, 1e-4); }

TEST(GroupNormKernel, GroupsMustDivideChannels) {
  Tensor x = random_tensor<float>({2, 6, 2}, 1, -1, 1), s = random_tensor<float>({6}, 2, -1, 1);
  EXPECT_THROW(run_node(make_node("GroupNormalization", 3, {{"num_groups", int64_t{4}}}), 21, {x, s, s}), Error);
}

template <class T> void check_batch_norm(std::vector<int64_t> shape, bool training, double tol) {
  const int64_t c = shape[1];
  Tensor x = random_tensor<T>(shape, 7, -1, 3);
  Tensor s = random_tensor<T>({c}, 8, 0.5, 1.5), b = random_tensor<T>({c}, 9, -1, 1);
  Tensor m = random_tensor<T>({c}, 10, -1, 1), v = random_tensor<T>({c}, 11, 0.5, 2);
  std::map<std::string, Attribute> attrs{{"epsilon", 1e-3f}, {"momentum", 0.7f}};
  if (training) attrs["training_mode"] = int64_t{1};
  std::vector<Tensor> out = run_node(make_node("BatchNormalization", 5, attrs, "", training ? 3 : 1), 15, {x, s, b, m, v});
  std::vector<double> xv = doubles<T>(x), sv = doubles<T>(s), bv = doubles<T>(b), mv = doubles<T>(m),
                      vv = doubles<T>(v);
  Stats st = stats(xv, shape, [](const std::vector<int64_t>& idx) { return idx[1]; });
  std::vector<double> want(xv.size());
  for (size_t i = 0; i < xv.size(); ++i) {
    int64_t ch = unravel(static_cast<int64_t>(i), shape)[1];
    double mean = training ? st.mean[ch] : mv[ch], var = training ? st.var[ch] : vv[ch];
    want[i] = (xv[i] - mean) / std::sqrt(var + double(1e-3f)) * sv[ch] + bv[ch];
  }
  expect_close(doubles<T>(out[0]), want, tol, "Y");
  if (!training) return;
  // momentum is a float attribute: blend with its float value, as the kernel must.
  const double mom = 0.7f;
  std::vector<double> rm(c), rv(c);
  for (int64_t ch = 0; ch < c; ++ch) {
    rm[ch] = mv[ch] * mom + st.mean[ch] * (1 - mom);
    rv[ch] = vv[ch] * mom + st.var[ch] * (1 - mom);
  }
  expect_close(doubles<T>(out[1]), rm, tol, "running_mean");
  expect_close(doubles<T>(out[2]), rv, tol, "running_var");
}

TEST(BatchNormKernel, InferenceFloat64) { check_batch_norm<double>({3, 4, 5}, false, 1e-12); }
TEST(BatchNormKernel, Inference2D) { check_batch_norm<double>({5, 4}, false, 1e-12); }
TEST(BatchNormKernel, TrainingFloat64) { check_batch_norm<double>({3, 4, 2, 5}, true, 1e-12); }
TEST(BatchNormKernel, TrainingFloat32LargeThreaded) { check_batch_norm<float>({8, 16, 20, 20}, true, 1e-4); }

TEST(BatchNormKernel, RunningStatsNeedTrainingMode) {
  Tensor x = random_tensor<float>({2, 3}, 1, -1, 1), p = random_tensor<float>({3}, 2, 0.5, 1);
  EXPECT_THROW(run_node(make_node("BatchNormalization", 5, {}, "", 3), 15, {x, p, p, p, p}), Error);
}

}  // namespace
}  // namespace onnxtrain
