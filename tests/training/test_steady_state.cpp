// A steady-state training step allocates nothing through operator new: every buffer comes from the plan compiled
// on the first step. Allocations at the C level (malloc, calloc, realloc, aligned allocations, from any library:
// oneDNN's workspaces, libgomp's thread teams, Eigen temporaries) are counted too for the benchmark workloads,
// and they are zero as well where the build has AVX-512.
#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <new>
#include <random>

#include "benchmarks/token_logits.h"
#include "common/test_env.h"
#include "executor/cpu/direct_conv.h"
#include "executor/cpu/gemm.h"
#include "graph/model_io.h"
#include "training/replicas.h"
#include "training/session.h"

// AddressSanitizer owns malloc: defining malloc here would bypass its allocator, and an ASan build of this binary
// then dies at start-up (asan_posix.cpp "tsd_key_inited"). Under ASan the hooks are left out and the tests skip;
// the release build runs them.
namespace {
constexpr bool kCounting = !onnxtrain::test::kUnderAsan;
constexpr const char* kNoCountingUnderAsan = "allocation counting replaces malloc, which AddressSanitizer owns";
std::atomic<bool> g_counting{false};
std::atomic<long> g_allocations{0};    // operator new
std::atomic<long> g_c_allocations{0};  // malloc & co., operator new included
}  // namespace

#if !ONNXTRAIN_TEST_UNDER_ASAN
namespace {
void count() {
  if (g_counting.load(std::memory_order_relaxed)) g_c_allocations.fetch_add(1, std::memory_order_relaxed);
}
}  // namespace

// glibc's own entry points; defining malloc & co. in the executable interposes them for every library.
extern "C" {
void* __libc_malloc(std::size_t);
void* __libc_calloc(std::size_t, std::size_t);
void* __libc_realloc(void*, std::size_t);
void* __libc_memalign(std::size_t, std::size_t);

void* malloc(std::size_t n) {
  count();
  return __libc_malloc(n);
}
void* calloc(std::size_t n, std::size_t size) {
  count();
  return __libc_calloc(n, size);
}
void* realloc(void* p, std::size_t n) {
  count();
  return __libc_realloc(p, n);
}
void* aligned_alloc(std::size_t alignment, std::size_t n) {
  count();
  return __libc_memalign(alignment, n);
}
void* memalign(std::size_t alignment, std::size_t n) {
  count();
  return __libc_memalign(alignment, n);
}
int posix_memalign(void** out, std::size_t alignment, std::size_t n) {
  count();
  void* p = __libc_memalign(alignment, n);
  if (!p) return ENOMEM;
  *out = p;
  return 0;
}
}

// GCC pairs these replacements with the library's new and warns that free() meets new'd memory; here both sides
// are malloc/free.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(std::size_t n) {
  if (g_counting.load(std::memory_order_relaxed)) g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#endif

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
    // bfloat16 products (native bf16_gemm where the CPU has AVX-512 BF16, with its per-thread buffers), the casts
    // and the loss-scale guard.
    {"adam_bfloat16", [](TrainingConfig& c) { c.optimizer.kind = "adam"; c.mixed_precision.dtype = "bfloat16"; }},
};

// operator new calls (on any thread) during `steps` calls of step(), whose losses add into `loss`.
template <class Step> long new_during(int steps, Step step, float& loss) {
  g_allocations = 0;
  g_counting = true;
  for (int i = 0; i < steps; ++i) loss += step();
  g_counting = false;
  return g_allocations.load();
}

class SteadyState : public ::testing::TestWithParam<Setup> {};

