#pragma once
// The small ReLU MLP the training tests build in memory: x [N, in] -> fc1 (Gemm, transB=1) -> Relu -> fc2 -> y
// [N, 1], with the weight names torch's nn.Linear would have.
#include <random>
#include <span>
#include <string>
#include <vector>

#include "graph/builder.h"
#include "graph/dtype.h"
#include "graph/ir.h"
#include "graph/shape_inference.h"

namespace onnxtrain::test {

// fc2 as torch exports it, Gemm(transB=1) by a [1, hidden] weight, or as MatMul by a [hidden, 1] weight then Add.
enum class Fc2 { Gemm, MatMulAdd };

// Element type T (float or double). Weights are standard normal draws from mt19937(seed) times 0.5 (fc1.weight),
// 0.1 (the biases) and fc2_scale (fc2.weight), drawn in that order.
template <class T>
Model relu_mlp(const std::string& name, int64_t in, int64_t hidden, unsigned seed, T fc2_scale, Fc2 fc2) {
  const DType t = dtype_of<T>();
  Model m;
  m.opset_imports[""] = 17;
  Graph& g = m.graph;
  g.name = name;
  GraphBuilder b(g);
  b.add_input("x", TypeInfo{t, Shape{Dim::sym("N"), Dim::of(in)}});
  std::mt19937 rng(seed);
  std::normal_distribution<T> nd;
  auto init = [&](const std::string& w, std::vector<int64_t> dims, T scale) {
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    std::vector<T> v(static_cast<size_t>(n));
    for (T& x : v) x = nd(rng) * scale;
    g.initializers[w] = TensorData::from<T>(dims, std::span<const T>(v));
  };
  init("fc1.weight", {hidden, in}, T(0.5));
  init("fc1.bias", {hidden}, T(0.1));
  init("fc2.weight", fc2 == Fc2::Gemm ? std::vector<int64_t>{1, hidden} : std::vector<int64_t>{hidden, 1}, fc2_scale);
  init("fc2.bias", {1}, T(0.1));
  const std::string h = b.add("Gemm", {"x", "fc1.weight", "fc1.bias"}, {{"transB", int64_t{1}}});
  const std::string r = b.add("Relu", {h});
  if (fc2 == Fc2::Gemm) {
    b.add_node("Gemm", {r, "fc2.weight", "fc2.bias"}, 1, {{"transB", int64_t{1}}}, {}, {"y"});
  } else {
    const std::string z = b.add("MatMul", {r, "fc2.weight"});
    b.add_node("Add", {z, "fc2.bias"}, 1, {}, {}, {"y"});
  }
  b.add_output("y", TypeInfo{t, Shape{Dim::sym("N"), Dim::of(1)}});
  infer_shapes(m);
  return m;
}

}  // namespace onnxtrain::test
