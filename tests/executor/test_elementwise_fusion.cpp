// Elementwise steps fused into one kernel at plan time (the CPU plan pass, executor/cpu/fusion_pass.cpp):
// every case runs the graph fused (the default) and as written (check_every_value keeps every node), the two must
// agree (float64 to 1e-12, float32 to 1e-5), and the fused plan must have lost the steps it claims to fuse.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>

#include "common/node.h"
#include "executor/cpu/fused_elementwise.h"
#include "executor/executor.h"
#include "executor/plan_fusion.h"
#include "graph/error.h"

namespace onnxtrain {
namespace {

using test::node;

Tensor random_tensor(DType t, const std::vector<int64_t>& shape, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-2.0, 2.0);
  Tensor x = Tensor::empty(t, shape);
  for (int64_t i = 0; i < x.numel(); ++i) {
    if (t == DType::Float64) x.ptr<double>()[i] = u(rng);
    else x.ptr<float>()[i] = static_cast<float>(u(rng));
  }
  return x;
}

double at(const Tensor& t, int64_t i) {
  return t.dtype == DType::Float64 ? t.ptr<double>()[i] : static_cast<double>(t.ptr<float>()[i]);
}

struct Case {
  std::vector<Node> nodes;
  std::map<std::string, std::vector<int64_t>> inputs;  // name -> shape
  std::vector<std::string> outputs;
  DType dtype = DType::Float64;
  std::set<std::string> positive = {};  // inputs drawn from (0, 2] (under a Sqrt, say)
};

struct Steps {
  size_t fused, plain;
};

const std::map<std::string, int64_t> kOpsets = {{"", 17}, {"onnxtrain", 1}};

Steps check_case(const Case& c) {
  Graph g;
  std::map<std::string, Tensor> feeds;
  unsigned seed = 1;
  for (const auto& [name, shape] : c.inputs) {
    Shape known;
    for (int64_t d : shape) known.push_back(Dim::of(d));
    g.inputs.push_back({name, {c.dtype, known}});
    feeds[name] = random_tensor(c.dtype, shape, seed++);
    if (c.positive.count(name))
      for (int64_t i = 0; i < feeds[name].numel(); ++i) {
        if (c.dtype == DType::Float64) feeds[name].ptr<double>()[i] = std::abs(feeds[name].ptr<double>()[i]) + 1e-3;
        else feeds[name].ptr<float>()[i] = std::abs(feeds[name].ptr<float>()[i]) + 1e-3f;
      }
  }
  for (const std::string& o : c.outputs) g.outputs.push_back({o, {c.dtype, std::nullopt}});
  g.nodes = c.nodes;
  Executor fused(g, kOpsets, std::make_shared<TensorStore>());
  ExecutorOptions plain_opts;
  plain_opts.check_every_value = true;
  Executor plain(g, kOpsets, std::make_shared<TensorStore>(), plain_opts);
  // Twice: the second run reuses the plan and its arena.
  for (int round = 0; round < 2; ++round) {
    std::vector<Tensor> got = fused.run(feeds), want = plain.run(feeds);
    EXPECT_EQ(got.size(), want.size());
    const double tol = c.dtype == DType::Float64 ? 1e-12 : 1e-5;
    for (size_t k = 0; k < got.size() && k < want.size(); ++k) {
      EXPECT_EQ(got[k].shape, want[k].shape) << c.outputs[k];
      if (got[k].shape != want[k].shape) continue;
      double worst = 0;
      for (int64_t i = 0; i < got[k].numel(); ++i) {
        const double d = std::abs(at(got[k], i) - at(want[k], i)) / (1.0 + std::abs(at(want[k], i)));
        worst = std::isnan(d) ? INFINITY : std::max(worst, d);
      }
      EXPECT_LE(worst, tol) << c.outputs[k] << " (" << dtype_name(c.dtype) << ")";
    }
  }
  return {fused.last_plan()->num_steps(), plain.last_plan()->num_steps()};
}

// GELU as PyTorch exports it, after a linear layer's bias: x = h + b; x * 0.5 * (1 + erf(x / sqrt(2))).
Case gelu_case(DType t, std::vector<int64_t> shape) {
  const int64_t c = shape.back();
  return {{node("Add", {"h", "b"}, {"x"}), node("Div", {"x", "sqrt2"}, {"xs"}), node("Erf", {"xs"}, {"e"}),
           node("Add", {"e", "one"}, {"e1"}), node("Mul", {"x", "e1"}, {"xe"}), node("Mul", {"xe", "half"}, {"y"})},
          {{"h", shape}, {"b", {c}}, {"sqrt2", {}}, {"one", {}}, {"half", {}}},
          {"y"},
          t};
}

TEST(ElementwiseFusion, BiasAndGeluChainIsOneStep) {
  for (DType t : {DType::Float64, DType::Float32})
    for (std::vector<int64_t> shape : {std::vector<int64_t>{3, 5}, {2, 37, 129}, {16, 64, 128}}) {
      Steps s = check_case(gelu_case(t, shape));
      EXPECT_EQ(s.plain, 6u);
      EXPECT_EQ(s.fused, 1u) << shape_string(shape);
    }
}

// AdamW's update of one weight as optimizers/ emits it: three results written back, scalars for the
// hyper-parameters, and chains that start apart and merge (m's, v's and the decayed weight's).
TEST(ElementwiseFusion, AdamUpdateIsOneStepWithThreeOutputs) {
  for (DType t : {DType::Float64, DType::Float32}) {
    Case c{{node("Mul", {"p", "decay"}, {"base"}), node("Mul", {"m", "b1"}, {"m1"}), node("Mul", {"g", "omb1"}, {"g1"}),
            node("Add", {"m1", "g1"}, {"nm"}), node("Mul", {"g", "g"}, {"gg"}), node("Mul", {"gg", "omb2"}, {"gg2"}),
            node("Mul", {"v", "b2"}, {"v1"}), node("Add", {"v1", "gg2"}, {"nv"}), node("Sqrt", {"nv"}, {"sv"}),
            node("Div", {"sv", "bc2"}, {"svc"}), node("Add", {"svc", "eps"}, {"denom"}),
            node("Mul", {"step", "nm"}, {"snm"}), node("Div", {"snm", "denom"}, {"upd"}),
            node("Sub", {"base", "upd"}, {"np"})},
           {{"p", {300, 7}}, {"m", {300, 7}}, {"v", {300, 7}}, {"g", {300, 7}}, {"decay", {}}, {"b1", {}}, {"omb1", {}},
            {"b2", {}}, {"omb2", {}}, {"bc2", {}}, {"eps", {}}, {"step", {}}},
           {"nm", "nv", "np"},
           t,
           {"v", "b2", "omb2", "bc2", "eps"}};
    Steps s = check_case(c);
    EXPECT_EQ(s.plain, 14u);
    EXPECT_EQ(s.fused, 1u);
  }
}

// Every op the fused kernel knows, in one chain (Sqrt and Log on positive values).
TEST(ElementwiseFusion, EveryOpMatchesItsOwnKernel) {
  for (DType t : {DType::Float64, DType::Float32}) {
    Case c{{node("Neg", {"x"}, {"a"}), node("Abs", {"a"}, {"b"}), node("Sqrt", {"b"}, {"c"}), node("Add", {"c", "y"}, {"d"}),
            node("Relu", {"d"}, {"e"}), node("Exp", {"y"}, {"f"}), node("Log", {"f"}, {"g"}), node("Sub", {"g", "e"}, {"h"}),
            node("Tanh", {"h"}, {"i"}), node("Sigmoid", {"i"}, {"j"}), node("Erf", {"j"}, {"k"}),
            node("Reciprocal", {"f"}, {"l"}), node("Max", {"k", "l"}, {"m"}), node("Min", {"m", "x"}, {"n"}),
            node("Sum", {"n", "d"}, {"o"}), node("Div", {"o", "f"}, {"p"}),
            node("ReluGrad", {"p", "h"}, {"q"}, "onnxtrain"), node("SigmoidGrad", {"q", "j"}, {"r"}, "onnxtrain"),
            node("TanhGrad", {"r", "i"}, {"s"}, "onnxtrain"), node("GeluGrad", {"s", "x"}, {"u"}, "onnxtrain"),
            node("GeluTanhGrad", {"u", "y"}, {"w"}, "onnxtrain")},
           {{"x", {1000}}, {"y", {1000}}},
           {"w"},
           t};
    Steps s = check_case(c);
    EXPECT_EQ(s.plain, 21u);
    EXPECT_EQ(s.fused, 1u);
  }
}

// A result read by another step between two members cannot move past that reader: the chain splits there.
TEST(ElementwiseFusion, OutsideReaderInBetweenSplitsTheChain) {
  Node sum = node("ReduceSum", {"a"}, {"r"});
  sum.attributes["keepdims"] = int64_t{0};
  Case c{{node("Mul", {"x", "y"}, {"a"}), node("Exp", {"a"}, {"a2"}), sum, node("Add", {"a2", "r"}, {"b"}),
          node("Mul", {"b", "y"}, {"z"})},
         {{"x", {4, 9}}, {"y", {4, 9}}},
         {"z", "r"}};
  Steps s = check_case(c);
  // Mul+Exp cannot run after ReduceSum reads a... they can run before it: Mul, Exp fuse (a is an output), then
  // ReduceSum, then Add+Mul fuse.
  EXPECT_EQ(s.plain, 5u);
  EXPECT_EQ(s.fused, 3u);
}

// A reader after the group just gets the intermediate as one more output of the fused kernel.
TEST(ElementwiseFusion, IntermediateReadLaterIsAnOutput) {
  Node sum = node("ReduceSum", {"a"}, {"r"});
  sum.attributes["keepdims"] = int64_t{0};
  Case c{{node("Mul", {"x", "y"}, {"a"}), node("Add", {"a", "x"}, {"b"}), node("Tanh", {"b"}, {"z"}), sum},
         {{"x", {40, 90}}, {"y", {40, 90}}},
         {"z", "r", "a"}};
  Steps s = check_case(c);
  EXPECT_EQ(s.plain, 4u);
  EXPECT_EQ(s.fused, 2u);
}

// Rows broadcast over leading dims ([C], [1, C], [T, C] onto [B, T, C]), per-row statistics ([B, T, 1]), a middle
// block ([1, T, 1]) and scalars of any rank fuse; other broadcasts ([B, 1, C]) stay in their own kernel, and the
// steps around them still fuse.
TEST(ElementwiseFusion, BroadcastPatterns) {
  for (DType t : {DType::Float64, DType::Float32}) {
    Case rows{{node("Add", {"x", "c"}, {"a"}), node("Mul", {"a", "oc"}, {"b"}), node("Sub", {"tc", "b"}, {"d"}),
               node("Div", {"d", "s"}, {"e"}), node("Mul", {"e", "col"}, {"f"}), node("Sub", {"f", "mid"}, {"z"})},
              {{"x", {3, 50, 70}}, {"c", {70}}, {"oc", {1, 70}}, {"tc", {50, 70}}, {"s", {1, 1, 1}}, {"col", {3, 50, 1}},
               {"mid", {1, 50, 1}}},
              {"z"},
              t};
    Steps s = check_case(rows);
    EXPECT_EQ(s.plain, 6u);
    EXPECT_EQ(s.fused, 1u);
    Case other{{node("Add", {"x", "c"}, {"a"}), node("Mul", {"a", "outer"}, {"b"}), node("Exp", {"b"}, {"e"}),
                node("Add", {"e", "x"}, {"z"})},
               {{"x", {3, 50, 70}}, {"c", {70}}, {"outer", {3, 1, 70}}},
               {"z"},
               t};
    s = check_case(other);
    EXPECT_EQ(s.plain, 4u);
    EXPECT_EQ(s.fused, 3u);  // Add alone (its reader does not fuse), Mul by [3, 1, 70], Exp + Add
  }
}

// Expand feeding elementwise steps is read as a broadcast operand, so the expanded tensor is never written (a loss
// gradient: the mean's scalar gradient expanded, then multiplied by a mask). A broadcast the fused kernel cannot
// read ([3, 1, 70]) keeps its own Expand step, and an expanded value read outside the chain is still returned.
TEST(ElementwiseFusion, ExpandIsReadAsABroadcast) {
  auto shape_of = [](const std::string& out, std::vector<int64_t> dims) {
    Node n = node("Constant", {}, {out});
    n.attributes["value_ints"] = std::move(dims);
    return n;
  };
  for (DType t : {DType::Float64, DType::Float32}) {
    Case scalar{{shape_of("s", {3, 50, 70}), node("Expand", {"dy", "s"}, {"e"}), node("Mul", {"e", "mask"}, {"z"})},
                {{"dy", {}}, {"mask", {3, 50, 70}}},
                {"z"},
                t};
    Steps st = check_case(scalar);
    EXPECT_EQ(st.plain, 2u);
    EXPECT_EQ(st.fused, 1u);
    Case row{{shape_of("s", {3, 50, 70}), node("Expand", {"b", "s"}, {"e"}), node("Add", {"x", "e"}, {"a"}),
              node("Tanh", {"a"}, {"z"})},
             {{"b", {70}}, {"x", {3, 50, 70}}},
             {"z", "e"},
             t};
    st = check_case(row);
    EXPECT_EQ(st.plain, 3u);
    EXPECT_EQ(st.fused, 1u);
    Case outer{{shape_of("s", {3, 50, 70}), node("Expand", {"o", "s"}, {"e"}), node("Mul", {"e", "x"}, {"a"}),
                node("Exp", {"a"}, {"z"})},
               {{"o", {3, 1, 70}}, {"x", {3, 50, 70}}},
               {"z"},
               t};
    st = check_case(outer);
    EXPECT_EQ(st.plain, 3u);
    EXPECT_EQ(st.fused, 2u);  // Expand alone, then Mul + Exp
  }
}

// A view step of unchanged shape after a fusable step (an Identity here; in gradients, a SumToShape that sums
// nothing) joins the chain as a copy. Read outside the chain, it is written to a buffer of its own. When its
// buffer has a second view (the Reshape), the step keeps its place, and every value is still right.
TEST(ElementwiseFusion, ViewStepsJoinAsCopies) {
  auto shape_of = [](const std::string& out, std::vector<int64_t> dims) {
    Node n = node("Constant", {}, {out});
    n.attributes["value_ints"] = std::move(dims);
    return n;
  };
  const std::vector<Node> chain = {shape_of("s", {3, 50, 70}), node("Expand", {"dy", "s"}, {"e"}),
                                   node("Identity", {"e"}, {"o"}), node("Mul", {"o", "mask"}, {"z"})};
  const std::map<std::string, std::vector<int64_t>> inputs = {{"dy", {}}, {"mask", {3, 50, 70}}};
  Steps st = check_case({chain, inputs, {"z"}});
  EXPECT_EQ(st.plain, 3u);
  EXPECT_EQ(st.fused, 1u);
  st = check_case({chain, inputs, {"z", "o"}});
  EXPECT_EQ(st.fused, 1u);
  std::vector<Node> shared = chain;
  shared.push_back(shape_of("s2", {150, 70}));
  shared.push_back(node("Reshape", {"o", "s2"}, {"r"}));
  Node sum = node("ReduceSum", {"r"}, {"t"});
  sum.attributes["keepdims"] = int64_t{0};
  shared.push_back(sum);
  check_case({shared, inputs, {"z", "t"}});
}

// Chains of different shapes do not mix, and a graph output computed inside a chain is still returned.
TEST(ElementwiseFusion, ShapesDoNotMixAndOutputsSurvive) {
  Case c{{node("Mul", {"x", "x"}, {"a"}), node("Add", {"a", "x"}, {"b"}), node("Mul", {"y", "y"}, {"c"}),
          node("Add", {"c", "b"}, {"d"}), node("Neg", {"d"}, {"z"})},
         {{"x", {5}}, {"y", {4, 5}}},
         {"z", "a"}};
  Steps s = check_case(c);
  EXPECT_EQ(s.plain, 5u);
  EXPECT_EQ(s.fused, 2u);  // [5]: Mul+Add; [4, 5]: Mul+Add+Neg, reading b as a row
}

// Values only a fused chain reads get no buffer: the arena holds the output alone.
TEST(ElementwiseFusion, IntermediatesNeedNoMemory) {
  Graph g;
  g.inputs = {{"x", {DType::Float32, Shape{Dim::of(1024)}}}};
  g.outputs = {{"y", {DType::Float32, std::nullopt}}};
  g.nodes = {node("Exp", {"x"}, {"a"}), node("Neg", {"a"}, {"b"}), node("Exp", {"b"}, {"c"}), node("Neg", {"c"}, {"y"})};
  Executor ex(g, kOpsets, std::make_shared<TensorStore>());
  Tensor x = Tensor::empty(DType::Float32, {1024});
  for (int64_t i = 0; i < 1024; ++i) x.ptr<float>()[i] = 0.001f * static_cast<float>(i);
  Tensor y = ex.run({{"x", x}}).at(0);
  for (int64_t i = 0; i < 1024; i += 100) EXPECT_FLOAT_EQ(y.ptr<float>()[i], -std::exp(-std::exp(x.ptr<float>()[i])));
  EXPECT_EQ(ex.last_plan()->num_steps(), 1u);
  EXPECT_EQ(ex.last_plan()->arena_bytes(), 4096u);
}

// ExecutorOptions::fuse_elementwise off keeps one step per node (benchmarks/bench_fusion.cpp measures with it).
TEST(ElementwiseFusion, CanBeTurnedOff) {
  Case c = gelu_case(DType::Float32, {4, 8});
  Graph g;
  for (const auto& [name, shape] : c.inputs) {
    Shape s;
    for (int64_t d : shape) s.push_back(Dim::of(d));
    g.inputs.push_back({name, {c.dtype, s}});
  }
  g.outputs = {{"y", {c.dtype, std::nullopt}}};
  g.nodes = c.nodes;
  ExecutorOptions off;
  off.fuse_elementwise = false;
  Executor ex(g, kOpsets, std::make_shared<TensorStore>(), off);
  std::map<std::string, Tensor> feeds;
  unsigned seed = 1;
  for (const auto& [name, shape] : c.inputs) feeds[name] = random_tensor(c.dtype, shape, seed++);
  ex.run(feeds);
  EXPECT_EQ(ex.last_plan()->num_steps(), 6u);
}

// Integer arithmetic keeps its own kernels.
TEST(ElementwiseFusion, IntegersAreNotFused) {
  Graph g;
  g.inputs = {{"x", {DType::Int64, Shape{Dim::of(6)}}}};
  g.outputs = {{"z", {DType::Int64, std::nullopt}}};
  g.nodes = {node("Mul", {"x", "x"}, {"a"}), node("Add", {"a", "x"}, {"z"})};
  Executor ex(g, kOpsets, std::make_shared<TensorStore>());
  Tensor x = Tensor::empty(DType::Int64, {6});
  for (int64_t i = 0; i < 6; ++i) x.ptr<int64_t>()[i] = i - 3;
  Tensor z = ex.run({{"x", x}}).at(0);
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(z.ptr<int64_t>()[i], (i - 3) * (i - 3) + (i - 3));
  EXPECT_EQ(ex.last_plan()->num_steps(), 2u);
}

// The grouping itself: members, inputs in first-use order, and which results leave the group.
TEST(ElementwiseFusion, GroupingReportsInputsAndOutputs) {
  auto t = [](std::vector<int64_t> shape) { return Tensor::empty(DType::Float32, std::move(shape)); };
  Tensor x = t({8, 4}), b = t({4}), s = t({}), a = t({8, 4}), c = t({8, 4}), d = t({8, 4}), r = t({8});
  std::vector<FusionStep> steps = {{EwOp::Add, {&x, &b}, {&a}},
                                   {EwOp::Mul, {&a, &s}, {&c}},
                                   {std::nullopt, {&a}, {&r}},  // reads a after the group: a is an output
                                   {EwOp::Exp, {&c}, {&d}}};
  // The reader at step 2 sits between Mul (1) and Exp (3): Exp starts a new group of one (not returned).
  std::vector<ElementwiseGroup> g = group_elementwise_steps(steps, {&d});
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g[0].steps, (std::vector<size_t>{0, 1}));
  EXPECT_EQ(g[0].inputs, (std::vector<const Tensor*>{&x, &b, &s}));
  EXPECT_EQ(g[0].outputs, (std::vector<const Tensor*>{&a, &c}));
  ASSERT_EQ(g[0].program.inputs.size(), 3u);
  EXPECT_EQ(g[0].program.inputs[1].kind, EwInput::Kind::Broadcast);
  EXPECT_EQ(g[0].program.inputs[1].period, 4);
  EXPECT_EQ(g[0].program.inputs[1].inner, 1);
  EXPECT_EQ(g[0].program.inputs[2].kind, EwInput::Kind::Scalar);
}

TEST(ElementwiseFusion, MalformedProgramIsAnError) {
  EwProgram p;
  p.numel = 4;
  p.inputs = {{EwInput::Kind::Full, 0}};
  p.code = {{EwOp::Add, 0, 2}};  // reads its own result
  p.outputs = {1};
  EXPECT_THROW(make_fused_elementwise(p), Error);
  p.code = {{EwOp::Neg, 0, -1}};
  p.outputs = {0};  // an input, not a result
  EXPECT_THROW(make_fused_elementwise(p), Error);
  p.outputs = {1};
  p.dtype = DType::Int64;
  try {
    make_fused_elementwise(p);
    ADD_FAILURE() << "int64 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("float32 or float64"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace onnxtrain
