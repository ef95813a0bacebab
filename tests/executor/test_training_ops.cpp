// The ai.onnx.preview.training kernels (Momentum, Adam, Adagrad) against the ONNX backend node tests that
// exercise them, plus float64 and error cases the node tests do not cover. The node-test loader here is a
// small standalone one: these cases feed everything as graph inputs and need none of test_onnx_node.cpp's
// constant baking.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <sstream>

#include "common/test_env.h"
#include "executor/executor.h"
#include "graph/error.h"
#include "graph/model_io.h"
#include "graph/proto.h"

namespace onnxtrain {
namespace {

namespace fs = std::filesystem;

const char* const kDomain = "ai.onnx.preview.training";

Tensor load_pb(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  onnx::TensorProto t;
  if (!t.ParseFromString(s.str())) throw std::runtime_error("cannot parse " + p.string());
  return Tensor::from_data(tensor_from_proto(t));
}

double at(const Tensor& t, int64_t i) {
  return t.dtype == DType::Float64 ? t.ptr<double>()[i] : static_cast<double>(t.ptr<float>()[i]);
}

// "" when got matches want within rtol 1e-5 (plus a tiny atol for values near zero).
std::string compare(const Tensor& got, const Tensor& want) {
  if (got.dtype != want.dtype) return "dtype " + dtype_name(got.dtype) + ", expected " + dtype_name(want.dtype);
  if (got.shape != want.shape) return "shape " + shape_string(got.shape) + ", expected " + shape_string(want.shape);
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double g = at(got, i), w = at(want, i);
    if (!(std::abs(g - w) <= 1e-7 + 1e-5 * std::abs(w))) {
      std::ostringstream s;
      s.precision(10);
      s << "element " << i << " is " << g << ", expected " << w;
      return s.str();
    }
  }
  return "";
}

// Runs one node-test directory's data sets through m; returns "" on a match, else what went wrong.
std::string run_node_test(const fs::path& dir, const Model& m) {
  int sets = 0;
  for (int s = 0; fs::exists(dir / ("test_data_set_" + std::to_string(s))); ++s, ++sets) {
    const fs::path set = dir / ("test_data_set_" + std::to_string(s));
    std::map<std::string, Tensor> feeds;
    for (size_t i = 0; i < m.graph.inputs.size(); ++i)
      feeds[m.graph.inputs[i].name] = load_pb(set / ("input_" + std::to_string(i) + ".pb"));
    Executor ex(m.graph, m.opset_imports, std::make_shared<TensorStore>());
    const std::vector<Tensor> got = ex.run(feeds);
    if (got.size() != m.graph.outputs.size()) return "wrong number of outputs";
    for (size_t o = 0; o < got.size(); ++o) {
      const std::string d = compare(got[o], load_pb(set / ("output_" + std::to_string(o) + ".pb")));
      if (!d.empty()) return set.filename().string() + " output " + std::to_string(o) + " ('" + m.graph.outputs[o].name + "'): " + d;
    }
  }
  if (sets == 0) return "no test_data_set_*";
  return "";
}

TEST(TrainingOps, PassOnnxBackendNodeTests) {
  const fs::path root = test::onnx_node_test_dir();
  if (root.empty() || !fs::exists(root)) GTEST_SKIP() << "the project venv has no onnx package (node test data)";
  // Listed rather than globbed so a case that disappears (or fails to load) is a failure, not a silent skip.
  const std::vector<std::string> cases = {"test_momentum",         "test_momentum_multiple", "test_nesterov_momentum",
                                          "test_adam",             "test_adam_multiple",     "test_adagrad",
                                          "test_adagrad_multiple"};
  // Every matching folder the onnx package ships must be in the list above.
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string n = e.path().filename().string();
    const bool ours = n.find("momentum") != std::string::npos || n.rfind("test_adam", 0) == 0 ||
                      n.rfind("test_adagrad", 0) == 0;
    if (ours && n.find("expanded") == std::string::npos) {
      EXPECT_NE(std::find(cases.begin(), cases.end(), n), cases.end()) << "unlisted node test " << n;
    }
  }
  for (const std::string& c : cases) {
    SCOPED_TRACE(c);
    ASSERT_TRUE(fs::exists(root / c / "model.onnx")) << root / c;
    std::string r;
    try {
      Model m = load_model(root / c / "model.onnx");
      r = run_node_test(root / c, m);
      // Upstream data bug: onnx's generator (backend/test/case/node/adam.py) computes test_adam_multiple's
      // outputs with epsilon = 1e-2 but never sets the attribute on the node, so by the spec the node runs
      // with the default 1e-6 and X_new cannot match. onnx excludes this case from its own reference
      // evaluator's run (onnx/test/test_backend_reference.py: exclude("test_adam_multiple")  # 1e-2).
      // We check the kernel against the data with the epsilon the data was made with; should onnx fix
      // the data, the first run passes and this branch is not taken.
      Node& n = m.graph.nodes.at(0);
      if (!r.empty() && c == "test_adam_multiple" && !n.has_attr("epsilon")) {
        std::cout << "[training ops] " << c << " does not match as shipped (" << r
                  << "); rerunning with epsilon=1e-2, the value its generator used\n";
        n.attributes["epsilon"] = Attribute(1e-2f);
        r = run_node_test(root / c, m);
      }
    } catch (const std::exception& e) {
      r = std::string("exception: ") + e.what();
    }
    EXPECT_EQ(r, "") << c;
  }
}

