// LoRA adapters (training/adapters.h, docs/lora.md) on hand-built graphs: every weight layout the rewrite knows
// (MatMul x W, Gemm transB, MatMul through Transpose, Conv) merges back into a model that computes what the
// adapted one does; the initialisation is seeded and bounded as peft's; errors name the glob, weight and node;
// an adapted model is never adapted twice; the configuration round-trips through checkpoint metadata.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <set>

#include "common/node.h"
#include "common/test_env.h"
#include "executor/executor.h"
#include "graph/error.h"
#include "training/adapters.h"
#include "training/checkpoint.h"
#include "training/session.h"

namespace onnxtrain {
namespace {

using test::node;

TensorData random_tensor(std::vector<int64_t> dims, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0, 0.5f);
  int64_t count = 1;
  for (int64_t d : dims) count *= d;
  std::vector<float> v(static_cast<size_t>(count));
  for (float& x : v) x = n(rng);
  return TensorData::from<float>(std::move(dims), v);
}

// x[2,3] -> MatMul(x, w1[3,4]) -> Gemm(., w2[5,4], transB=1) -> MatMul(., Transpose(w3[2,5])) -> y[2,2]
Model three_layouts() {
  Model m;
  m.opset_imports[""] = 17;
  Graph& g = m.graph;
  g.inputs.push_back({"x", {DType::Float32, Shape{Dim::of(2), Dim::of(3)}}});
  g.outputs.push_back({"y", {DType::Float32, Shape{Dim::of(2), Dim::of(2)}}});
  g.initializers["w1"] = random_tensor({3, 4}, 1);
  g.initializers["w2"] = random_tensor({5, 4}, 2);
  g.initializers["b2"] = random_tensor({5}, 3);
  g.initializers["w3"] = random_tensor({2, 5}, 4);
  g.nodes.push_back(node("MatMul", {"x", "w1"}, {"h1"}));
  Node gemm = node("Gemm", {"h1", "w2", "b2"}, {"h2"});
  gemm.attributes["transB"] = int64_t{1};
  gemm.attributes["alpha"] = 0.5f;  // the adapter adds to the Gemm's output, alpha or not
  g.nodes.push_back(gemm);
  g.nodes.push_back(node("Transpose", {"w3"}, {"w3t"}));
  g.nodes.push_back(node("MatMul", {"h2", "w3t"}, {"y"}));
  return m;
}

Model conv_model() {
  Model m;
  m.opset_imports[""] = 17;
  Graph& g = m.graph;
  g.inputs.push_back({"x", {DType::Float32, Shape{Dim::of(1), Dim::of(2), Dim::of(5), Dim::of(5)}}});
  g.outputs.push_back({"y", {DType::Float32, std::nullopt}});
  g.initializers["k"] = random_tensor({3, 2, 3, 3}, 5);
  Node c = node("Conv", {"x", "k"}, {"y"});
  c.attributes["pads"] = std::vector<int64_t>{1, 0, 1, 0};
  c.attributes["strides"] = std::vector<int64_t>{2, 1};
  g.nodes.push_back(c);
  return m;
}

TrainingConfig lora(std::vector<std::string> target, int64_t rank = 2, double alpha = 3) {
  TrainingConfig c;
  c.loss.kind = "mse";
  c.adapter.kind = "lora";
  c.adapter.rank = rank;
  c.adapter.alpha = alpha;
  c.adapter.target = std::move(target);
  return c;
}

Tensor input(std::vector<int64_t> shape, unsigned seed) {
  TensorData d = random_tensor(std::move(shape), seed);
  return Tensor::from_data(d);
}

float max_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape, b.shape);
  float m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) m = std::max(m, std::abs(a.ptr<float>()[i] - b.ptr<float>()[i]));
  return m;
}

// Trained-looking adapters: B random (it starts at zero, which would merge to nothing).
void randomize_b(TrainingSession& s) {
  unsigned seed = 10;
  for (const std::string& w : s.trainable())
    if (w.ends_with(".lora_B")) {
      Tensor b = s.get_weight(w);
      s.set_weight(w, input(b.shape, seed++));
    }
}