TEST_P(SteadyState, TrainStepAllocatesNothing) {
  if (!kCounting) GTEST_SKIP() << kNoCountingUnderAsan;
  auto dir = test::temp_dir(std::string("steady_") + GetParam().name);  // ctest runs cases in parallel
  auto path = dir / "mlp.onnx";
  std::string cmd = test::python() + " " + (test::source_dir() / "examples/make_mlp.py").string() + " " +
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
  float loss = 0;
  EXPECT_EQ(new_during(20, [&] { return s.train_step(f); }, loss), 0)
      << "heap allocations during 20 steady-state training steps";
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

// Replicas (training/replicas.h): splitting the batch, handing the step to the worker, the shared-memory
// allreduce and the waits allocate nothing either, on any thread (the counter is process-wide).
TEST(SteadyStateReplicas, ReplicatedStepAllocatesNothing) {
  if (!kCounting) GTEST_SKIP() << kNoCountingUnderAsan;
  auto dir = test::temp_dir("steady_replicas");
  auto path = dir / "mlp.onnx";
  std::string cmd = test::python() + " " + (test::source_dir() / "examples/make_mlp.py").string() + " " +
                    path.string() + " --sizes 16 32 1 > /dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  TrainingConfig cfg;
  cfg.optimizer.kind = "adam";
  ReplicatedSession s(load_model(path), cfg, 2);
  for (const int64_t rows : {8, 7}) {  // equal parts, and unequal ones weighted by their rows
    Tensor x = Tensor::empty(DType::Float32, {rows, 16});
    Tensor y = Tensor::empty(DType::Float32, {rows, 1});
    for (float& v : x.span<float>()) v = 0.5f;
    Feeds f{{"x", x}, {s.primary().target_name(), y}};
    s.train_step(f);  // compiles the plans, builds the per-replica views
    s.train_step(f);
    float loss = 0;
    EXPECT_EQ(new_during(20, [&] { return s.train_step(f); }, loss), 0)
        << "heap allocations during 20 replicated steps of " << rows << " rows";
    EXPECT_TRUE(std::isfinite(loss));
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, SteadyState, ::testing::ValuesIn(kSetups),
                         [](const ::testing::TestParamInfo<Setup>& i) { return std::string(i.param.name); });

// The four benchmark workloads of ../shared/bench (next to the repository), at their benchmark shapes, losses and
// optimizers (benchmarks/bench_train.cpp): W1 MLP + Adam, W2 CNN + nesterov SGD, W3 transformer + AdamW, W4 tiny
// MLP + SGD at batch 1. Counting, not timing.
//
// The target is zero allocations of either kind, and all four meet it on one thread and two where the build has
// AVX-512: their float32 products run onnxtrain's own GEMM (executor/cpu/gemm.h) and W2's convolutions its own
// convolutions (executor/cpu/direct_conv.h), which work in per-thread buffers made by their first call. Without
// AVX-512 (`fallback` below) the products call dnnl_sgemm, which mallocs a workspace per call and, on two threads,
// wraps its parallel body in a std::function (W1 5 operator new / 16 C-level, W3 39 / 117 at most), and W2's
// convolutions run oneDNN primitives, whose every execute() builds its argument map on the heap (5 operator new per
// execute, 17 executes per step with the reorders: 98 / 107 at most). Those bounds are the counts measured when
// they were the main path (the larger of OMP_NUM_THREADS=1 and 2), so that any new allocation fails here.
struct Bound {
  double new_per_step, c_per_step;
};
struct Workload {
  const char* name;
  int64_t batch;
  void (*apply)(TrainingConfig&);
  Bound bound, fallback;  // with onnxtrain's GEMM and convolutions, and with oneDNN's instead (no AVX-512)
};

const Workload kWorkloads[] = {
    {"w1", 128, [](TrainingConfig& c) { c.optimizer.kind = "adam"; c.optimizer.learning_rate = 1e-3; }, {0, 0},
     {5, 16}},
    {"w2", 64,
     [](TrainingConfig& c) {
       c.loss.kind = "cross_entropy";
       c.optimizer.learning_rate = 0.01;
       c.optimizer.momentum = 0.9;
       c.optimizer.nesterov = true;
     },
     {0, 0}, {98, 107}},
    {"w3", 16,
     [](TrainingConfig& c) {
       c.loss.kind = "cross_entropy";
       c.optimizer.kind = "adamw";
       c.optimizer.learning_rate = 1e-3;
       c.optimizer.weight_decay = 0.01;
     },
     {0, 0}, {39, 117}},
    {"w4", 1, [](TrainingConfig& c) { c.optimizer.learning_rate = 0.01; }, {0, 0}, {0, 0}},
};

// Random data of the input's shape and type (int64 tokens in [0, 1000) for W3) and a target for the loss.
Tensor random_input(const ValueInfo& in, int64_t batch, std::mt19937& rng) {
  std::vector<int64_t> shape;
  for (const Dim& d : *in.type.shape) shape.push_back(d.known() ? d.value : batch);
  Tensor t = Tensor::empty(in.type.dtype, shape);
  if (in.type.dtype == DType::Int64)
    for (int64_t& v : t.span<int64_t>()) v = std::uniform_int_distribution<int64_t>(0, 999)(rng);
  else
    for (float& v : t.span<float>()) v = std::normal_distribution<float>()(rng);
  return t;
}

class WorkloadSteadyState : public ::testing::TestWithParam<Workload> {};

TEST_P(WorkloadSteadyState, AllocationsPerStepWithinBounds) {
  if (!kCounting) GTEST_SKIP() << kNoCountingUnderAsan;
  const Workload& w = GetParam();
  const auto path = test::source_dir().parent_path() / "shared" / "bench" / "models" / (std::string(w.name) + ".onnx");
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " not found (the shared benchmark folder)";
  Model model = load_model(path);
  const bool tokens = std::string(w.name) == "w3";
  if (tokens) bench::flatten_token_logits(model, path.string());
  TrainingConfig cfg;
  cfg.loss.kind = "mse";
  w.apply(cfg);
  const ValueInfo input = model.graph.inputs.at(0);
  TrainingSession s(std::move(model), cfg);
  std::mt19937 rng(7);
  const Tensor x = random_input(input, w.batch, rng);
  Tensor y;
  if (cfg.loss.kind == "mse") {
    y = Tensor::empty(DType::Float32, {w.batch, 1});
    for (float& v : y.span<float>()) v = std::normal_distribution<float>()(rng);
  } else {
    const int64_t classes = tokens ? 1000 : 10;
    y = Tensor::empty(DType::Int64, {tokens ? w.batch * 64 : w.batch});
    for (int64_t& v : y.span<int64_t>()) v = std::uniform_int_distribution<int64_t>(0, classes - 1)(rng);
  }
  Feeds f{{input.name, x}, {s.target_name(), y}};
  s.train_step(f);  // compiles the plan
  s.train_step(f);
  g_allocations = 0;
  g_c_allocations = 0;
  g_counting = true;
  constexpr int kSteps = 5;
  float loss = 0;
  for (int i = 0; i < kSteps; ++i) loss += s.train_step(f);
  g_counting = false;
  const double new_per_step = double(g_allocations.load()) / kSteps;
  const double c_per_step = double(g_c_allocations.load()) / kSteps;
  RecordProperty("new_per_step", std::to_string(new_per_step));
  RecordProperty("c_allocations_per_step", std::to_string(c_per_step));
  std::printf("%s: %.1f operator new, %.1f C-level heap allocations per steady-state step\n", w.name, new_per_step,
              c_per_step);
  const Bound& bound = cpu::own_sgemm_available() ? w.bound : w.fallback;
  EXPECT_LE(new_per_step, bound.new_per_step) << "operator new calls per steady-state " << w.name << " step";
  EXPECT_LE(c_per_step, bound.c_per_step) << "C-level heap allocations per steady-state " << w.name << " step";
  EXPECT_TRUE(std::isfinite(loss));
}

// Writes the model a Python snippet builds from `nodes` (a list of helper.make_node), `inputs` and `outputs`
// (value infos) and `inits` (made with w(name, *shape)) into a temporary folder `name`.
std::filesystem::path python_model(const std::string& name, const std::string& snippet) {
  auto dir = test::temp_dir(name);
  const auto script = dir / "make.py", path = dir / "model.onnx";
  std::ofstream(script) << R"(import sys, numpy as np, onnx
from onnx import helper as h, numpy_helper as nh, TensorProto as T
rng = np.random.default_rng(0)
def w(name, *shape): return nh.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32), name)
)" << snippet << R"(
model = h.make_model(h.make_graph(nodes, "g", inputs, outputs, inits), opset_imports=[h.make_opsetid("", 18)])
onnx.checker.check_model(model)
onnx.save(model, sys.argv[1])
)";
  const std::string cmd = test::python() + " " + script.string() + " " + path.string();
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  return path;
}

