// A steady-state training step allocates nothing: every buffer comes from the plan compiled on the first step.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <new>

#include "common/test_env.h"
#include "training/session.h"

namespace {
std::atomic<bool> g_counting{false};
std::atomic<long> g_allocations{0};
}  // namespace

void* operator new(std::size_t n) {
  if (g_counting.load(std::memory_order_relaxed)) g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace onnxtrain {
namespace {

TEST(SteadyState, TrainStepAllocatesNothing) {
  auto dir = test::temp_dir("steady");
  auto path = dir / "mlp.onnx";
  std::string cmd = std::string(ONNXTRAIN_PYTHON) + " " + (test::source_dir() / "examples/make_mlp.py").string() + " " +
                    path.string() + " --sizes 16 32 1 > /dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  TrainingSession s = TrainingSession::from_file(path, {});
  Tensor x = Tensor::empty(DType::Float32, {8, 16});
  Tensor y = Tensor::empty(DType::Float32, {8, 1});
  for (float& v : x.span<float>()) v = 0.5f;
  Feeds f{{"x", x}, {s.target_name(), y}};
  s.train_step(f);  // compiles the plan
  s.train_step(f);
  g_allocations = 0;
  g_counting = true;
  float loss = 0;
  for (int i = 0; i < 20; ++i) loss += s.train_step(f);
  g_counting = false;
  EXPECT_EQ(g_allocations.load(), 0) << "heap allocations during 20 steady-state training steps";
  EXPECT_TRUE(std::isfinite(loss));
  // A new batch size compiles a second plan; going back reuses the first.
  Tensor x2 = Tensor::empty(DType::Float32, {4, 16});
  Tensor y2 = Tensor::empty(DType::Float32, {4, 1});
  s.train_step({{"x", x2}, {s.target_name(), y2}});
  g_allocations = 0;
  g_counting = true;
  s.train_step(f);
  g_counting = false;
  EXPECT_EQ(g_allocations.load(), 0) << "switching back to a cached plan allocated";
}

}  // namespace
}  // namespace onnxtrain