void expect_merge_matches(const Model& base, const TrainingConfig& cfg, const Tensor& x, size_t adapters) {
  TrainingSession s(base, cfg);
  EXPECT_EQ(s.trainable().size(), 2 * adapters);
  const Tensor before = s.infer({{"x", x}})[0];
  TrainingSession plain(base, TrainingConfig{});
  EXPECT_EQ(max_diff(before, plain.infer({{"x", x}})[0]), 0.0f) << "B = 0 must leave the outputs exactly";
  randomize_b(s);
  const Tensor adapted = s.infer({{"x", x}})[0];
  EXPECT_GT(max_diff(adapted, before), 1e-2f) << "the adapters must change the outputs";
  Model merged = s.export_inference();
  EXPECT_EQ(merge_lora(merged), static_cast<int>(adapters));
  ASSERT_EQ(merged.graph.nodes.size(), base.graph.nodes.size());
  for (size_t i = 0; i < base.graph.nodes.size(); ++i) {
    EXPECT_EQ(merged.graph.nodes[i].op_type, base.graph.nodes[i].op_type);
    EXPECT_EQ(merged.graph.nodes[i].outputs, base.graph.nodes[i].outputs);
  }
  EXPECT_EQ(merged.graph.initializers.size(), base.graph.initializers.size());
  TrainingSession m(merged, TrainingConfig{});
  EXPECT_LT(max_diff(m.infer({{"x", x}})[0], adapted), 1e-5f);
}

TEST(Lora, EveryLinearLayoutMergesBackToWhatTheAdaptedModelComputes) {
  expect_merge_matches(three_layouts(), lora({"all-linear"}), input({2, 3}, 7), 3);
}

// W read by two MatMuls through two Transposes, the later Transpose's reader first: one adapter serves both,
// its scale constant placed before either branch.
TEST(Lora, AWeightReadTwiceThroughTransposesSharesOneAdapter) {
  Model m;
  m.opset_imports[""] = 17;
  Graph& g = m.graph;
  g.inputs.push_back({"x", {DType::Float32, Shape{Dim::of(2), Dim::of(3)}}});
  g.outputs.push_back({"y", {DType::Float32, Shape{Dim::of(2), Dim::of(4)}}});
  g.initializers["w"] = random_tensor({4, 3}, 1);
  g.nodes.push_back(node("Transpose", {"w"}, {"t1"}));
  g.nodes.push_back(node("Transpose", {"w"}, {"t2"}));
  g.nodes.push_back(node("MatMul", {"x", "t2"}, {"h"}));
  g.nodes.push_back(node("Sigmoid", {"h"}, {"s"}));
  g.nodes.push_back(node("MatMul", {"x", "t1"}, {"h2"}));
  g.nodes.push_back(node("Add", {"s", "h2"}, {"y"}));
  expect_merge_matches(m, lora({"w"}), input({2, 3}, 9), 1);
  // The adapted graph stays in topological order (ONNX requires it of a file; our executor would not notice).
  Model adapted = m;
  apply_lora(adapted, lora({"w"}).adapter);
  std::set<std::string> defined = {"x"};
  for (const auto& [name, t] : adapted.graph.initializers) defined.insert(name);
  for (const Node& n : adapted.graph.nodes) {
    for (const std::string& in : n.inputs) EXPECT_TRUE(defined.count(in)) << n.describe() << " reads " << in << " early";
    defined.insert(n.outputs.begin(), n.outputs.end());
  }
}

TEST(Lora, ConvKernelsAdaptAndMerge) {
  expect_merge_matches(conv_model(), lora({"k"}, 2, 4), input({1, 2, 5, 5}, 8), 1);
}