// Trains the model at `path` on random feeds of x_shape (and a target of target_shape) and expects zero heap
// allocations of either kind over 5 steps after the plan is built.
void expect_steady_steps_allocate_nothing(const std::filesystem::path& path, const TrainingConfig& cfg,
                                          const std::vector<int64_t>& x_shape,
                                          const std::vector<int64_t>& target_shape) {
  TrainingSession s = TrainingSession::from_file(path, cfg);
  std::mt19937 rng(3);
  Tensor x = Tensor::empty(DType::Float32, x_shape);
  Tensor y = Tensor::empty(DType::Float32, target_shape);
  for (float& v : x.span<float>()) v = std::normal_distribution<float>()(rng);
  for (float& v : y.span<float>()) v = std::normal_distribution<float>()(rng);
  Feeds f{{"x", x}, {s.target_name(), y}};
  s.train_step(f);  // compiles the plan
  s.train_step(f);
  g_allocations = 0;
  g_c_allocations = 0;
  g_counting = true;
  float loss = 0;
  for (int i = 0; i < 5; ++i) loss += s.train_step(f);
  g_counting = false;
  EXPECT_EQ(g_allocations.load(), 0) << "operator new calls in 5 steady-state steps";
  EXPECT_EQ(g_c_allocations.load(), 0) << "C-level heap allocations in 5 steady-state steps";
  EXPECT_TRUE(std::isfinite(loss));
}

