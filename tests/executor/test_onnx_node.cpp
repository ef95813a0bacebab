// Every ai.onnx op in the kernel registry against the ONNX backend node tests shipped with the onnx Python
// package. The op list comes from the registry, so registering a kernel without a verified case fails here:
// each registered op needs at least one case that runs and matches. Cases whose dtypes or attributes we do not
// support (no kernel, or the factory refuses) are skipped with their reason and listed in the output.
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

#include "common/test_env.h"
#include "executor/executor.h"
#include "graph/error.h"
#include "graph/model_io.h"
#include "graph/proto.h"

namespace onnxtrain {
namespace {

namespace fs = std::filesystem;

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// Thrown for cases outside what we support; anything else that goes wrong is a failure.
struct Skip {
  std::string reason;
};

Tensor load_tensor(const fs::path& p) {
  onnx::TensorProto t;
  if (!t.ParseFromString(read_file(p))) throw Skip{"cannot parse " + p.filename().string() + " as a TensorProto"};
  try {
    return Tensor::from_data(tensor_from_proto(t));
  } catch (const Error& e) {
    throw Skip{std::string("test data: ") + e.what()};
  }
}

// "" when equal within tolerance, else a description of the first mismatch.
// `atol` is 1e-5 except for the cases in rounded_expectations.
std::string compare(const Tensor& got, const Tensor& want, double atol = 1e-5) {
  if (got.dtype == DType::BFloat16 && want.dtype == DType::UInt16)
    throw Skip{"the expected bfloat16 values are stored as uint16 and were made by truncation; onnxtrain rounds to "
               "nearest even, as torch does (executor/half.h)"};
  if (got.dtype != want.dtype) return "dtype " + dtype_name(got.dtype) + ", expected " + dtype_name(want.dtype);
  if (got.shape != want.shape) return "shape " + shape_string(got.shape) + ", expected " + shape_string(want.shape);
  const int64_t n = want.numel();
  auto close = [atol](double g, double w) {
    if (std::isnan(w)) return std::isnan(g);
    if (std::isinf(w)) return g == w;
    return std::abs(g - w) <= atol + 1e-4 * std::abs(w);
  };
  auto mismatch = [&](int64_t i, double g, double w) {
    std::ostringstream s;
    s.precision(9);
    s << "element " << i << " is " << g << ", expected " << w;
    return s.str();
  };
  switch (want.dtype) {
    case DType::Float32:
      for (int64_t i = 0; i < n; ++i)
        if (!close(got.ptr<float>()[i], want.ptr<float>()[i]))
          return mismatch(i, got.ptr<float>()[i], want.ptr<float>()[i]);
      return "";
    case DType::Float64:
      for (int64_t i = 0; i < n; ++i)
        if (!close(got.ptr<double>()[i], want.ptr<double>()[i]))
          return mismatch(i, got.ptr<double>()[i], want.ptr<double>()[i]);
      return "";
    default: {
      // Integers and bools compare exactly, byte for byte (bool tensors hold 0/1).
      const size_t es = dtype_size(want.dtype);
      for (int64_t i = 0; i < n; ++i)
        if (std::memcmp(static_cast<const char*>(got.data) + i * es, static_cast<const char*>(want.data) + i * es, es))
          return "element " + std::to_string(i) + " differs (" + dtype_name(want.dtype) + ")";
      return "";
    }
  }
}

struct Outcome {
  int passed = 0;
  std::vector<std::string> skipped;  // "case: reason"
  std::vector<std::string> failed;
};

// How graph inputs are fed. The node tests feed axes, shapes and the like as graph inputs, but our plans need
// them at plan time (data-dependent shapes are not supported); a model would carry them as constants. So
// when a case needs that, it is rerun with those inputs baked in as initializers, one executor per data set.
enum class Feed { AllInputs, Int64AsConstants, AllAsConstants };

bool needs_constant(const std::string& reason) { return reason.find("must be known before the step runs") != std::string::npos; }

// Runs every data set of one case; returns "" on a match, else the failure. Throws Skip.
std::string run_sets(const Model& m, const std::vector<fs::path>& sets, Feed mode, const std::string& name) {
  std::unique_ptr<Executor> shared;
  for (const fs::path& set : sets) {
    const std::string where = name + "/" + set.filename().string();
    Graph g = m.graph;
    std::map<std::string, Tensor> feeds;
    size_t i = 0;
    std::vector<ValueInfo> kept;
    for (const ValueInfo& v : m.graph.inputs) {
      if (m.graph.is_initializer(v.name)) {
        kept.push_back(v);
        continue;
      }
      fs::path p = set / ("input_" + std::to_string(i++) + ".pb");
      if (!fs::exists(p)) throw Skip{"missing " + p.filename().string()};
      Tensor t = load_tensor(p);
      const bool bake = mode == Feed::AllAsConstants || (mode == Feed::Int64AsConstants && t.dtype == DType::Int64);
      if (bake) {
        g.initializers[v.name] = t.to_data();
      } else {
        kept.push_back(v);
        feeds[v.name] = std::move(t);
      }
    }
    g.inputs = kept;
    std::vector<Tensor> got;
    try {
      if (mode == Feed::AllInputs) {
        if (!shared) shared = std::make_unique<Executor>(g, m.opset_imports, std::make_shared<TensorStore>());
        got = shared->run(feeds);
      } else {
        Executor ex(g, m.opset_imports, std::make_shared<TensorStore>());
        got = ex.run(feeds);
      }
    } catch (const Error& e) {
      throw Skip{e.what()};  // plan compilation: no kernel for the dtype, or the factory refused
    }
    if (got.size() != m.graph.outputs.size())
      return where + ": " + std::to_string(got.size()) + " outputs, expected " + std::to_string(m.graph.outputs.size());
    for (size_t o = 0; o < got.size(); ++o) {
      Tensor want = load_tensor(set / ("output_" + std::to_string(o) + ".pb"));
      // Cases whose expected values onnx wrote by hand, rounded to 4 decimals (its reference implementation
      // and onnxruntime both differ from them by up to 5e-5): compared to that precision.
      static const std::set<std::string> rounded_expectations = {"test_gridsample_bicubic"};
      std::string diff = compare(got[o], want, rounded_expectations.count(name) ? 5e-5 : 1e-5);
      if (!diff.empty()) return where + " output " + std::to_string(o) + " ('" + m.graph.outputs[o].name + "'): " + diff;
    }
  }
  return "";
}

// Runs every test_data_set_* of one node-test directory.
void run_case(const fs::path& dir, Outcome& out) {
  const std::string name = dir.filename().string();
  try {
    Model m;
    try {
      m = load_model(dir / "model.onnx");
    } catch (const Error& e) {
      throw Skip{std::string("load: ") + e.what()};
    }
    for (const ValueInfo& v : m.graph.inputs)
      if (v.type.dtype == DType::Undefined) throw Skip{"input '" + v.name + "' is not a tensor"};
    for (const ValueInfo& v : m.graph.outputs)
      if (v.type.dtype == DType::Undefined) throw Skip{"output '" + v.name + "' is not a tensor"};

    std::vector<fs::path> sets;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.is_directory() && e.path().filename().string().rfind("test_data_set_", 0) == 0) sets.push_back(e.path());
    std::sort(sets.begin(), sets.end());
    if (sets.empty()) throw Skip{"no test_data_set_*"};

    std::string failure;
    for (Feed mode : {Feed::AllInputs, Feed::Int64AsConstants, Feed::AllAsConstants}) {
      try {
        failure = run_sets(m, sets, mode, name);
        break;
      } catch (const Skip& s) {
        if (mode == Feed::AllAsConstants || !needs_constant(s.reason)) throw;
      }
    }
    if (failure.empty())
      ++out.passed;
    else
      out.failed.push_back(failure);
  } catch (const Skip& s) {
    std::string r = s.reason.substr(0, 300);
    for (char& c : r)
      if (c == '\n') c = ' ';
    out.skipped.push_back(name + ": " + r);
  } catch (const std::exception& e) {
    out.failed.push_back(name + ": unexpected exception: " + e.what());
  }
}

// op_type -> node-test directories whose model is that single op (expanded variants hold several nodes and
// test other ops' compositions, so they are left out).
std::map<std::string, std::vector<fs::path>> node_tests_by_op(const fs::path& root) {
  std::map<std::string, std::vector<fs::path>> r;
  for (const auto& e : fs::directory_iterator(root)) {
    const fs::path model = e.path() / "model.onnx";
    if (!e.is_directory() || !fs::exists(model)) continue;
    onnx::ModelProto p;
    if (!p.ParseFromString(read_file(model))) continue;
    if (p.graph().node_size() != 1) continue;
    const onnx::NodeProto& n = p.graph().node(0);
    if (!n.domain().empty() && n.domain() != "ai.onnx") continue;
    r[n.op_type()].push_back(e.path());
  }
  for (auto& [op, dirs] : r) std::sort(dirs.begin(), dirs.end());
  return r;
}

TEST(OnnxNodeTests, EveryRegisteredOpPassesItsBackendTests) {
  const fs::path root = test::onnx_node_test_dir();
  if (root.empty() || !fs::exists(root)) GTEST_SKIP() << "the project venv has no onnx package (node test data)";
  const auto by_op = node_tests_by_op(root);
  ASSERT_FALSE(by_op.empty()) << "no node tests found under " << root;

  int total_pass = 0, total_skip = 0;
  std::vector<std::string> without_pass;
  for (const auto& [domain, op] : default_kernels().ops(Device::CPU)) {
    if (!domain.empty()) continue;
    Outcome o;
    auto it = by_op.find(op);
    if (it != by_op.end())
      for (const fs::path& dir : it->second) run_case(dir, o);
    std::cout << "[node tests] " << op << ": " << o.passed << " passed, " << o.skipped.size() << " skipped, "
              << o.failed.size() << " failed\n";
    for (const std::string& s : o.skipped) std::cout << "    skip " << s << "\n";
    for (const std::string& f : o.failed) ADD_FAILURE() << op << ": " << f;
    total_pass += o.passed;
    total_skip += static_cast<int>(o.skipped.size());
    // Ops for which the onnx package ships no node test at all are checked by their own kernel tests instead
    // (named here); an op listed here that gains node tests must pass them like any other.
    static const std::map<std::string, std::string> no_node_tests = {
        {"LpNormalization", "tests/executor/test_normalization_ops.cpp"},
        {"GlobalLpPool", "tests/executor/test_spatial.cpp"},
        {"MaxRoiPool", "tests/executor/test_spatial.cpp"}};
    if (it == by_op.end() && no_node_tests.count(op)) continue;
    if (o.passed == 0) without_pass.push_back(op + (it == by_op.end() ? " (no node tests found)" : ""));
  }
  std::cout << "[node tests] total: " << total_pass << " passed, " << total_skip << " skipped\n";
  for (const std::string& op : without_pass)
    ADD_FAILURE() << "registered op " << op << " has no ONNX node test case that runs and passes";
}

}  // namespace
}  // namespace onnxtrain
