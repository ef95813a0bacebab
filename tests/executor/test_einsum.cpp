// Behaviour of the Einsum kernel (executor/cpu/einsum.cpp) that the ONNX node tests do not pin down: diagonals
// and broadcasting ellipsis, against hand-written loops.
#include <gtest/gtest.h>

#include <cmath>

#include "executor/executor.h"
#include "graph/error.h"

namespace onnxtrain {
namespace {

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
