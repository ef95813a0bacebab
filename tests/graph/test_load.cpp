// Loading real ONNX files (written by onnx.helper in the venv), validation on load, shape inference, and
// atomic saving.
#include <gtest/gtest.h>

#include <fstream>
#include <random>

#include "common/test_env.h"
#include "graph/error.h"
#include "graph/graph_test_util.h"
#include "graph/model_io.h"
#include "graph/proto.h"
#include "graph/shape_inference.h"
#include "graph/validate.h"

namespace onnxtrain {
namespace {

namespace fs = std::filesystem;
using test::expect_error;

fs::path model_path(const std::string& name) {
  const fs::path dir = test::generated_models();
  if (dir.empty()) return {};
  return dir / (name + ".onnx");
}

bool no_models() { return test::generated_models().empty(); }

std::string file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

const TypeInfo& inferred(const Model& m, const std::string& v) {
  static const TypeInfo none;
  auto it = m.graph.value_info.find(v);
  EXPECT_NE(it, m.graph.value_info.end()) << "no inferred type for '" << v << "'";
  return it == m.graph.value_info.end() ? none : it->second;
}

TEST(Load, Opset13ModelValidatesAndInfersSymbolicShapes) {
  if (no_models()) GTEST_SKIP() << "venv python with onnx missing";
  const Model m = load_model(model_path("op13"));
  EXPECT_EQ(m.opset(""), 13);
  EXPECT_EQ(m.ir_version, 7);
  EXPECT_EQ(m.producer_name, "make_models.py");
  ASSERT_EQ(m.graph.nodes.size(), 4u);
  EXPECT_EQ(m.graph.nodes[3].op_type, "ReduceSum");
  EXPECT_EQ(m.graph.nodes[3].attr_int("keepdims", 0), 1);
  EXPECT_EQ(m.graph.initializers.at("w").dims, (std::vector<int64_t>{8, 4}));
  EXPECT_EQ(m.graph.initializers.at("axes").as<int64_t>()[0], 1);
  ASSERT_TRUE(m.graph.inputs[0].type.shape);
  EXPECT_EQ(*m.graph.inputs[0].type.shape, (Shape{Dim::sym("batch"), Dim::of(8)}));
  // x[batch,8] @ w[8,4] -> [batch,4]; Relu keeps it.
  EXPECT_EQ(inferred(m, "h").dtype, DType::Float32);
  EXPECT_EQ(inferred(m, "r").shape, (Shape{Dim::sym("batch"), Dim::of(4)}));
}

TEST(Load, Opset17LayerNorm) {
  if (no_models()) GTEST_SKIP() << "venv python with onnx missing";
  const Model m = load_model(model_path("op17"));
  EXPECT_EQ(m.opset(""), 17);
  EXPECT_EQ(m.graph.nodes[0].attr_int("axis", 0), -1);
  EXPECT_FLOAT_EQ(m.graph.nodes[0].attr_float("epsilon", 0), 1e-5f);
  EXPECT_EQ(inferred(m, "n").shape, (Shape{Dim::sym("batch"), Dim::of(8)}));
}

TEST(Load, Opset18ReduceMeanWithAxesInput) {
  if (no_models()) GTEST_SKIP() << "venv python with onnx missing";
  const Model m = load_model(model_path("op18"));
  EXPECT_EQ(m.opset(""), 18);
  EXPECT_EQ(m.graph.nodes[0].inputs, (std::vector<std::string>{"x", "axes"}));
  // Mean over axis 1 of [batch,8] without keepdims leaves [batch]: needs the axes initializer's value.
  EXPECT_EQ(inferred(m, "m").shape, (Shape{Dim::sym("batch")}));
}

TEST(Load, Opset21Model) {
  if (no_models()) GTEST_SKIP() << "venv python with onnx missing";
  const Model m = load_model(model_path("op21"));
  EXPECT_EQ(m.opset(""), 21);
  EXPECT_EQ(m.ir_version, 10);
  EXPECT_EQ(m.graph.nodes[0].attr_string("approximate", ""), "tanh");
  EXPECT_EQ(inferred(m, "g").shape, (Shape{Dim::sym("batch"), Dim::of(8)}));
  EXPECT_EQ(m.graph.type_of("y")->dtype, DType::Float64);
}

TEST(Load, SubgraphReadsOuterScopeAndGetsTypes) {
  if (no_models()) GTEST_SKIP() << "venv python with onnx missing";
  const Model m = load_model(model_path("if17"));
  const auto& then_g = std::get<std::shared_ptr<Graph>>(m.graph.nodes[0].attributes.at("then_branch"));
  ASSERT_TRUE(then_g);
  EXPECT_EQ(then_g->nodes[0].inputs, (std::vector<std::string>{"x", "x"}));
  const TypeInfo* t = then_g->type_of("t");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype, DType::Float32);
  // The If node reads x only through its branches; ordering must still see that dependency.
  Graph g = m.graph;
  Node producer;
  producer.name = "make_x";
  producer.op_type = "Identity";
  producer.inputs = {"x_in"};
  producer.outputs = {"x"};
  g.inputs[0].name = "x_in";
  g.nodes.push_back(producer);  // after the If that needs it
  EXPECT_EQ(topological_order(g), (std::vector<size_t>{1, 0}));
}

TEST(Load, CustomDomainAndUnknownOpsPassCheckerAndInference) {
  if (no_models()) GTEST_SKIP() << "venv python with onnx missing";
  const Model m = load_model(model_path("custom"));
  EXPECT_EQ(m.opset("onnxtrain"), 1);
  ASSERT_NE(m.find_function("onnxtrain", "Scale2"), nullptr);
  EXPECT_EQ(m.find_function("onnxtrain", "Scale2")->nodes.size(), 2u);
  EXPECT_EQ(m.graph.nodes[2].describe(), "node 'mystery' (onnxtrain.Mystery)");
  // Before the unknown op, shapes are known.
  EXPECT_EQ(inferred(m, "pre").shape, (Shape{Dim::sym("batch"), Dim::of(8)}));
  // The model-local function body lets ONNX type our op: Mul of [batch,8] by a scalar.
  EXPECT_EQ(inferred(m, "s").shape, (Shape{Dim::sym("batch"), Dim::of(8)}));
  // Past the unknown op ONNX knows nothing, and that is not an error.
  auto it = m.graph.value_info.find("m");
  if (it != m.graph.value_info.end()) {
    EXPECT_FALSE(it->second.shape.has_value());
  }
}

TEST(Load, SharedBenchModel) {
  const fs::path p = test::source_dir() / ".." / "shared" / "bench" / "models" / "w1.onnx";
  if (!fs::exists(test::source_dir() / ".." / "shared")) GTEST_SKIP() << "../shared is absent";
  const Model m = load_model(p);
  EXPECT_EQ(m.opset(""), 17);
  ASSERT_EQ(m.graph.nodes.size(), 5u);
  EXPECT_EQ(m.graph.nodes[0].op_type, "Gemm");
  EXPECT_EQ(m.graph.nodes[0].describe(), "node '/fc1/Gemm' (Gemm)");
  EXPECT_EQ(m.graph.initializers.size(), 6u);
  EXPECT_EQ(m.graph.initializers.at("fc2.weight").dims, (std::vector<int64_t>{256, 256}));
  EXPECT_EQ(*m.graph.inputs[0].type.shape, (Shape{Dim::sym("batch"), Dim::of(64)}));
  // Gemm with fc1.weight [256,64] and transB: [batch,64] -> [batch,256].
  EXPECT_EQ(inferred(m, "/Relu_output_0").shape, (Shape{Dim::sym("batch"), Dim::of(256)}));
}

TEST(Load, ExternalDataModelWrittenByOnnx) {
  if (no_models()) GTEST_SKIP() << "venv python with onnx missing";
  const Model m = load_model(model_path("ext"));
  const TensorData& big = m.graph.initializers.at("big");
  ASSERT_EQ(big.dims, (std::vector<int64_t>{64, 4}));
  ASSERT_EQ(big.as<float>().size(), 256u);
  EXPECT_EQ(big.as<float>()[0], 0.0f);
  EXPECT_EQ(big.as<float>()[255], 255.0f);  // np.arange
  EXPECT_EQ(m.graph.initializers.at("small_row").as<float>()[3], 0.5f);
  EXPECT_EQ(inferred(m, "h").shape, (Shape{Dim::sym("batch"), Dim::of(4)}));
  // From bytes there is no folder to resolve the data file against.
  expect_error([&] { load_model_from_bytes(file_bytes(model_path("ext")), "ext-bytes"); },
               {"ext-bytes", "tensor 'big'", "ext.bin"});
}

TEST(LoadErrors, MissingFile) {
  expect_error([] { load_model("/nonexistent/dir/model.onnx"); }, {"/nonexistent/dir/model.onnx", "cannot open"});
}

TEST(LoadErrors, TruncatedBytes) {
  if (no_models()) GTEST_SKIP() << "venv python with onnx missing";
  const std::string bytes = file_bytes(model_path("op13"));
  ASSERT_GT(bytes.size(), 100u);
  for (size_t cut : {bytes.size() / 2, bytes.size() - 3, size_t{5}})
    expect_error([&] { load_model_from_bytes(std::string_view(bytes).substr(0, cut), "cut.onnx"); },
                 {"cut.onnx", "not a valid ONNX model"});
}

TEST(LoadErrors, RandomBytesAndEmptyInput) {
  std::mt19937 rng(1234);
  std::string junk(4096, '\0');
  for (auto& c : junk) c = static_cast<char>(rng() & 0xFF);
  expect_error([&] { load_model_from_bytes(junk, "junk.bin"); }, {"junk.bin", "not a valid ONNX model"});
  expect_error([&] { load_model_from_bytes("", "empty.onnx"); }, {"empty.onnx", "not a valid ONNX model"});
  const auto dir = test::temp_dir("load_junk");
  {
    std::ofstream out(dir / "junk.onnx", std::ios::binary);
    out << junk;
  }
  expect_error([&] { load_model(dir / "junk.onnx"); }, {(dir / "junk.onnx").string(), "not a valid ONNX model"});
}

TEST(LoadErrors, CheckerFailureNamesSourceAndNode) {
  Model m;
  m.opset_imports[""] = 17;
  m.graph.name = "g";
  m.graph.inputs.push_back({"x", {DType::Float32, Shape{Dim::of(2)}}});
  m.graph.outputs.push_back({"y", {DType::Float32, Shape{Dim::of(2)}}});
  Node n;
  n.name = "bad_relu";
  n.op_type = "Relu";
  n.inputs = {"x", "x"};  // Relu takes one input
  n.outputs = {"y"};
  m.graph.nodes.push_back(n);
  expect_error([&] { load_model_from_bytes(serialize_model(m), "bad.onnx"); },
               {"bad.onnx", "ONNX checker", "bad_relu"});
  expect_error([&] { validate_model(m, "in-memory"); }, {"in-memory: ONNX checker"});
  LoadOptions lax;
  lax.validate = false;
  lax.infer_shapes = false;
  EXPECT_NO_THROW(load_model_from_bytes(serialize_model(m), "bad.onnx", lax));
}

// Regression (fuzz_gradients): a Conv whose input has rank 2 while its weight has two spatial dims crashes ONNX
// 1.16's shape inference (it indexes an empty dilations vector by the kernel's rank). The inference runs in a
// child process, so the child dies and the loader reports the node. The other crash classes and the hang are
// in test_isolation.cpp.
TEST(LoadErrors, ConvInputRankBelowKernelIsAnError) {
  const fs::path p = test::source_dir() / "fuzz" / "corpus" / "gradients" / "regress-conv-input-rank-below-kernel.onnx";
  expect_error([&] { load_model(p); },
               {p.string() + ": ONNX shape inference crashed (", ") on node 'conv' (Conv); it ran in a child process"});
}

TEST(LoadErrors, CycleThroughLoad) {
  Model m;
  m.opset_imports[""] = 17;
  m.graph.name = "g";
  m.graph.inputs.push_back({"x", {DType::Float32, Shape{Dim::of(2)}}});
  m.graph.outputs.push_back({"v2", {DType::Float32, Shape{Dim::of(2)}}});
  Node a;
  a.name = "first";
  a.op_type = "Add";
  a.inputs = {"x", "v2"};
  a.outputs = {"v1"};
  Node b;
  b.name = "second";
  b.op_type = "Relu";
  b.inputs = {"v1"};
  b.outputs = {"v2"};
  m.graph.nodes = {a, b};
  // The checker only says "not topologically sorted"; the report names the whole cycle.
  expect_error([&] { load_model_from_bytes(serialize_model(m), "cycle.onnx"); },
               {"cycle.onnx", "cycle", "node 'first' (Add) reads 'v2' from node 'second' (Relu)", "'v1'"});
}

TEST(LoadErrors, UndefinedInputThroughLoad) {
  Model m;
  m.opset_imports[""] = 17;
  m.graph.name = "g";
  m.graph.inputs.push_back({"x", {DType::Float32, Shape{Dim::of(2)}}});
  m.graph.outputs.push_back({"y", {DType::Float32, Shape{Dim::of(2)}}});
  Node n;
  n.name = "add";
  n.op_type = "Add";
  n.inputs = {"x", "ghost"};
  n.outputs = {"y"};
  m.graph.nodes.push_back(n);
  expect_error([&] { load_model_from_bytes(serialize_model(m), "ghost.onnx"); },
               {"ghost.onnx", "node 'add' (Add)", "input 'ghost' is not produced"});
}

TEST(LoadErrors, UnsortedFileIsRejectedButCanBeSorted) {
  if (no_models()) GTEST_SKIP() << "venv python with onnx missing";
  expect_error([&] { load_model(model_path("unsorted")); },
               {"unsorted.onnx", "node 'second' (Relu) reads 'a' before the node producing it"});
  LoadOptions lax;
  lax.validate = false;
  lax.infer_shapes = false;
  Model m = load_model(model_path("unsorted"), lax);
  sort_topologically(m.graph);
  EXPECT_EQ(m.graph.nodes[0].name, "first");
  EXPECT_NO_THROW(validate_model(m, "sorted"));
}

TEST(Save, AtomicSaveLeavesOnlyTheTargetAndRoundtrips) {
  if (no_models()) GTEST_SKIP() << "venv python with onnx missing";
  const Model m = load_model(model_path("op17"));
  const auto dir = test::temp_dir("save_atomic");
  const fs::path target = dir / "model.onnx";
  save_model(m, target);
  save_model(m, target);  // overwriting an existing file goes through the same rename
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  EXPECT_EQ(names, (std::vector<std::string>{"model.onnx"}));
  const Model back = load_model(target);
  EXPECT_EQ(test::diff(m, back), "");
  EXPECT_EQ(file_bytes(target), serialize_model(m));
}

TEST(Save, UnwritableFolderIsAClearError) {
  Model m;
  m.opset_imports[""] = 17;
  expect_error([&] { save_model(m, "/nonexistent/folder/model.onnx"); },
               {"/nonexistent/folder/model.onnx", "cannot create temporary file"});
}

}  // namespace
}  // namespace onnxtrain