TypeInfo type(DType t, const std::vector<int64_t>& dims) {
  Shape s;
  for (int64_t d : dims) s.push_back(Dim::of(d));
  return TypeInfo{t, s};
}

// A single-node graph: R, T, then per-kind groups of n tensors of shape {3}, all fed.
struct OneNode {
  Graph g;
  std::map<std::string, int64_t> opsets{{"", 17}, {kDomain, 1}};
  OneNode(const std::string& op, size_t kinds, size_t n, DType dt, std::map<std::string, Attribute> attrs) {
    Node node;
    node.name = "opt";
    node.op_type = op;
    node.domain = kDomain;
    node.attributes = std::move(attrs);
    auto input = [&](const std::string& name, DType t, std::vector<int64_t> shape) {
      g.inputs.push_back(ValueInfo{name, type(t, shape)});
      node.inputs.push_back(name);
    };
    input("R", DType::Float64, {});
    input("T", DType::Int64, {});
    for (size_t k = 0; k < kinds; ++k)
      for (size_t i = 0; i < n; ++i) input("in" + std::to_string(k) + "_" + std::to_string(i), dt, {3});
    for (size_t k = 0; k + 1 < kinds; ++k)
      for (size_t i = 0; i < n; ++i) {
        const std::string o = "out" + std::to_string(k) + "_" + std::to_string(i);
        node.outputs.push_back(o);
        g.outputs.push_back(ValueInfo{o, type(dt, {3})});
      }
    g.nodes.push_back(node);
  }
};

std::map<std::string, Tensor> scalar_feeds(double r, int64_t t) {
  return {{"R", Tensor::from_vector<double>({}, {r})}, {"T", Tensor::from_vector<int64_t>({}, {t})}};
}

// Float64 with hand-derived expectations (the node tests are float32 only): Nesterov after the first step,
// where beta applies, and with a norm coefficient.
TEST(TrainingOps, NesterovMomentumFloat64) {
  OneNode m("Momentum", 3, 1, DType::Float64,
            {{"alpha", Attribute(0.5f)}, {"beta", Attribute(0.25f)}, {"mode", Attribute(std::string("nesterov"))},
             {"norm_coefficient", Attribute(0.125f)}});
  Executor ex(m.g, m.opsets, std::make_shared<TensorStore>());
  auto feeds = scalar_feeds(0.1, 3);
  feeds["in0_0"] = Tensor::from_vector<double>({3}, {1.0, -2.0, 4.0});   // X
  feeds["in1_0"] = Tensor::from_vector<double>({3}, {0.5, 0.25, -1.0});  // G
  feeds["in2_0"] = Tensor::from_vector<double>({3}, {2.0, 0.0, 1.0});    // V
  const auto out = ex.run(feeds);
  // gr = 0.125 x + g = {0.625, 0, -0.5}; v' = 0.5 v + 0.25 gr; x' = x - 0.1 (gr + 0.5 v')
  const double gr[3] = {0.625, 0.0, -0.5}, v[3] = {2.0, 0.0, 1.0}, x[3] = {1.0, -2.0, 4.0};
  for (int i = 0; i < 3; ++i) {
    const double vn = 0.5 * v[i] + 0.25 * gr[i];
    EXPECT_DOUBLE_EQ(out[1].ptr<double>()[i], vn);
    EXPECT_DOUBLE_EQ(out[0].ptr<double>()[i], x[i] - 0.1 * (gr[i] + 0.5 * vn));
  }
}

