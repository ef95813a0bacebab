#include "graph/graph_test_util.h"

#include <cstdlib>
#include <unistd.h>

#include "common/test_env.h"

namespace onnxtrain::test {

std::filesystem::path generated_models() {
  static const std::filesystem::path dir = [] {
    // One folder per process: ctest runs each test in its own process, possibly in parallel.
    auto d = temp_dir("graph_models_" + std::to_string(getpid()));
    static const std::filesystem::path cleanup = d;
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(cleanup, ec);
    });
    const std::string cmd = test::python() + " " +
                            (source_dir() / "tests" / "graph" / "make_models.py").string() + " " + d.string() +
                            " > " + (d / "make_models.log").string() + " 2>&1";
    if (std::system(cmd.c_str()) != 0) return std::filesystem::path();
    return d;
  }();
  return dir;
}

namespace {

std::string diff_type(const TypeInfo& a, const TypeInfo& b) {
  if (a == b) return {};
  auto str = [](const TypeInfo& t) {
    return dtype_name(t.dtype) + (t.shape ? to_string(*t.shape) : std::string("[rank unknown]"));
  };
  return str(a) + " vs " + str(b);
}

std::string diff_node(const Node& a, const Node& b, const std::string& where) {
  if (a.name != b.name) return where + ": name '" + a.name + "' vs '" + b.name + "'";
  if (a.op_type != b.op_type) return where + ": op_type " + a.op_type + " vs " + b.op_type;
  if (a.domain != b.domain) return where + ": domain '" + a.domain + "' vs '" + b.domain + "'";
  if (a.inputs != b.inputs) return where + ": inputs differ";
  if (a.outputs != b.outputs) return where + ": outputs differ";
  if (a.attributes.size() != b.attributes.size()) return where + ": attribute count differs";
  for (const auto& [k, va] : a.attributes) {
    auto it = b.attributes.find(k);
    if (it == b.attributes.end()) return where + ": attribute '" + k + "' missing";
    const auto& vb = it->second;
    if (va.index() != vb.index()) return where + ": attribute '" + k + "' kind differs";
    if (const auto* ga = std::get_if<std::shared_ptr<Graph>>(&va)) {
      const auto& gb = std::get<std::shared_ptr<Graph>>(vb);
      if (!*ga || !gb) return where + ": attribute '" + k + "' has a null graph";
      if (auto d = diff(**ga, *gb, where + "/" + k); !d.empty()) return d;
    } else if (!(va == vb)) {
      return where + ": attribute '" + k + "' value differs";
    }
  }
  return {};
}

}  // namespace

std::string diff(const Graph& a, const Graph& b, const std::string& where) {
  if (a.name != b.name) return where + ": name '" + a.name + "' vs '" + b.name + "'";
  auto diff_vis = [&](const std::vector<ValueInfo>& x, const std::vector<ValueInfo>& y, const char* what) {
    if (x.size() != y.size()) return where + ": " + what + " count differs";
    for (size_t i = 0; i < x.size(); ++i) {
      if (x[i].name != y[i].name) return where + ": " + what + " name '" + x[i].name + "' vs '" + y[i].name + "'";
      if (auto d = diff_type(x[i].type, y[i].type); !d.empty()) return where + ": " + what + " '" + x[i].name + "' " + d;
    }
    return std::string();
  };
  if (auto d = diff_vis(a.inputs, b.inputs, "input"); !d.empty()) return d;
  if (auto d = diff_vis(a.outputs, b.outputs, "output"); !d.empty()) return d;
  if (a.initializers.size() != b.initializers.size()) return where + ": initializer count differs";
  for (const auto& [k, t] : a.initializers) {
    auto it = b.initializers.find(k);
    if (it == b.initializers.end()) return where + ": initializer '" + k + "' missing";
    if (!(t == it->second)) return where + ": initializer '" + k + "' differs";
  }
  if (a.value_info.size() != b.value_info.size()) return where + ": value_info count differs";
  for (const auto& [k, t] : a.value_info) {
    auto it = b.value_info.find(k);
    if (it == b.value_info.end()) return where + ": value_info '" + k + "' missing";
    if (auto d = diff_type(t, it->second); !d.empty()) return where + ": value_info '" + k + "' " + d;
  }
  if (a.nodes.size() != b.nodes.size()) return where + ": node count differs";
  for (size_t i = 0; i < a.nodes.size(); ++i)
    if (auto d = diff_node(a.nodes[i], b.nodes[i], where + " node #" + std::to_string(i)); !d.empty()) return d;
  return {};
}

std::string diff(const Model& a, const Model& b) {
  if (a.ir_version != b.ir_version) return "ir_version differs";
  if (a.opset_imports != b.opset_imports) return "opset_imports differ";
  if (a.producer_name != b.producer_name || a.producer_version != b.producer_version) return "producer differs";
  if (a.domain != b.domain || a.model_version != b.model_version || a.doc != b.doc) return "model fields differ";
  if (a.metadata != b.metadata) return "metadata differs";
  if (a.functions.size() != b.functions.size()) return "function count differs";
  for (size_t i = 0; i < a.functions.size(); ++i) {
    const auto& fa = a.functions[i];
    const auto& fb = b.functions[i];
    if (fa.name != fb.name || fa.domain != fb.domain || fa.inputs != fb.inputs || fa.outputs != fb.outputs ||
        fa.attributes != fb.attributes || fa.opset_imports != fb.opset_imports || fa.doc != fb.doc ||
        fa.nodes.size() != fb.nodes.size())
      return "function '" + fa.name + "' differs";
    for (size_t j = 0; j < fa.nodes.size(); ++j)
      if (auto d = diff_node(fa.nodes[j], fb.nodes[j], "function " + fa.name); !d.empty()) return d;
  }
  return diff(a.graph, b.graph);
}

}  // namespace onnxtrain::test
