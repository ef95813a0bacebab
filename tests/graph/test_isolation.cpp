// ONNX's shape inference runs in a forked child (graph/isolate.h): a crash or hang there is an Error naming the
// node, and the results are the same as in process.
#include <gtest/gtest.h>

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "common/test_env.h"
#include "graph/error.h"
#include "graph/graph_test_util.h"
#include "graph/isolate.h"
#include "graph/model_io.h"
#include "graph/shape_inference.h"

namespace onnxtrain {
namespace {

namespace fs = std::filesystem;
using test::expect_error;

// Sets an environment variable for one scope (ctest runs each test in its own process; a direct run of the
// binary must not leak it into the next test either).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_) ::setenv(name_, old_->c_str(), 1);
    else ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

fs::path corpus(const std::string& target, const std::string& file) {
  return test::source_dir() / "fuzz" / "corpus" / target / file;
}

ValueInfo value(const std::string& name, std::vector<int64_t> dims) {
  Shape s;
  for (int64_t d : dims) s.push_back(Dim::of(d));
  return {name, {DType::Float32, std::move(s)}};
}

// x -> Relu -> ... -> y, `n` nodes with long value names (a large inferred result).
Model relu_chain(int n, const std::string& prefix = "r") {
  Model m;
  m.opset_imports[""] = 17;
  m.graph.name = "chain";
  m.graph.inputs.push_back(value("x", {2, 3}));
  std::string prev = "x";
  for (int i = 0; i < n; ++i) {
    Node r;
    r.op_type = "Relu";
    r.name = prefix + std::to_string(i);
    r.inputs = {prev};
    r.outputs = {i + 1 == n ? std::string("y") : prefix + "_value_with_a_rather_long_name_" + std::to_string(i)};
    prev = r.outputs[0];
    m.graph.nodes.push_back(r);
  }
  m.graph.outputs.push_back({"y", {DType::Float32, std::nullopt}});
  return m;
}

// A 1-d MaxPool with auto_pad SAME_UPPER over 2^62 elements: ONNX 1.16's convPoolShapeInference computes the
// padding's residual by subtracting the stride in a loop, 2^61 times: a hang, not a crash.
Model pool_over_huge_dim() {
  Model m;
  m.opset_imports[""] = 17;
  m.graph.name = "huge";
  m.graph.inputs.push_back(value("x", {1, 1, int64_t{1} << 62}));
  Node p;
  p.name = "pool";
  p.op_type = "MaxPool";
  p.inputs = {"x"};
  p.outputs = {"y"};
  p.attributes["kernel_shape"] = std::vector<int64_t>{2};
  p.attributes["strides"] = std::vector<int64_t>{2};
  p.attributes["auto_pad"] = std::string("SAME_UPPER");
  m.graph.nodes.push_back(p);
  m.graph.outputs.push_back(value("y", {1, 1, int64_t{1} << 61}));
  return m;
}

// The crash classes the fuzzers found in ONNX 1.16's inference, each reproduced by its corpus file: the child
// dies, the caller gets an Error naming the file, the node and the op. (The Conv rank crash is
// LoadErrors.ConvInputRankBelowKernelIsAnError in test_load.cpp.)
TEST(IsolatedInference, PoolZeroStrideCrashesOnlyTheChild) {
  const fs::path p = corpus("load_model", "regress-pool-zero-stride.onnx");
  const std::string e = expect_error([&] { load_model(p); },
                                     {p.string() + ": ONNX shape inference crashed (", "on node 'pool' (MaxPool)"});
#if defined(__x86_64__) || defined(__i386__)
  EXPECT_NE(e.find("crashed (SIGFPE)"), std::string::npos) << e;  // integer division by the zero stride
#endif
}

TEST(IsolatedInference, LayerNormAxisOutOfRangeCrashesOnlyTheChild) {
  const fs::path p = corpus("gradients", "regress-layernorm-axis-out-of-range.onnx");
  expect_error([&] { load_model(p); },
               {p.string() + ": ONNX shape inference crashed (", "on node 'n' (LayerNormalization)"});
}

// The crashing node is found by bisection wherever it sits, and a node whose rank only inference reveals (no
// guard on declared types could see it) is caught all the same.
TEST(IsolatedInference, BisectionNamesTheCrashingNodeInALongGraph) {
  for (int at : {0, 1, 37, 99}) {
    Model m = relu_chain(100);
    Node& bad = m.graph.nodes[static_cast<size_t>(at)];
    const std::string in = bad.inputs[0];
    // Conv over a rank-2 input (the chain's values are [2, 3]) with a 2-d kernel: ONNX reads an empty vector.
    bad.op_type = "Conv";
    bad.name = "bad_conv";
    bad.inputs = {in, "w"};
    m.graph.initializers["w"] = TensorData{DType::Float32, {1, 1, 1, 1}, std::vector<std::byte>(4)};
    expect_error([&] { infer_shapes(m); }, {"ONNX shape inference crashed (", "on node 'bad_conv' (Conv)"});
  }
}

TEST(IsolatedInference, HangBecomesAnErrorWithinTheTimeout) {
  ScopedEnv timeout("ONNXTRAIN_ONNX_TIMEOUT", "2");
  Model m = pool_over_huge_dim();
  // Without the timeout this call would never return (ctest's own limit would end the test): returning with
  // this error is the whole check, and no stopwatch is needed.
  expect_error([&] { load_model_from_bytes(serialize_model(m), "huge.onnx"); },
               {"huge.onnx: ONNX shape inference: did not finish within 2 s on graph 'huge' (1 nodes)",
                "ONNXTRAIN_ONNX_TIMEOUT"});
}

// Failures no model provokes reliably, through the test-only hook in graph/shape_inference.cpp. The hook
// affects only the child running the whole graph, so the bisection finds no crashing prefix and says so.
TEST(IsolatedInference, SignalsAndExitsOfTheChildAreErrors) {
  const Model m = relu_chain(3);
  struct Case {
    const char* fault;
    const char* expected;
  };
  for (const Case& c : {Case{"segv", "ONNX shape inference crashed (SIGSEGV) on graph 'chain' (3 nodes) (no prefix"},
                        Case{"abort", "ONNX shape inference crashed (SIGABRT) on graph 'chain'"},
                        Case{"exit", "ONNX shape inference crashed (exit status 3 without a result) on graph"}}) {
    ScopedEnv fault("ONNXTRAIN_TEST_SHAPE_INFERENCE_FAULT", c.fault);
    Model copy = m;
    expect_error([&] { infer_shapes(copy); }, {c.expected});
  }
  ScopedEnv fault("ONNXTRAIN_TEST_SHAPE_INFERENCE_FAULT", "hang");
  ScopedEnv timeout("ONNXTRAIN_ONNX_TIMEOUT", "0.5");
  Model copy = m;
  expect_error([&] { infer_shapes(copy); }, {"did not finish within 0.5 s on graph 'chain' (3 nodes)"});
}

// What the child sends back must equal what in-process inference gives: element types, symbolic and
// data-propagated shapes, subgraph types.
TEST(IsolatedInference, SameTypesAsInProcess) {
  if (test::generated_models().empty()) GTEST_SKIP() << "venv python with onnx missing";
  int compared = 0;
  for (const char* name : {"op13", "op17", "op18", "op21", "if17", "custom", "cnn"}) {
    const fs::path p = test::generated_models() / (std::string(name) + ".onnx");
    if (!fs::exists(p)) continue;
    const Model isolated = load_model(p);
    std::optional<Model> in_process;
    {
      ScopedEnv off("ONNXTRAIN_ISOLATE_ONNX", "0");
      in_process = load_model(p);
    }
    EXPECT_FALSE(isolated.graph.value_info.empty()) << name;
    EXPECT_EQ(test::diff(isolated, *in_process), "") << name;
    ++compared;
  }
  EXPECT_GE(compared, 4);
}

// Types the generated models above do not exercise: a value inside an If branch (the child must send subgraph
// value_info back) and a shape only data propagation resolves (Shape -> Reshape).
Model branches_and_propagation() {
  Model m;
  m.opset_imports[""] = 17;
  m.graph.name = "g";
  m.graph.inputs.push_back(value("x", {2, 3, 4}));
  m.graph.inputs.push_back({"cond", {DType::Bool, Shape{}}});
  auto node = [](std::string op, std::vector<std::string> in, std::string out) {
    Node n;
    n.op_type = std::move(op);
    n.name = out;
    n.inputs = std::move(in);
    n.outputs = {std::move(out)};
    return n;
  };
  auto branch = [&](const std::string& name, const std::string& op) {
    auto g = std::make_shared<Graph>();
    g->name = name;
    g->nodes.push_back(node(op, {"x", "x"}, name + "_inner"));
    g->nodes.push_back(node("Relu", {name + "_inner"}, name + "_out"));
    g->outputs.push_back({name + "_out", {}});
    return g;
  };
  Node i = node("If", {"cond"}, "branched");
  i.attributes["then_branch"] = branch("then", "Add");
  i.attributes["else_branch"] = branch("else", "Mul");
  m.graph.nodes.push_back(i);
  m.graph.nodes.push_back(node("Flatten", {"branched"}, "flat"));
  m.graph.nodes.push_back(node("Shape", {"x"}, "shape"));
  m.graph.nodes.push_back(node("Reshape", {"flat", "shape"}, "y"));
  m.graph.outputs.push_back({"y", {DType::Float32, std::nullopt}});
  return m;
}

TEST(IsolatedInference, SubgraphTypesAndPropagatedShapesAsInProcess) {
  Model isolated = branches_and_propagation();
  infer_shapes(isolated);
  Model in_process = branches_and_propagation();
  {
    ScopedEnv off("ONNXTRAIN_ISOLATE_ONNX", "0");
    infer_shapes(in_process);
  }
  EXPECT_EQ(test::diff(isolated, in_process), "");
  const Graph& then_branch = *std::get<std::shared_ptr<Graph>>(isolated.graph.nodes[0].attributes.at("then_branch"));
  const TypeInfo* inner = then_branch.type_of("then_inner");
  ASSERT_TRUE(inner && inner->shape) << "no type for the branch's intermediate value";
  EXPECT_EQ(inner->shape->size(), 3u);
  const TypeInfo* y = isolated.graph.type_of("y");
  ASSERT_TRUE(y && y->shape);
  EXPECT_EQ(*y->shape, (Shape{Dim::of(2), Dim::of(3), Dim::of(4)}));  // only data propagation knows these
}

// The result is larger than a pipe's buffer (64 KiB): the parent reads while the child writes.
TEST(IsolatedInference, LargeResultArrivesWhole) {
  Model m = relu_chain(3000);
  infer_shapes(m);
  int typed = 0;
  for (const Node& n : m.graph.nodes) {
    const TypeInfo* t = m.graph.type_of(n.outputs[0]);
    if (t && t->dtype == DType::Float32 && t->shape && t->shape->size() == 2) ++typed;
  }
  EXPECT_EQ(typed, 3000);
}

// fork copies only the calling thread; other threads busy allocating and holding locks must not leave the
// child stuck (glibc's allocator is fork-safe; the child touches nothing else they use).
TEST(IsolatedInference, OtherThreadsBusyDuringTheFork) {
  // clang 14's ASan allocator has no fork handlers: a fork while another thread holds its quarantine or region
  // lock leaves the child waiting on it forever (1 child in 400 in a plain fork loop; docs/reliability.md).
  if (test::kUnderAsan) GTEST_SKIP() << "AddressSanitizer's allocator (clang 14) is not fork-safe; this tests glibc's";
  ScopedEnv timeout("ONNXTRAIN_ONNX_TIMEOUT", "30");
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::vector<std::thread> busy;
  for (int t = 0; t < 3; ++t)
    busy.emplace_back([&] {
      while (!stop) {
        std::lock_guard<std::mutex> lock(mu);
        std::vector<std::string> v(64, std::string(100, 'x'));
      }
    });
  for (int i = 0; i < 20; ++i) {
    Model m = relu_chain(20);
    EXPECT_NO_THROW(infer_shapes(m)) << "call " << i;
    EXPECT_TRUE(m.graph.type_of("y") && m.graph.type_of("y")->shape) << "call " << i;
  }
  stop = true;
  for (auto& t : busy) t.join();
}

TEST(IsolatedInference, MalformedSettingsAreNamed) {
  Model m = relu_chain(2);
  {
    ScopedEnv bad("ONNXTRAIN_ONNX_TIMEOUT", "soon");
    expect_error([&] { infer_shapes(m); }, {"ONNXTRAIN_ONNX_TIMEOUT: expected a positive number of seconds, got 'soon'"});
  }
  {
    ScopedEnv bad("ONNXTRAIN_ONNX_TIMEOUT", "-1");
    expect_error([&] { infer_shapes(m); }, {"ONNXTRAIN_ONNX_TIMEOUT", "got '-1'"});
  }
  {
    ScopedEnv bad("ONNXTRAIN_ISOLATE_ONNX", "yes");
    expect_error([&] { infer_shapes(m); }, {"ONNXTRAIN_ISOLATE_ONNX: expected 1", "got 'yes'"});
  }
}

// The helper itself: results, exceptions and exit paths, independent of ONNX.
TEST(RunInChild, ReturnsThrowsCrashesAndTimesOut) {
  ChildResult r = run_in_child([] { return std::string(1 << 20, 'a'); }, 30, "test");
  EXPECT_EQ(r.status, ChildResult::Status::Returned);
  EXPECT_EQ(r.payload, std::string(1 << 20, 'a'));
  r = run_in_child([]() -> std::string { throw Error("node 'x': bad"); }, 30, "test");
  EXPECT_EQ(r.status, ChildResult::Status::Threw);
  EXPECT_EQ(r.payload, "node 'x': bad");
  r = run_in_child([]() -> std::string { ::raise(SIGBUS); return "unreachable"; }, 30, "test");
  EXPECT_EQ(r.status, ChildResult::Status::Crashed);
  EXPECT_EQ(r.payload, "SIGBUS");
  r = run_in_child([]() -> std::string { ::_exit(0); }, 30, "test");
  EXPECT_EQ(r.status, ChildResult::Status::Crashed);
  EXPECT_NE(r.payload.find("incomplete result"), std::string::npos) << r.payload;
  r = run_in_child([]() -> std::string { for (;;) ::pause(); }, 0.3, "test");
  EXPECT_EQ(r.status, ChildResult::Status::TimedOut);
}

// The escape hatch runs inference in this process; a valid model gives the same types either way (above).
TEST(IsolatedInference, InProcessEscapeHatchStillInfers) {
  ScopedEnv off("ONNXTRAIN_ISOLATE_ONNX", "0");
  Model m = relu_chain(5);
  infer_shapes(m);
  ASSERT_TRUE(m.graph.type_of("y") && m.graph.type_of("y")->shape);
  EXPECT_EQ(m.graph.type_of("y")->shape->size(), 2u);
}

}  // namespace
}  // namespace onnxtrain