TEST(Lora, AIsKaimingUniformSeededAndBIsZero) {
  Model a = three_layouts(), b = three_layouts(), c = three_layouts();
  AdapterSpec spec = lora({"w1", "w3"}, 4).adapter;
  const auto added = apply_lora(a, spec);
  ASSERT_EQ(added.size(), 2u);
  EXPECT_EQ(added[0].weight, "w1");
  EXPECT_EQ(added[1].nodes, std::vector<std::string>{"y"});
  apply_lora(b, spec);
  spec.seed = 1;
  apply_lora(c, spec);
  EXPECT_EQ(a.graph.initializers.at("w1.lora_A"), b.graph.initializers.at("w1.lora_A"));
  EXPECT_NE(a.graph.initializers.at("w1.lora_A"), c.graph.initializers.at("w1.lora_A"));
  // w1 [in 3, out 4]; w3 [out 2, in 5] through Transpose: fan_in 3 and 5.
  for (auto [name, in, out] : {std::tuple{"w1", 3, 4}, std::tuple{"w3", 5, 2}}) {
    const TensorData& A = a.graph.initializers.at(std::string(name) + ".lora_A");
    const TensorData& B = a.graph.initializers.at(std::string(name) + ".lora_B");
    EXPECT_EQ(A.dims, (std::vector<int64_t>{in, 4}));
    EXPECT_EQ(B.dims, (std::vector<int64_t>{4, out}));
    float hi = 0;
    for (float v : A.as<float>()) hi = std::max(hi, std::abs(v));
    EXPECT_LE(hi, 1 / std::sqrt(float(in)));
    EXPECT_GT(hi, 0.3f / std::sqrt(float(in)));
    for (float v : B.as<float>()) EXPECT_EQ(v, 0.0f);
  }
  EXPECT_FALSE(a.graph.initializers.count("w2.lora_A"));
}

TEST(Lora, ErrorsNameTheGlobTheWeightAndTheNode) {
  auto err = [](Model m, std::vector<std::string> target) {
    return test::error_of([&] { apply_lora(m, lora(std::move(target)).adapter); });
  };
  EXPECT_EQ(err(three_layouts(), {"fc*"}),
            "adapter.target 'fc*': matches no floating-point initializer; they are: b2, w1, w2, w3");
  EXPECT_EQ(err(three_layouts(), {"b*"}), "adapter.target 'b*': matches no MatMul/Gemm/Conv weight (it matches b2)");

  Model tied = three_layouts();  // w1 also read by a Gather, as an embedding tied to a projection
  tied.graph.inputs.push_back({"ids", {DType::Int64, Shape{Dim::of(2)}}});
  tied.graph.nodes.push_back(node("Gather", {"w1", "ids"}, {"emb"}));
  EXPECT_EQ(err(tied, {"w1"}), "adapter.target 'w1': weight 'w1' is also read by Gather, which an adapter would not "
                               "follow (tied weights?) (node 'emb' (Gather))");
  EXPECT_EQ(apply_lora(tied, lora({"all-linear"}).adapter).size(), 2u) << "all-linear skips the tied weight";

  Model grouped = conv_model();
  grouped.graph.initializers["k"] = random_tensor({2, 1, 3, 3}, 5);
  grouped.graph.nodes[0].attributes["group"] = int64_t{2};
  EXPECT_EQ(err(grouped, {"k"}), "adapter.target 'k': weight 'k' is the kernel of a grouped Conv, which is not "
                                 "supported (node 'y' (Conv))");

  Model left = three_layouts();
  left.graph.nodes[0].inputs = {"w1", "x"};
  EXPECT_NE(err(left, {"w1"}).find("weight 'w1' is the left operand"), std::string::npos);

  EXPECT_EQ(test::error_of([] { validate_adapter(lora({}, 0).adapter); }),
            "adapter.rank: expected an integer >= 1, got 0");
  AdapterSpec d = lora({}).adapter;
  d.dropout = 1;
  EXPECT_EQ(test::error_of([&] { validate_adapter(d); }), "adapter.dropout: expected a number in [0, 1), got 1.000000");
  d.dropout = 0.1;
  validate_adapter(d);
}

TEST(Lora, AnAdaptedModelKeepsItsAdaptersAndTheConfigRoundTrips) {
  TrainingConfig cfg = lora({"w1", "w2"}, 3, 6);
  cfg.adapter.seed = 9;
  cfg.trainable = {"b2"};  // trained in full beside the adapters
  TrainingSession s(three_layouts(), cfg);
  EXPECT_EQ(s.trainable(), (std::vector<std::string>{"w1.lora_A", "w1.lora_B", "w2.lora_A", "w2.lora_B", "b2"}));
  randomize_b(s);
  // Handing the adapted model back with the same config continues with its adapters rather than adding more.
  TrainingSession again(s.export_inference(), cfg);
  EXPECT_EQ(again.trainable(), s.trainable());
  for (const std::string& w : s.trainable()) EXPECT_EQ(max_diff(again.get_weight(w), s.get_weight(w)), 0.0f) << w;

  const TrainingConfig back = config_from_metadata(config_to_metadata(cfg), "test");
  EXPECT_EQ(back.adapter.kind, "lora");
  EXPECT_EQ(back.adapter.rank, 3);
  EXPECT_EQ(back.adapter.alpha, 6);
  EXPECT_EQ(back.adapter.target, (std::vector<std::string>{"w1", "w2"}));
  EXPECT_EQ(back.adapter.seed, 9);
}