TEST(TrainingOps, AdamFloat64BiasCorrectionAndPostNorm) {
  OneNode m("Adam", 4, 2, DType::Float64,
            {{"alpha", Attribute(0.5f)}, {"beta", Attribute(0.75f)}, {"epsilon", Attribute(0.0625f)},
             {"norm_coefficient_post", Attribute(0.25f)}});
  Executor ex(m.g, m.opsets, std::make_shared<TensorStore>());
  auto feeds = scalar_feeds(0.5, 2);
  for (int i = 0; i < 2; ++i) {
    const std::string s = "_" + std::to_string(i);
    feeds["in0" + s] = Tensor::from_vector<double>({3}, {1.0 + i, 2.0, 3.0});
    feeds["in1" + s] = Tensor::from_vector<double>({3}, {1.0, -1.0, 2.0 * i});
    feeds["in2" + s] = Tensor::from_vector<double>({3}, {0.0, 1.0, 1.0});
    feeds["in3" + s] = Tensor::from_vector<double>({3}, {1.0, 0.0, 4.0});
  }
  const auto out = ex.run(feeds);
  ASSERT_EQ(out.size(), 6u);
  const double ra = 0.5 * std::sqrt(1 - 0.75 * 0.75) / (1 - 0.5 * 0.5);
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j) {
      const double x = j == 0 ? 1.0 + i : 2.0 + j - 1, g = j == 0 ? 1.0 : j == 1 ? -1.0 : 2.0 * i;
      const double v = j == 0 ? 0.0 : 1.0, h = j == 0 ? 1.0 : j == 1 ? 0.0 : 4.0;
      const double vn = 0.5 * v + 0.5 * g, hn = 0.75 * h + 0.25 * g * g;
      EXPECT_DOUBLE_EQ(out[2 + i].ptr<double>()[j], vn) << i << "," << j;
      EXPECT_DOUBLE_EQ(out[4 + i].ptr<double>()[j], hn) << i << "," << j;
      EXPECT_NEAR(out[i].ptr<double>()[j], 0.75 * (x - ra * vn / (std::sqrt(hn) + 0.0625)), 1e-15) << i << "," << j;
    }
}

TEST(TrainingOps, AdagradFloat64Decay) {
  OneNode m("Adagrad", 3, 1, DType::Float64, {{"decay_factor", Attribute(0.5f)}, {"epsilon", Attribute(0.0f)}});
  Executor ex(m.g, m.opsets, std::make_shared<TensorStore>());
  auto feeds = scalar_feeds(0.3, 4);
  feeds["in0_0"] = Tensor::from_vector<double>({3}, {1.0, 2.0, 3.0});
  feeds["in1_0"] = Tensor::from_vector<double>({3}, {3.0, -4.0, 1.0});
  feeds["in2_0"] = Tensor::from_vector<double>({3}, {16.0, 9.0, 3.0});
  const auto out = ex.run(feeds);
  const double r = 0.3 / (1 + 4 * 0.5);  // 0.1
  // h' = {25, 25, 4}, sqrt = {5, 5, 2}
  EXPECT_DOUBLE_EQ(out[1].ptr<double>()[0], 25.0);
  EXPECT_DOUBLE_EQ(out[1].ptr<double>()[2], 4.0);
  EXPECT_NEAR(out[0].ptr<double>()[0], 1.0 - r * 3.0 / 5.0, 1e-15);
  EXPECT_NEAR(out[0].ptr<double>()[1], 2.0 + r * 4.0 / 5.0, 1e-15);
  EXPECT_NEAR(out[0].ptr<double>()[2], 3.0 - r * 1.0 / 2.0, 1e-15);
}

std::string plan_error(const OneNode& m, std::map<std::string, Tensor> feeds) {
  try {
    Executor ex(m.g, m.opsets, std::make_shared<TensorStore>());
    ex.run(feeds);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(TrainingOps, RejectsBadModeAndMissingAttributes) {
  auto feeds = scalar_feeds(0.1, 0);
  for (const char* v : {"in0_0", "in1_0", "in2_0"}) feeds[v] = Tensor::from_vector<float>({3}, {1, 2, 3});
  OneNode bad_mode("Momentum", 3, 1, DType::Float32,
                   {{"alpha", Attribute(0.5f)}, {"beta", Attribute(0.5f)}, {"mode", Attribute(std::string("heavy"))},
                    {"norm_coefficient", Attribute(0.0f)}});
  std::string e = plan_error(bad_mode, feeds);
  EXPECT_NE(e.find("'mode'"), std::string::npos) << e;
  EXPECT_NE(e.find("nesterov"), std::string::npos) << e;
  EXPECT_NE(e.find("opt"), std::string::npos) << e;  // names the node

  OneNode no_alpha("Momentum", 3, 1, DType::Float32,
                   {{"beta", Attribute(0.5f)}, {"mode", Attribute(std::string("standard"))},
                    {"norm_coefficient", Attribute(0.0f)}});
  e = plan_error(no_alpha, feeds);
  EXPECT_NE(e.find("'alpha'"), std::string::npos) << e;
}

TEST(TrainingOps, RejectsMismatchedGroups) {
  auto feeds = scalar_feeds(0.1, 0);
  for (const char* v : {"in0_0", "in1_0", "in2_0"}) feeds[v] = Tensor::from_vector<float>({3}, {1, 2, 3});
  OneNode m("Adagrad", 3, 1, DType::Float32, {});
  // One extra output: outputs must be n X_new then n H_new.
  m.g.nodes[0].outputs.push_back("extra");
  m.g.outputs.push_back(ValueInfo{"extra", type(DType::Float32, {3})});
  const std::string e = plan_error(m, feeds);
  EXPECT_NE(e.find("expected 2 outputs"), std::string::npos) << e;
}

}  // namespace
}  // namespace onnxtrain
