// Behaviour of the misc kernels that the ONNX node tests do not pin down: Dropout's randomness across runs
// (seeded or not) and Einsum's diagonals and broadcasting ellipsis, against hand-written loops.
#include <gtest/gtest.h>

#include <cmath>

#include "executor/executor.h"
#include "graph/error.h"

namespace onnxtrain {
namespace {

// A one-node Dropout graph: x float32[n] fed, ratio and training_mode as initializers.
Graph dropout_graph(int64_t n, float ratio, bool training, std::optional<int64_t> seed) {
  Graph g;
  g.inputs.push_back({"x", {DType::Float32, Shape{Dim::of(n)}}});
  g.initializers["ratio"] = TensorData::scalar<float>(ratio);
  TensorData tm;
  tm.dtype = DType::Bool;
  tm.bytes.push_back(std::byte{training ? uint8_t{1} : uint8_t{0}});
  g.initializers["mode"] = tm;
  Node d;
  d.name = "drop";
  d.op_type = "Dropout";
  d.inputs = {"x", "ratio", "mode"};
  d.outputs = {"y", "mask"};
  if (seed) d.attributes["seed"] = *seed;
  g.nodes.push_back(d);
  g.outputs.push_back({"y", {DType::Float32, Shape{Dim::of(n)}}});
  g.outputs.push_back({"mask", {DType::Bool, Shape{Dim::of(n)}}});
  return g;
}

std::map<std::string, Tensor> ones_feed(int64_t n) {
  Tensor x = Tensor::empty(DType::Float32, {n});
  for (float& v : x.span<float>()) v = 1.0f;
  std::map<std::string, Tensor> f;
  f["x"] = std::move(x);
  return f;
}

std::vector<bool> mask_of(const Tensor& t) {
  std::vector<bool> m;
  for (int64_t i = 0; i < t.numel(); ++i) m.push_back(t.ptr<bool>()[i]);
  return m;
}

TEST(Dropout, TrainingScalesKeptElementsAndDropsAboutRatio) {
  const int64_t n = 4000;
  Executor ex(dropout_graph(n, 0.25f, true, std::nullopt), {{"", 13}}, std::make_shared<TensorStore>());
  std::vector<Tensor> a = ex.run(ones_feed(n));
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    const bool m = a[1].ptr<bool>()[i];
    kept += m;
    EXPECT_FLOAT_EQ(a[0].ptr<float>()[i], m ? 1.0f / 0.75f : 0.0f) << i;
  }
  // Binomial(4000, 0.75): the standard deviation is about 27, so +-150 is over 5 sigma.
  EXPECT_NEAR(static_cast<double>(kept), 3000.0, 150.0);
  // Without a seed the generator runs on: the next step draws a different mask.
  std::vector<Tensor> b = ex.run(ones_feed(n));
  EXPECT_NE(mask_of(a[1]), mask_of(b[1]));
}

TEST(Dropout, SeedGivesTheSameMaskEveryRun) {
  const int64_t n = 500;
  Executor ex(dropout_graph(n, 0.5f, true, 42), {{"", 13}}, std::make_shared<TensorStore>());
  std::vector<Tensor> a = ex.run(ones_feed(n));
  std::vector<Tensor> b = ex.run(ones_feed(n));
  EXPECT_EQ(mask_of(a[1]), mask_of(b[1]));
  Executor other(dropout_graph(n, 0.5f, true, 43), {{"", 13}}, std::make_shared<TensorStore>());
  EXPECT_NE(mask_of(a[1]), mask_of(other.run(ones_feed(n))[1]));
}

TEST(Dropout, InferenceModeIsIdentityWithFullMask) {
  const int64_t n = 64;
  Executor ex(dropout_graph(n, 0.5f, false, 1), {{"", 13}}, std::make_shared<TensorStore>());
  std::vector<Tensor> a = ex.run(ones_feed(n));
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(a[0].ptr<float>()[i], 1.0f);
    EXPECT_TRUE(a[1].ptr<bool>()[i]);
  }
}

// A one-node Einsum graph over float64 inputs.
std::vector<Tensor> einsum(const std::string& eq, const std::vector<Tensor>& xs) {
  Graph g;
  Node e;
  e.name = "ein";
  e.op_type = "Einsum";
  e.attributes["equation"] = eq;
  std::map<std::string, Tensor> feed;
  for (size_t i = 0; i < xs.size(); ++i) {
    const std::string name = "x" + std::to_string(i);
    Shape s;
    for (int64_t d : xs[i].shape) s.push_back(Dim::of(d));
    g.inputs.push_back({name, {DType::Float64, s}});
    e.inputs.push_back(name);
    feed[name] = xs[i].clone();
  }
  e.outputs = {"y"};
  g.nodes.push_back(e);
  g.outputs.push_back({"y", {DType::Float64, std::nullopt}});
  Executor ex(g, {{"", 13}}, std::make_shared<TensorStore>());
  return ex.run(feed);
}

Tensor iota(std::vector<int64_t> shape, double scale) {
  Tensor t = Tensor::empty(DType::Float64, std::move(shape));
  double v = 0;
  for (double& x : t.span<double>()) x = (v += 1) * scale - 1.3;
  return t;
}

TEST(Einsum, DiagonalAndTrace) {
  Tensor a = iota({3, 3}, 0.7);
  Tensor d = einsum("ii->i", {a})[0];
  ASSERT_EQ(d.shape, (std::vector<int64_t>{3}));
  double trace = 0;
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_DOUBLE_EQ(d.ptr<double>()[i], a.ptr<double>()[i * 3 + i]);
    trace += a.ptr<double>()[i * 3 + i];
  }
  Tensor t = einsum("ii", {a})[0];
  ASSERT_EQ(t.numel(), 1);
  EXPECT_NEAR(t.ptr<double>()[0], trace, 1e-12);
}

TEST(Einsum, EllipsisBroadcastsBatchDims) {
  // [2, 1, 3, 4] x [5, 4, 2] over the batch dims [2, 1] and [5] -> [2, 5, 3, 2].
  Tensor a = iota({2, 1, 3, 4}, 0.1), b = iota({5, 4, 2}, 0.05);
  Tensor y = einsum("...ij,...jk->...ik", {a, b})[0];
  ASSERT_EQ(y.shape, (std::vector<int64_t>{2, 5, 3, 2}));
  for (int64_t p = 0; p < 2; ++p)
    for (int64_t q = 0; q < 5; ++q)
      for (int64_t i = 0; i < 3; ++i)
        for (int64_t k = 0; k < 2; ++k) {
          double want = 0;
          for (int64_t j = 0; j < 4; ++j) want += a.ptr<double>()[(p * 3 + i) * 4 + j] * b.ptr<double>()[(q * 4 + j) * 2 + k];
          EXPECT_NEAR(y.ptr<double>()[((p * 5 + q) * 3 + i) * 2 + k], want, 1e-12);
        }
}

TEST(Einsum, MismatchedIndexSizesFailNamingTheIndex) {
  try {
    einsum("ij,jk->ik", {iota({2, 3}, 1), iota({4, 2}, 1)});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("index 'j'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace onnxtrain
