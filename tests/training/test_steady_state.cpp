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

struct Setup {
  const char* name;
  void (*apply)(TrainingConfig&);
};

// Plain SGD and every optimizer feature whose state or schedule could allocate per step.
const Setup kSetups[] = {
    {"sgd", [](TrainingConfig&) {}},
    {"nesterov", [](TrainingConfig& c) { c.optimizer.momentum = 0.9; c.optimizer.nesterov = true; }},
    {"adam_amsgrad_clip",
     [](TrainingConfig& c) { c.optimizer.kind = "adam"; c.optimizer.amsgrad = true; c.optimizer.max_grad_norm = 1.0; }},
    {"adamw_groups_step_schedule",
     [](TrainingConfig& c) {
       c.optimizer.kind = "adamw";
       c.optimizer.groups = {{{"*.bias"}, 0.1, 0.0}};
       c.schedule.kind = "step";
       c.schedule.step_size = 3;
     }},
    {"adagrad_accumulate_l2",
     [](TrainingConfig& c) {
       c.optimizer.kind = "adagrad";
       c.optimizer.gradient_accumulation = 2;
       c.penalty.l2 = 0.01;
     }},
    {"onnx_momentum",
     [](TrainingConfig& c) { c.optimizer.momentum = 0.9; c.optimizer.convention = "onnx"; c.optimizer.beta = 0.5; }},
};

class SteadyState : public ::testing::TestWithParam<Setup> {};

TEST_P(SteadyState, TrainStepAllocatesNothing) {
  auto dir = test::temp_dir(std::string("steady_") + GetParam().name);  // ctest runs cases in parallel
  auto path = dir / "mlp.onnx";
  std::string cmd = std::string(ONNXTRAIN_PYTHON) + " " + (test::source_dir() / "examples/make_mlp.py").string() + " " +
                    path.string() + " --sizes 16 32 1 > /dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  TrainingConfig cfg;
  GetParam().apply(cfg);
  TrainingSession s = TrainingSession::from_file(path, cfg);
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

INSTANTIATE_TEST_SUITE_P(Optimizers, SteadyState, ::testing::ValuesIn(kSetups),
                         [](const ::testing::TestParamInfo<Setup>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace onnxtrain