TEST(Lora, AnAdaptersFileAppliesToTheBaseAndRefusesAnotherBase) {
  TrainingConfig cfg = lora({"all-linear"});
  cfg.trainable = {"b2"};
  TrainingSession s(three_layouts(), cfg);
  randomize_b(s);
  const Model file = extract_lora(s.export_inference(), cfg.adapter, {"b2"});
  EXPECT_EQ(file.graph.initializers.size(), 7u);  // A and B of three weights, and b2
  Model applied = apply_lora_file(three_layouts(), file, "adapters.onnx");
  for (const auto& [name, t] : s.export_inference().graph.initializers)
    EXPECT_EQ(applied.graph.initializers.at(name), t) << name;

  Model other = three_layouts();
  other.graph.initializers["w1"] = random_tensor({3, 6}, 1);
  other.graph.nodes[1].inputs[1] = "w2x";
  other.graph.initializers["w2x"] = random_tensor({5, 6}, 1);
  other.graph.initializers.erase("w2");
  EXPECT_NE(test::error_of([&] { apply_lora_file(other, file, "adapters.onnx"); }).find("adapters.onnx: "),
            std::string::npos);
  EXPECT_EQ(test::error_of([&] { apply_lora_file(three_layouts(), three_layouts(), "base.onnx"); }),
            "base.onnx: is not a LoRA adapters file (no 'onnxtrain.adapter.kind' metadata)");
}

// ---- Adapter dropout (peft's lora_dropout) ----

// x[n, 32] -> MatMul(x, w1[32, 16]) -> Relu -> MatMul(., w2[16, 4]) -> y
Model mlp(int64_t n) {
  Model m;
  m.opset_imports[""] = 17;
  Graph& g = m.graph;
  g.inputs.push_back({"x", {DType::Float32, Shape{Dim::of(n), Dim::of(32)}}});
  g.outputs.push_back({"y", {DType::Float32, Shape{Dim::of(n), Dim::of(4)}}});
  g.initializers["w1"] = random_tensor({32, 16}, 1);
  g.initializers["w2"] = random_tensor({16, 4}, 2);
  g.nodes.push_back(node("MatMul", {"x", "w1"}, {"h"}));
  g.nodes.push_back(node("Relu", {"h"}, {"r"}));
  g.nodes.push_back(node("MatMul", {"r", "w2"}, {"y"}));
  return m;
}

// The mask's formula written out again (executor/cpu/dropout.cpp DropoutMask), to check the kernel draws it.
uint64_t splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
bool expected_keep(int64_t seed, int64_t counter, int64_t i, float ratio) {
  const uint64_t run = splitmix64(splitmix64(static_cast<uint64_t>(seed)) ^ static_cast<uint64_t>(counter));
  return static_cast<double>(splitmix64(run + static_cast<uint64_t>(i)) >> 11) * 0x1.0p-53 >= double(ratio);
}

int count_op(const Graph& g, const std::string& op) {
  return static_cast<int>(std::count_if(g.nodes.begin(), g.nodes.end(), [&](const Node& n) { return n.op_type == op; }));
}