// The convolution paths W2 does not reach: a strided convolution whose input gradient is wanted (backward data's
// scatter path), a depthwise one, a pointwise one, a first layer with 3 input channels (no input gradient), and a
// strided ConvTranspose, all on onnxtrain's own kernels where the build has AVX-512, at batch 6 and 1.
TEST(SteadyStateConvolutions, EveryOwnKernelPathAllocatesNothing) {
  if (!kCounting) GTEST_SKIP() << kNoCountingUnderAsan;
  cpu::Geo probe;  // any geometry the kernels take: false only in a build without AVX-512
  probe.N = probe.C = probe.M = 8;
  if (!cpu::DirectConv::supports_forward(probe))
    GTEST_SKIP() << "no AVX-512: the convolutions run oneDNN, which allocates";
  const auto path = python_model("steady_convolutions", R"(
nodes = [h.make_node("Conv", ["x", "w1", "b1"], ["c1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
         h.make_node("Relu", ["c1"], ["r1"]),
         h.make_node("Conv", ["r1", "w2", "b2"], ["c2"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2]),
         h.make_node("Relu", ["c2"], ["r2"]),
         h.make_node("Conv", ["r2", "w6"], ["dw"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=16),
         h.make_node("Conv", ["dw", "w3"], ["c3"], kernel_shape=[1, 1]),
         h.make_node("ConvTranspose", ["c3", "w5", "b5"], ["t"], kernel_shape=[3, 3], strides=[2, 2],
                     pads=[1, 1, 1, 1], output_padding=[1, 1]),
         h.make_node("GlobalAveragePool", ["t"], ["g"]),
         h.make_node("Flatten", ["g"], ["f"]),
         h.make_node("Gemm", ["f", "w4"], ["y"], transB=1)]
inputs = [h.make_tensor_value_info("x", T.FLOAT, ["batch", 3, 12, 12])]
outputs = [h.make_tensor_value_info("y", T.FLOAT, ["batch", 1])]
inits = [w("w1", 8, 3, 3, 3), w("b1", 8), w("w2", 16, 8, 3, 3), w("b2", 16), w("w3", 16, 16, 1, 1),
         w("w5", 16, 8, 3, 3), w("b5", 8), w("w4", 1, 8), w("w6", 16, 1, 3, 3)])");
  TrainingConfig cfg;
  cfg.optimizer.momentum = 0.9;
  // Batch 1 on several threads splits each image's rows and dW tiles across them instead of the images.
  for (const int64_t batch : {6, 1}) {
    SCOPED_TRACE("batch " + std::to_string(batch));
    expect_steady_steps_allocate_nothing(path, cfg, {batch, 3, 12, 12}, {batch, 1});
  }
}

// The single-thread branches that kernels take on work too small to split (W3 runs their parallel ones): a
// one-sequence attention-like block of 4 tokens x 8 features, with a layer norm, trained with AdamW.
TEST(SteadyStateSmallWork, LayerNormAndAttentionAtBatchOneAllocateNothing) {
  if (!kCounting) GTEST_SKIP() << kNoCountingUnderAsan;
  const auto path = python_model("steady_small_work", R"(
nodes = [h.make_node("LayerNormalization", ["x", "s", "b"], ["n"], axis=-1),
         h.make_node("MatMul", ["n", "wq"], ["q"]),
         h.make_node("MatMul", ["n", "wk"], ["k"]),
         h.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
         h.make_node("MatMul", ["q", "kt"], ["a"]),
         h.make_node("Softmax", ["a"], ["p"], axis=-1),
         h.make_node("MatMul", ["p", "n"], ["c"]),
         h.make_node("Add", ["c", "x"], ["r"]),
         h.make_node("Relu", ["r"], ["g"]),
         h.make_node("MatMul", ["g", "wo"], ["y"])]
inputs = [h.make_tensor_value_info("x", T.FLOAT, ["batch", 4, 8])]
outputs = [h.make_tensor_value_info("y", T.FLOAT, ["batch", 4, 1])]
inits = [w("s", 8), w("b", 8), w("wq", 8, 8), w("wk", 8, 8), w("wo", 8, 1)])");
  TrainingConfig cfg;
  cfg.optimizer.kind = "adamw";
  expect_steady_steps_allocate_nothing(path, cfg, {1, 4, 8}, {1, 4, 1});
}

INSTANTIATE_TEST_SUITE_P(Benchmarks, WorkloadSteadyState, ::testing::ValuesIn(kWorkloads),
                         [](const ::testing::TestParamInfo<Workload>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace onnxtrain
