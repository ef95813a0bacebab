// Transposes folded into MatMul at plan time (executor/plan_fusion.h): every case runs the graph twice, folded
// (the default) and as written (check_every_value keeps every node), and the two must agree; the folded plan
// must also have lost the Transpose steps it claims to fold.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "common/node.h"
#include "executor/executor.h"
#include "executor/plan_fusion.h"

namespace onnxtrain {
namespace {

// Named after its first output, as exporters do.
using test::node;

Node transpose(const std::string& in, const std::string& out, std::vector<int64_t> perm) {
  Node n = node("Transpose", {in}, {out});
  n.attributes["perm"] = std::move(perm);
  return n;
}

Tensor random_tensor(DType t, const std::vector<int64_t>& shape, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  Tensor x = Tensor::empty(t, shape);
  for (int64_t i = 0; i < x.numel(); ++i) {
    if (t == DType::Float64) x.ptr<double>()[i] = u(rng);
    else x.ptr<float>()[i] = static_cast<float>(u(rng));
  }
  return x;
}

double at(const Tensor& t, int64_t i) {
  if (t.dtype == DType::Int64) return static_cast<double>(t.ptr<int64_t>()[i]);
  return t.dtype == DType::Float64 ? t.ptr<double>()[i] : static_cast<double>(t.ptr<float>()[i]);
}

struct Case {
  std::vector<Node> nodes;
  std::map<std::string, std::vector<int64_t>> inputs;  // name -> shape
  std::vector<std::string> outputs;
  DType dtype = DType::Float64;
  std::map<std::string, std::vector<int64_t>> value_shapes = {};  // value_info of intermediate values
};

// Runs c folded and unfolded; returns the folded plan's and the plain plan's step counts.
std::pair<size_t, size_t> check_case(const Case& c) {
  Graph g;
  std::map<std::string, Tensor> feeds;
  unsigned seed = 1;
  for (const auto& [name, shape] : c.inputs) {
    Shape known;
    for (int64_t d : shape) known.push_back(Dim::of(d));
    g.inputs.push_back({name, {c.dtype, known}});
    feeds[name] = random_tensor(c.dtype, shape, seed++);
  }
  for (const std::string& o : c.outputs) g.outputs.push_back({o, {c.dtype, std::nullopt}});
  for (const auto& [name, shape] : c.value_shapes) {
    Shape known;
    for (int64_t d : shape) known.push_back(Dim::of(d));
    g.value_info[name] = {c.dtype, known};
  }
  g.nodes = c.nodes;
  Executor folded(g, {{"", 17}, {"onnxtrain", 1}}, std::make_shared<TensorStore>());
  ExecutorOptions plain_opts;
  plain_opts.check_every_value = true;
  Executor plain(g, {{"", 17}, {"onnxtrain", 1}}, std::make_shared<TensorStore>(), plain_opts);
  std::vector<Tensor> got = folded.run(feeds), want = plain.run(feeds);
  EXPECT_EQ(got.size(), want.size());
  const double tol = c.dtype == DType::Float64 ? 1e-12 : 1e-4;
  for (size_t k = 0; k < got.size() && k < want.size(); ++k) {
    EXPECT_EQ(got[k].shape, want[k].shape) << c.outputs[k];
    if (got[k].shape != want[k].shape) continue;
    double worst = 0;
    for (int64_t i = 0; i < got[k].numel(); ++i)
      worst = std::max(worst, std::abs(at(got[k], i) - at(want[k], i)) / (1.0 + std::abs(at(want[k], i))));
    EXPECT_LE(worst, tol) << c.outputs[k];
  }
  return {folded.last_plan()->num_steps(), plain.last_plan()->num_steps()};
}

// A linear layer as PyTorch exports it: x · Transpose(W).
TEST(MatMulFold, WeightTransposeBecomesTransposedOperand) {
  Case c{{transpose("w", "wt", {1, 0}), node("MatMul", {"x", "wt"}, {"y"})}, {{"x", {2, 5, 6}}, {"w", {4, 6}}}, {"y"}};
  auto [folded, plain] = check_case(c);
  EXPECT_EQ(folded, 1u);
  EXPECT_EQ(plain, 2u);
  // Checked by hand as well: y[b, i, j] = sum_k x[b, i, k] w[j, k].
  Graph g;
  g.inputs = {{"x", {DType::Float64, std::nullopt}}, {"w", {DType::Float64, std::nullopt}}};
  g.outputs = {{"y", {DType::Float64, std::nullopt}}};
  g.nodes = c.nodes;
  Executor ex(g, {{"", 17}}, std::make_shared<TensorStore>());
  Tensor x = random_tensor(DType::Float64, {2, 5, 6}, 7), w = random_tensor(DType::Float64, {4, 6}, 8);
  Tensor y = ex.run({{"x", x}, {"w", w}}).at(0);
  ASSERT_EQ(y.shape, (std::vector<int64_t>{2, 5, 4}));
  for (int64_t r = 0; r < 10; ++r)
    for (int64_t j = 0; j < 4; ++j) {
      double s = 0;
      for (int64_t k = 0; k < 6; ++k) s += x.ptr<double>()[r * 6 + k] * w.ptr<double>()[j * 6 + k];
      EXPECT_NEAR(y.ptr<double>()[r * 4 + j], s, 1e-12);
    }
}

// Attention scores: Q and K ([batch, tokens, heads, head dim]) split into heads by Transposes that keep the head
// dim contiguous.
Case head_scores(std::vector<int64_t> q, std::vector<int64_t> k, DType t) {
  return {{transpose("q", "qh", {0, 2, 1, 3}), transpose("k", "kh", {0, 2, 3, 1}), node("MatMul", {"qh", "kh"}, {"s"})},
          {{"q", std::move(q)}, {"k", std::move(k)}},
          {"s"},
          t};
}

TEST(MatMulFold, HeadSplittingTransposesAreStridedOperands) {
  for (DType t : {DType::Float64, DType::Float32}) {
    auto [folded, plain] = check_case(head_scores({2, 5, 3, 4}, {2, 5, 3, 4}, t));
    EXPECT_EQ(folded, 1u);
    EXPECT_EQ(plain, 3u);
  }
}

// The sizes at which products go to sgemm: one folded call with a transposed weight, and per-matrix calls on
// strided matrices.
TEST(MatMulFold, SgemmPathsReadStridedOperands) {
  Case linear{{transpose("w", "wt", {1, 0}), node("MatMul", {"x", "wt"}, {"y"})},
              {{"x", {4, 64, 128}}, {"w", {96, 128}}},
              {"y"},
              DType::Float32};
  EXPECT_EQ(check_case(linear).first, 1u);
  EXPECT_EQ(check_case(head_scores({2, 128, 2, 128}, {2, 96, 2, 128}, DType::Float32)).first, 1u);
}

// Attention at W3's head size, where each product is too small for sgemm: the scores, the transposed-A product
// of the key gradient, and P·V written back in token order, all on strided views.
TEST(MatMulFold, BatchedHeadProductsReadAndWriteStridedViews) {
  EXPECT_EQ(check_case(head_scores({2, 64, 4, 32}, {2, 64, 4, 32}, DType::Float32)).first, 1u);
  Case key_grad{{transpose("ds", "dst", {0, 1, 3, 2}), transpose("q", "qh", {0, 2, 1, 3}), node("MatMul", {"dst", "qh"}, {"dk"})},
                {{"ds", {2, 4, 64, 64}}, {"q", {2, 64, 4, 32}}},
                {"dk"},
                DType::Float32};
  EXPECT_EQ(check_case(key_grad).first, 1u);
  Case merge{{transpose("v", "vh", {0, 2, 1, 3}), node("MatMul", {"p", "vh"}, {"o"}), transpose("o", "y", {0, 2, 1, 3})},
             {{"p", {2, 4, 64, 64}}, {"v", {2, 64, 4, 32}}},
             {"y"},
             DType::Float32};
  EXPECT_EQ(check_case(merge).first, 1u);
}

// The gradient builder reads operand shapes (Shape nodes for SumToShape); those read through the Transposes, so
// a head split read by MatMuls and Shapes alone goes away.
TEST(MatMulFold, ShapesReadThroughFoldedTransposes) {
  Case c{{transpose("q", "qh", {0, 2, 1, 3}), transpose("k", "k1", {0, 2, 1, 3}), transpose("k1", "kh", {0, 1, 3, 2}),
          node("MatMul", {"qh", "kh"}, {"s"}), node("Shape", {"qh"}, {"qs"}), node("Shape", {"kh"}, {"ks"})},
         {{"q", {2, 5, 3, 4}}, {"k", {2, 5, 3, 4}}},
         {"s", "qs", "ks"}};
  auto [folded, plain] = check_case(c);
  EXPECT_EQ(plain - folded, 3u);  // all three Transposes
  // The Transpose a product writes in place (heads merged back) may have its shape read too.
  Case merge{{node("MatMul", {"p", "v"}, {"o"}), transpose("o", "y", {0, 2, 1, 3}), node("Shape", {"y"}, {"ys"})},
             {{"p", {2, 3, 5, 5}}, {"v", {2, 3, 5, 4}}},
             {"y", "ys"}};
  auto [fm, pm] = check_case(merge);
  EXPECT_EQ(pm - fm, 1u);
  // A Shape with start/end is left as written, and keeps its Transpose.
  Case sliced{{transpose("q", "qh", {0, 2, 1, 3}), node("MatMul", {"qh", "w"}, {"s"}), node("Shape", {"qh"}, {"qs"})},
              {{"q", {2, 5, 3, 4}}, {"w", {4, 2}}},
              {"s", "qs"}};
  sliced.nodes[2].attributes["start"] = int64_t{1};
  auto [f2, p2] = check_case(sliced);
  EXPECT_EQ(f2, p2);
}

// A MatMul's gradient is summed back to its operand's shape (SumToShape, for broadcast batch dims) before the
// Transpose that undoes the head split: the Transpose moves before the reduction and into the product's output.
TEST(MatMulFold, TransposesMoveBeforeSumToShape) {
  auto sum_to_shape = [](const std::string& g, const std::string& shape, const std::string& out) {
    Node n = node("SumToShape", {g, shape}, {out});
    n.domain = "onnxtrain";
    return n;
  };
  for (bool broadcast : {false, true}) {
    SCOPED_TRACE(broadcast ? "a broadcast batch dim summed" : "no broadcast");
    Case c{{transpose("x", "xh", {0, 2, 1, 3}), node("MatMul", {"a", "b"}, {"g"}), node("Shape", {"xh"}, {"xs"}),
            sum_to_shape("g", "xs", "dx"), transpose("dx", "y", {0, 2, 1, 3})},
           {{"x", {broadcast ? 1 : 2, 5, 3, 4}}, {"a", {2, 3, 5, 6}}, {"b", {2, 3, 6, 4}}},
           {"y"},
           DType::Float64,
           {{"g", {2, 3, 5, 4}}}};
    auto [folded, plain] = check_case(c);
    EXPECT_EQ(plain - folded, 2u);  // the Transpose after SumToShape, and xh, whose shape alone was read
  }
  // The W3 pattern: the operand itself is a head split, and a Reshape merges the heads back.
  Node merge = node("Reshape", {"y", "merged"}, {"z"});
  Node merged_shape = node("Constant", {}, {"merged"});
  merged_shape.attributes["value_ints"] = std::vector<int64_t>{2, 5, 12};
  Case w3{{transpose("q", "qh", {0, 2, 1, 3}), node("MatMul", {"qh", "w"}, {"g"}), node("Shape", {"qh"}, {"qs"}),
           sum_to_shape("g", "qs", "dq"), transpose("dq", "y", {0, 2, 1, 3}), merged_shape, merge},
          {{"q", {2, 5, 3, 4}}, {"w", {4, 4}}},
          {"z"},
          DType::Float64,
          {{"g", {2, 3, 5, 4}}}};
  auto [folded, plain] = check_case(w3);
  EXPECT_EQ(plain - folded, 2u);
  // Without g's rank the Transpose stays where it is.
  w3.value_shapes.clear();
  auto [f2, p2] = check_case(w3);
  EXPECT_EQ(p2 - f2, 1u);
}

// A chain of Transposes composes; here to the identity, so the MatMul reads w itself.
TEST(MatMulFold, TransposeChainsCompose) {
  Case c{{transpose("w", "wt", {1, 0}), transpose("wt", "wtt", {1, 0}), node("MatMul", {"x", "wtt"}, {"y"})},
         {{"x", {3, 4}}, {"w", {4, 5}}},
         {"y"}};
  EXPECT_EQ(check_case(c).first, 1u);
  Case c3{{transpose("w", "w1", {1, 0, 2}), transpose("w1", "w2", {0, 2, 1}), node("MatMul", {"x", "w2"}, {"y"})},
          {{"x", {3, 5, 2}}, {"w", {4, 3, 2}}},
          {"y"}};
  EXPECT_EQ(check_case(c3).first, 1u);
}

// The weight gradient of a linear layer: Transpose(Flatten(a)^T · Flatten(dy)) is computed as dy^T · a.
TEST(MatMulFold, TransposedProductSwapsOperands) {
  Case c{{node("Flatten", {"a"}, {"af"}), node("Flatten", {"dy"}, {"dyf"}), transpose("af", "aft", {1, 0}),
          node("MatMul", {"aft", "dyf"}, {"dwt"}), transpose("dwt", "dw", {1, 0})},
         {{"a", {6, 5}}, {"dy", {6, 3}}},
         {"dw"}};
  c.nodes[0].attributes["axis"] = int64_t{1};
  c.nodes[1].attributes["axis"] = int64_t{1};
  auto [folded, plain] = check_case(c);
  EXPECT_EQ(folded, 3u);  // two Flatten views and the MatMul
  EXPECT_EQ(plain, 5u);
}

// A Transpose that is also an output, or read by another op, still runs; the MatMul reads its input anyway.
TEST(MatMulFold, TransposesWithOtherReadersStay) {
  Case c{{transpose("w", "wt", {1, 0}), node("MatMul", {"x", "wt"}, {"y"}), node("Neg", {"wt"}, {"z"})},
         {{"x", {3, 4}}, {"w", {5, 4}}},
         {"y", "z", "wt"}};
  EXPECT_EQ(check_case(c).first, 3u);
}

// A permutation that leaves neither matrix dim contiguous cannot be a GEMM operand: it stays a Transpose.
TEST(MatMulFold, UnreadablePermutationsAreLeftAlone) {
  Case c{{transpose("w", "wt", {2, 0, 1}), node("MatMul", {"x", "wt"}, {"y"})}, {{"x", {4, 2, 5}}, {"w", {5, 3, 4}}}, {"y"}};
  EXPECT_EQ(check_case(c).first, 2u);
  // 1-D operands keep numpy's rules: the output transpose is not absorbed when a rank is unknown.
  Case v{{transpose("m", "mt", {1, 0}), node("MatMul", {"mt", "v"}, {"y"})}, {{"m", {4, 3}}, {"v", {4}}}, {"y"}};
  EXPECT_EQ(check_case(v).first, 1u);
}

// A product read only by a Transpose writes the permuted output directly: rows stay contiguous when the perm
// keeps the last dim last (attention's heads merged back), or after computing B^T·A^T when it moves the
// second-last dim last.
TEST(MatMulFold, OutputTransposesAreWrittenInPlace) {
  for (DType t : {DType::Float64, DType::Float32}) {
    Case merge{{node("MatMul", {"p", "v"}, {"o"}), transpose("o", "y", {0, 2, 1, 3})},
               {{"p", {2, 3, 5, 5}}, {"v", {2, 3, 5, 4}}},
               {"y"},
               t};
    EXPECT_EQ(check_case(merge).first, 1u);
    Case swapped{{node("MatMul", {"a", "b"}, {"o"}), transpose("o", "y", {0, 3, 1, 2})},
                 {{"a", {2, 3, 5, 4}}, {"b", {2, 3, 4, 6}}},
                 {"y"},
                 t};
    EXPECT_EQ(check_case(swapped).first, 1u);
  }
  // sgemm with an output row stride: per matrix, and per matrix of a shared-weight product that can no longer
  // be one call.
  Case heads{{node("MatMul", {"a", "b"}, {"o"}), transpose("o", "y", {0, 2, 1, 3})},
             {{"a", {2, 2, 128, 128}}, {"b", {2, 2, 128, 128}}},
             {"y"},
             DType::Float32};
  EXPECT_EQ(check_case(heads).first, 1u);
  Case linear{{transpose("w", "wt", {1, 0}), node("MatMul", {"x", "wt"}, {"o"}), transpose("o", "y", {1, 0, 2})},
              {{"x", {4, 64, 128}}, {"w", {96, 128}}},
              {"y"},
              DType::Float32};
  EXPECT_EQ(check_case(linear).first, 1u);
  // Unknown ranks (a 1-D operand would change what the output dims are): left alone.
  Case unknown{{node("MatMul", {"a", "b"}, {"o"}), transpose("o", "y", {1, 0})}, {{"a", {3, 4}}, {"b", {4, 5}}}, {"y"}};
  std::vector<Node> nodes = unknown.nodes;
  EXPECT_EQ(fold_transposes_into_matmuls(nodes, {"y"}), 0u);
}

TEST(MatMulFold, FoldingLeavesForeignAndSubgraphNodesAlone) {
  std::vector<Node> nodes{transpose("w", "wt", {1, 0}), node("MatMul", {"x", "wt"}, {"y"})};
  nodes[1].domain = "com.example";
  EXPECT_EQ(fold_transposes_into_matmuls(nodes, {"y"}), 0u);
  EXPECT_EQ(nodes.size(), 2u);
  EXPECT_FALSE(nodes[1].has_attr(kMatMulPermB));
  nodes[1].domain = "";
  nodes.push_back(node("If", {"c"}, {"r"}));
  nodes.back().attributes["then_branch"] = std::make_shared<Graph>();
  EXPECT_EQ(fold_transposes_into_matmuls(nodes, {"y"}), 0u);
  EXPECT_EQ(nodes[1].inputs[1], "wt");
}

}  // namespace
}  // namespace onnxtrain

