// Behaviour of the Dropout kernel (executor/cpu/dropout.cpp) that the ONNX node tests do not pin down: its
// randomness across runs, seeded or not.
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

}  // namespace
}  // namespace onnxtrain