// The rewrite on its own: each branch reads x * Where(mask, 1 / (1 - p), 0); the mask is the documented
// counter-based draw (exactly), drops about p of the elements, changes with the counter and between branches,
// and is the same for the same counter.
TEST(LoraDropout, TheBranchReadsTheMaskedScaledInputAndTheMaskIsTheDocumentedDraw) {
  const int64_t n = 64;
  const double p = 0.25;
  Model m = mlp(n);
  TrainingConfig cfg = lora({"w1", "w2"});
  cfg.adapter.dropout = p;
  cfg.adapter.seed = 5;
  apply_lora(m, cfg.adapter);
  EXPECT_EQ(add_lora_dropout(m.graph, AdapterSpec{}), "");  // no adapter: nothing to do
  const std::string counter = add_lora_dropout(m.graph, cfg.adapter);
  ASSERT_EQ(counter, kLoraDropoutCounter);
  ASSERT_EQ(count_op(m.graph, "DropoutMask"), 2);
  // The masks and the branches' inputs become outputs, to look at.
  std::vector<std::string> masks, dropped, inputs, weights;
  for (const Node& nd : m.graph.nodes) {
    if (nd.op_type != "DropoutMask") continue;
    EXPECT_EQ(nd.domain, "onnxtrain");
    masks.push_back(nd.outputs[0]);
    inputs.push_back(nd.inputs[0]);
    EXPECT_EQ(nd.inputs[1], counter);
    EXPECT_FLOAT_EQ(nd.attr_float("ratio", 0), static_cast<float>(p));
  }
  for (const Node& nd : m.graph.nodes)
    if (nd.op_type == "MatMul" && nd.inputs[1].ends_with(".lora_A")) {
      dropped.push_back(nd.inputs[0]);
      weights.push_back(nd.inputs[1].substr(0, nd.inputs[1].size() - 7));
    }
  ASSERT_EQ(dropped.size(), 2u);
  EXPECT_EQ(inputs, (std::vector<std::string>{"x", "r"}));
  EXPECT_EQ(weights, (std::vector<std::string>{"w1", "w2"}));
  for (size_t k = 0; k < 2; ++k) {
    m.graph.outputs.push_back({masks[k], *m.graph.type_of(masks[k])});
    m.graph.outputs.push_back({dropped[k], *m.graph.type_of(dropped[k])});
    m.graph.outputs.push_back({inputs[k], {DType::Float32, std::nullopt}});
  }
  auto store = std::make_shared<TensorStore>();
  ExecutorOptions eo;
  eo.variables.insert(counter);
  Executor ex(m.graph, {{"", 17}, {"onnxtrain", 1}}, store, eo);
  const Tensor x = input({n, 32}, 7);
  auto run = [&](int64_t c) {
    store->at(counter).ptr<int64_t>()[0] = c;
    return ex.run({{"x", x}});
  };
  const float scale = static_cast<float>(1.0 / (1.0 - p));
  std::vector<std::vector<bool>> seen;
  for (int64_t c : {0, 1, 0}) {
    const std::vector<Tensor> out = run(c);
    for (size_t k = 0; k < 2; ++k) {
      const Tensor& mask = out[1 + 3 * k];
      const Tensor& xd = out[2 + 3 * k];
      const Tensor& xin = out[3 + 3 * k];
      const int64_t seed = lora_dropout_seed(5, weights[k], 0);
      int64_t kept = 0;
      std::vector<bool> bits;
      for (int64_t i = 0; i < mask.numel(); ++i) {
        const bool keep = mask.ptr<bool>()[i];
        ASSERT_EQ(keep, expected_keep(seed, c, i, static_cast<float>(p))) << "element " << i << " counter " << c;
        EXPECT_EQ(xd.ptr<float>()[i], keep ? xin.ptr<float>()[i] * scale : 0.0f);
        kept += keep;
        bits.push_back(keep);
      }
      const double dropped_fraction = 1.0 - double(kept) / double(mask.numel());
      EXPECT_NEAR(dropped_fraction, p, 0.04) << "branch " << k << " of " << mask.numel() << " elements";
      seen.push_back(std::move(bits));
    }
  }
  EXPECT_NE(seen[0], seen[2]) << "the counter changes the mask";
  EXPECT_EQ(seen[0], seen[4]) << "the same counter draws the same mask";
  // The two branches draw different masks (seen[0] has 64 x 32 elements, seen[1] 64 x 16: compare a prefix).
  EXPECT_NE(std::vector<bool>(seen[0].begin(), seen[0].begin() + 1024), std::vector<bool>(seen[1].begin(), seen[1].end()));
}

// The dropout counter, as a checkpoint stores it in its model (with the training forward's dropout nodes).
int64_t dropout_steps(const TrainingSession& s) {
  const Model ckpt = s.checkpoint();
  EXPECT_EQ(count_op(ckpt.graph, "DropoutMask"), 2);
  return ckpt.graph.initializers.at(kLoraDropoutCounter).as<int64_t>()[0];
}

std::map<std::string, Tensor> mlp_feeds(const TrainingSession& s, int64_t n, unsigned seed) {
  return {{"x", input({n, 32}, seed)}, {s.target_name(), input({n, 4}, seed + 100)}};
}