namespace onnxtrain {
namespace {

// Mixed precision's Casts sit between a MatMul and its Transposes (an nn.Linear in bfloat16: Transpose(W) -> Cast
// -> MatMul forward, MatMul -> Cast -> Transpose for the weight's gradient); they swap places with the Transposes,
// and both Transposes fold into the product.
TEST(MatMulFold, CastsBetweenMatMulsAndTransposesCommute) {
  Node w_half = node("Cast", {"wt"}, {"wt16"});
  w_half.attributes["to"] = int64_t{16};  // BFLOAT16
  Node x_half = node("Cast", {"x"}, {"x16"});
  x_half.attributes["to"] = int64_t{16};
  Node widen = node("Cast", {"p"}, {"p32"});
  widen.attributes["to"] = int64_t{1};  // FLOAT
  Graph g;
  g.inputs = {{"x", {DType::Float32, Shape{Dim::of(5), Dim::of(6)}}}, {"w", {DType::Float32, Shape{Dim::of(4), Dim::of(6)}}}};
  g.outputs = {{"y", {DType::Float32, std::nullopt}}};
  g.nodes = {transpose("w", "wt", {1, 0}), w_half, x_half, node("MatMul", {"x16", "wt16"}, {"p"}), widen,
             transpose("p32", "y", {1, 0})};
  g.value_info["x16"] = {DType::BFloat16, Shape{Dim::of(5), Dim::of(6)}};
  g.value_info["wt16"] = {DType::BFloat16, Shape{Dim::of(6), Dim::of(4)}};

  std::vector<Node> nodes = g.nodes;
  EXPECT_EQ(fold_transposes_into_matmuls(nodes, {"y"}, &g), 2u);
  for (const Node& n : nodes) EXPECT_NE(n.op_type, "Transpose") << n.name;
  // The backward reads the cast weight through a Transpose of its own (dX = dY · W): a chain that composes.
  std::vector<Node> backward = g.nodes;
  backward.push_back(transpose("wt16", "w16", {1, 0}));
  backward.push_back(node("MatMul", {"dy16", "w16"}, {"dx"}));
  EXPECT_EQ(fold_transposes_into_matmuls(backward, {"y", "dx"}, &g), 3u);
  for (const Node& n : backward) EXPECT_NE(n.op_type, "Transpose") << n.name;
  // Unchanged when a Cast has another reader: the Transpose must stay for it.
  std::vector<Node> shared = g.nodes;
  shared.push_back(node("Identity", {"wt16"}, {"also"}));
  EXPECT_EQ(fold_transposes_into_matmuls(shared, {"y", "also"}, &g), 1u) << "only the output Transpose folds";

  // The folded plan computes what the graph says (bfloat16 products: to bfloat16's precision).
  Executor folded(g, {{"", 17}}, std::make_shared<TensorStore>());
  ExecutorOptions plain_opts;
  plain_opts.check_every_value = true;
  Executor plain(g, {{"", 17}}, std::make_shared<TensorStore>(), plain_opts);
  const std::map<std::string, Tensor> feeds{{"x", random_tensor(DType::Float32, {5, 6}, 3)},
                                            {"w", random_tensor(DType::Float32, {4, 6}, 4)}};
  Tensor got = folded.run(feeds).at(0), want = plain.run(feeds).at(0);
  ASSERT_EQ(got.shape, (std::vector<int64_t>{4, 5}));
  ASSERT_EQ(want.shape, got.shape);
  for (int64_t i = 0; i < got.numel(); ++i) EXPECT_NEAR(at(got, i), at(want, i), 2e-2 * (1 + std::abs(at(want, i)))) << i;
  EXPECT_LT(folded.last_plan()->num_steps(), plain.last_plan()->num_steps());
}

}  // namespace
}  // namespace onnxtrain
