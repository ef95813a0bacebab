// One fused gradient op timed through its native kernel and through its inlined standard-ONNX body, on the
// same inputs, alternating the two so that a loaded machine slows both alike; prints the medians and their
// ratio. Usage: bench_fused_grad [repeats]   (GatherGrad on W3's token embedding: data [1000, 128] float32,
// indices [16, 64] drawn from the W3 token range with a fixed seed).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>

#include "executor/executor.h"
#include "gradients/fused.h"

using namespace onnxtrain;

int main(int argc, char** argv) {
  const int repeats = argc > 1 ? std::atoi(argv[1]) : 51;
  const int64_t vocab = 1000, dim = 128, batch = 16, seq = 64;
  Graph g;
  Node n;
  n.name = "gather_grad";
  n.op_type = "GatherGrad";
  n.domain = kFusedGradDomain;
  n.attributes = {{"axis", int64_t{0}}};
  n.inputs = {"dY", "indices", "shape"};
  n.outputs = {"dX"};
  g.nodes.push_back(n);
  g.initializers["shape"] = TensorData::from<int64_t>({2}, std::span<const int64_t>(std::vector<int64_t>{vocab, dim}));
  g.inputs = {{"dY", {DType::Float32, Shape{Dim::of(batch), Dim::of(seq), Dim::of(dim)}}},
              {"indices", {DType::Int64, Shape{Dim::of(batch), Dim::of(seq)}}}};
  g.outputs = {{"dX", {DType::Float32, std::nullopt}}};

  std::mt19937 rng(7);
  Tensor dy = Tensor::empty(DType::Float32, {batch, seq, dim});
  std::normal_distribution<float> nd;
  for (float& v : dy.span<float>()) v = nd(rng);
  Tensor idx = Tensor::empty(DType::Int64, {batch, seq});
  std::uniform_int_distribution<int64_t> tok(0, vocab - 1);
  for (int64_t& v : idx.span<int64_t>()) v = tok(rng);
  const Tensor* feeds[2] = {&dy, &idx};

  const std::map<std::string, int64_t> opsets{{"", 17}, {kFusedGradDomain, 1}};
  ExecutorOptions native, body;
  native.functions = body.functions = fused_grad_functions();
  body.prefer_function_bodies = true;
  Executor a(g, opsets, std::make_shared<TensorStore>(), native);
  Executor b(g, opsets, std::make_shared<TensorStore>(), body);
  auto time = [&](Executor& e) {
    const auto t0 = std::chrono::steady_clock::now();
    e.run(std::span<const Tensor* const>(feeds, 2));
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  };
  for (int i = 0; i < 5; ++i) time(a), time(b);  // plans built, caches warm
  std::vector<double> ta, tb;
  for (int i = 0; i < repeats; ++i) {
    ta.push_back(time(a));
    tb.push_back(time(b));
  }
  auto median = [](std::vector<double> v) {
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    return v[v.size() / 2];
  };
  const double ma = median(ta), mb = median(tb);
  std::printf("GatherGrad [%lld,%lld,%lld] -> [%lld,%lld] float32, median of %d: native %.1f us, body %.1f us "
              "(%zu nodes), body/native %.2fx\n",
              static_cast<long long>(batch), static_cast<long long>(seq), static_cast<long long>(dim),
              static_cast<long long>(vocab), static_cast<long long>(dim), repeats, ma, mb, b.graph().nodes.size(),
              mb / ma);
  return 0;
}