// Dropout lives in the training graph only; eval and export compute the adapters without it, so a dropout
// session's outputs equal those of the same adapters without dropout, bit for bit.
TEST(LoraDropout, OnlyTheTrainingGraphDropsAndInferenceMatchesTheSameAdaptersWithoutDropout) {
  const int64_t n = 16;
  TrainingConfig cfg = lora({"w1", "w2"});
  cfg.optimizer.kind = "adamw";
  cfg.optimizer.learning_rate = 1e-2;
  TrainingConfig dcfg = cfg;
  dcfg.adapter.dropout = 0.5;
  TrainingSession plain(mlp(n), cfg), dropping(mlp(n), dcfg);
  EXPECT_EQ(count_op(plain.training_graph(), "DropoutMask"), 0);
  EXPECT_EQ(count_op(dropping.training_graph(), "DropoutMask"), 2);
  // The frozen weights get no gradient: the same products as without dropout (no dW for w1 or w2).
  EXPECT_EQ(count_op(dropping.training_graph(), "MatMul"), count_op(plain.training_graph(), "MatMul"));
  for (const Node& nd : dropping.training_graph().nodes)
    for (const std::string& o : nd.outputs) EXPECT_TRUE(o != "w1_grad" && o != "w2_grad") << nd.describe();
  EXPECT_EQ(dropping.trainable(), plain.trainable());
  std::vector<float> with, without;
  for (int step = 0; step < 4; ++step) {
    with.push_back(dropping.train_step(mlp_feeds(dropping, n, step)));
    without.push_back(plain.train_step(mlp_feeds(plain, n, step)));
  }
  EXPECT_EQ(with[0], without[0]) << "B = 0 on the first step: the branch adds nothing, dropped or not";
  EXPECT_NE(with[3], without[3]) << "dropout changes the training";
  const Model exported = dropping.export_inference();
  EXPECT_EQ(count_op(exported.graph, "DropoutMask"), 0);
  EXPECT_FALSE(exported.graph.initializers.count(kLoraDropoutCounter));
  TrainingSession same(mlp(n), cfg);
  for (const std::string& w : dropping.trainable()) same.set_weight(w, dropping.get_weight(w));
  const Tensor x = input({n, 32}, 50);
  const Tensor a = dropping.infer({{"x", x}})[0];
  EXPECT_EQ(max_diff(a, same.infer({{"x", x}})[0]), 0.0f);
  TrainingSession from_export(exported, cfg);
  EXPECT_EQ(max_diff(a, from_export.infer({{"x", x}})[0]), 0.0f);
  EXPECT_EQ(dropout_steps(dropping), 4) << "one draw per training step";
}

// The masks are a function of the seed and the step: the same config trains the same bits, another seed
// (A's draw kept equal) other bits; a checkpoint resumes bit for bit, with gradient accumulation too.
TEST(LoraDropout, SeededDeterministicAndResumesBitForBit) {
  const int64_t n = 16;
  for (int accumulation : {1, 3}) {
    TrainingConfig cfg = lora({"all-linear"});
    cfg.optimizer.kind = "adamw";
    cfg.optimizer.learning_rate = 1e-2;
    cfg.optimizer.gradient_accumulation = accumulation;
    cfg.adapter.dropout = 0.3;
    cfg.adapter.seed = 4;
    const int first = 5, then = 4;
    TrainingSession straight(mlp(n), cfg), again(mlp(n), cfg), part(mlp(n), cfg);
    std::vector<float> a, b, resumed;
    for (int step = 0; step < first + then; ++step) {
      a.push_back(straight.train_step(mlp_feeds(straight, n, step)));
      b.push_back(again.train_step(mlp_feeds(again, n, step)));
    }
    EXPECT_EQ(a, b) << "accumulation " << accumulation;
    for (int step = 0; step < first; ++step) resumed.push_back(part.train_step(mlp_feeds(part, n, step)));
    TrainingSession r = TrainingSession::from_checkpoint(part.checkpoint(), "ckpt");
    EXPECT_EQ(dropout_steps(r), first);
    for (int step = first; step < first + then; ++step) resumed.push_back(r.train_step(mlp_feeds(r, n, step)));
    EXPECT_EQ(resumed, a) << "accumulation " << accumulation;
    for (const std::string& w : straight.trainable()) EXPECT_EQ(max_diff(r.get_weight(w), straight.get_weight(w)), 0.0f) << w;
  }
}

}  // namespace
}  // namespace onnxtrain
