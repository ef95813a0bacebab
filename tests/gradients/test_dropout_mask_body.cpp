// onnxtrain.DropoutMask's standard-ONNX body (gradients/fused_dropout.cpp) against its native kernel and against
// the formula written out again here in uint64 (docs/lora.md, Dropout): the same mask bit for bit, so that another
// runtime running a checkpoint's training forward draws the masks onnxtrain draws.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "executor/executor.h"
#include "gradients/fused.h"
#include "gradients/fused_graph.h"

namespace onnxtrain {
namespace {

uint64_t splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// The documented draw: run = splitmix64(splitmix64(seed) ^ counter), keep i when
// (splitmix64(run + i) >> 11) * 2^-53 >= ratio, the float ratio widened to double.
std::vector<bool> reference_mask(int64_t seed, int64_t counter, float ratio, int64_t n) {
  const uint64_t run = splitmix64(splitmix64(static_cast<uint64_t>(seed)) ^ static_cast<uint64_t>(counter));
  std::vector<bool> keep;
  for (int64_t i = 0; i < n; ++i)
    keep.push_back(static_cast<double>(splitmix64(run + static_cast<uint64_t>(i)) >> 11) * 0x1.0p-53 >=
                   static_cast<double>(ratio));
  return keep;
}

// The reference's splitmix64 is the published one: the first outputs of the generator seeded with 0.
TEST(DropoutMaskBody, ReferenceIsSplitmix64) {
  EXPECT_EQ(splitmix64(0), 0xe220a8397b1dcdafULL);
  EXPECT_EQ(splitmix64(0x9e3779b97f4a7c15ULL), 0x6e789e6aa1b965f4ULL);
}

struct Drawn {
  std::vector<bool> mask;
  std::vector<int64_t> shape;
  size_t nodes = 0;  // nodes of the executor's graph: 1 native, the inlined body otherwise
};

Drawn run_mask(const std::vector<int64_t>& shape, DType dtype, int64_t seed, int64_t counter, float ratio, bool body) {
  const Graph g = fused_op_graph("DropoutMask", {{"seed", seed}, {"ratio", ratio}}, {"x", "counter"},
                                 {{"x", static_type(dtype, shape)}, {"counter", static_type(DType::Int64, {})}},
                                 {"mask"}, DType::Bool);
  ExecutorOptions options;
  options.functions = fused_grad_functions();
  options.prefer_function_bodies = body;
  Executor e(g, {{"", 17}, {kFusedGradDomain, 1}}, std::make_shared<TensorStore>(), options);
  Tensor x = Tensor::empty(dtype, shape);  // the mask depends on x's shape only
  std::map<std::string, Tensor> feeds{{"x", x}, {"counter", Tensor::from_vector<int64_t>({}, {counter})}};
  std::vector<Tensor> out = e.run(feeds);
  Drawn r;
  r.nodes = e.graph().nodes.size();
  r.shape = out.at(0).shape;
  EXPECT_EQ(out[0].dtype, DType::Bool);
  for (int64_t i = 0; i < out[0].numel(); ++i) r.mask.push_back(out[0].ptr<bool>()[i]);
  return r;
}

TEST(DropoutMaskBody, InlinedBodyDrawsTheKernelsMaskBitForBit) {
  struct Case {
    std::vector<int64_t> shape;
    int64_t seed, counter;
    float ratio;
  };
  const int64_t big = std::numeric_limits<int64_t>::max(), small = std::numeric_limits<int64_t>::min();
  const std::vector<Case> cases = {
      {{7}, 0, 0, 0.5f},
      {{3, 5}, 7, 3, 0.3f},
      {{2, 3, 4}, -1, 41, 0.1f},
      {{4, 1, 3, 2}, small, 1'000'000'007, 0.9f},
      {{33, 17}, big, big, 0.5f},                       // run + i wraps past 2^64 for some runs
      {{1}, 0x5a17c0de12345678, 1, 0.999f},
      {{5, 6}, -0x3c6ef372fe94f82b, small, 0.0f},       // ratio 0 keeps everything
      {{2, 0, 3}, 11, 2, 0.5f},                          // empty: the mask keeps x's shape
      {{64, 50}, static_cast<int64_t>(0xcbf29ce484222325ULL), 20, 0.25f},  // FNV-1a's basis, as branch seeds are
  };
  for (const Case& c : cases) {
    int64_t n = 1;
    for (int64_t d : c.shape) n *= d;
    const std::vector<bool> expected = reference_mask(c.seed, c.counter, c.ratio, n);
    for (DType t : {DType::Float32, DType::Float64}) {
      SCOPED_TRACE("seed " + std::to_string(c.seed) + ", counter " + std::to_string(c.counter) + ", ratio " +
                   std::to_string(c.ratio) + ", " + std::to_string(n) + " elements, " + dtype_name(t));
      const Drawn native = run_mask(c.shape, t, c.seed, c.counter, c.ratio, false);
      const Drawn body = run_mask(c.shape, t, c.seed, c.counter, c.ratio, true);
      ASSERT_EQ(native.nodes, 1u) << "the native run must not inline";
      ASSERT_GT(body.nodes, 1u) << "the body run must inline";
      EXPECT_EQ(native.shape, c.shape);
      EXPECT_EQ(body.shape, c.shape);
      EXPECT_EQ(native.mask, expected) << "the kernel";
      EXPECT_EQ(body.mask, expected) << "the body";
    }
  }
}

// The cases above are not vacuous: ratio 0 keeps every element, the others drop about `ratio` of them, and the
// masks differ between counters (so the counter reaches the draw) and between seeds.
TEST(DropoutMaskBody, MasksDependOnSeedCounterAndRatio) {
  const std::vector<int64_t> shape{40, 50};
  auto kept = [](const std::vector<bool>& m) {
    int64_t k = 0;
    for (bool b : m) k += b;
    return static_cast<double>(k) / static_cast<double>(m.size());
  };
  EXPECT_EQ(kept(run_mask(shape, DType::Float32, 3, 0, 0.0f, true).mask), 1.0);
  const std::vector<bool> a = run_mask(shape, DType::Float32, 3, 0, 0.3f, true).mask;
  EXPECT_NEAR(kept(a), 0.7, 0.05);
  EXPECT_NE(run_mask(shape, DType::Float32, 3, 1, 0.3f, true).mask, a);
  EXPECT_NE(run_mask(shape, DType::Float32, 4, 0, 0.3f, true).mask, a);
  EXPECT_NEAR(kept(run_mask(shape, DType::Float32, 3, 0, 0.9f, true).mask), 0.1, 0.03);
}

}  // namespace
}  // namespace onnxtrain
