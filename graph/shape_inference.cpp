#include "graph/shape_inference.h"

#include <optional>
#include <set>
#include <string>

#include <onnx/defs/schema.h>
#include <onnx/shape_inference/implementation.h>

#include "graph/error.h"
#include "graph/proto.h"

namespace onnxtrain {

namespace {

// Initializers up to this size go to ONNX with their data (shape arguments of Reshape, axes, pads...). Larger
// ones are weights: only their type matters, so they are declared as typed inputs instead of copied.
constexpr int64_t kMaxCopiedInitializer = 1024;

onnx::ModelProto inference_proto(const Model& m) {
  Model shell;
  shell.ir_version = m.ir_version;
  shell.opset_imports = m.opset_imports;
  shell.functions = m.functions;
  onnx::ModelProto p = to_proto(shell);

  Graph light;
  light.name = m.graph.name;
  light.nodes = m.graph.nodes;
  light.inputs = m.graph.inputs;
  light.outputs = m.graph.outputs;
  light.value_info = m.graph.value_info;
  for (const auto& [name, t] : m.graph.initializers) {
    if (t.numel() <= kMaxCopiedInitializer) {
      light.initializers.emplace(name, t);
      continue;
    }
    if (light.find_input(name)) continue;
    Shape s;
    for (int64_t d : t.dims) s.push_back(Dim::of(d));
    light.inputs.push_back(ValueInfo{name, TypeInfo{t.dtype, std::move(s)}});
  }
  graph_to_proto(light, p.mutable_graph());
  return p;
}

bool readable(const onnx::ValueInfoProto& v) {
  if (!v.has_type() || v.type().value_case() != onnx::TypeProto::kTensorType) return false;
  const int32_t et = v.type().tensor_type().elem_type();
  return et > 0 && et != static_cast<int32_t>(DType::String) && et <= static_cast<int32_t>(DType::BFloat16) &&
         et != 14 && et != 15;  // complex64/complex128 have no DType
}

TypeInfo read_type(const onnx::ValueInfoProto& v) {
  // Reuse the proto edge's conversion through a one-value graph rather than duplicating the dim rules.
  onnx::GraphProto g;
  *g.add_value_info() = v;
  Graph ir = graph_from_proto(g);
  return ir.value_info.begin()->second;
}

void read_back(const onnx::GraphProto& gp, Graph& g) {
  for (const auto& v : gp.value_info())
    if (readable(v)) g.value_info[v.name()] = read_type(v);
  for (const auto& v : gp.output())
    if (readable(v)) g.value_info[v.name()] = read_type(v);
  // The proto was built from these very nodes, so they correspond one to one; subgraphs get their types too.
  for (int i = 0; i < gp.node_size() && static_cast<size_t>(i) < g.nodes.size(); ++i) {
    for (const auto& a : gp.node(i).attribute()) {
      if (a.type() != onnx::AttributeProto::GRAPH) continue;
      auto it = g.nodes[i].attributes.find(a.name());
      if (it == g.nodes[i].attributes.end()) continue;
      if (auto* sub = std::get_if<std::shared_ptr<Graph>>(&it->second); sub && *sub) read_back(a.g(), **sub);
    }
  }
}

// Ops ONNX 1.16 leaves untyped: GroupNormalization has a function body but no inference function, so its
// output (X's type and shape) and everything downstream would stay unknown.
void infer_missing(Graph& g) {
  for (const Node& n : g.nodes) {
    if (!(n.domain.empty() || n.domain == "ai.onnx") || n.op_type != "GroupNormalization") continue;
    if (n.outputs.empty() || n.outputs[0].empty() || g.value_info.count(n.outputs[0]) || !n.has_input(0)) continue;
    if (const TypeInfo* t = g.type_of(n.inputs[0])) g.value_info[n.outputs[0]] = *t;
  }
}

// ONNX 1.16's convPoolShapeInference indexes its dilations/strides (sized from X's rank) by the kernel's rank
// (from kernel_shape or W) without comparing the two, so a Conv whose X has the wrong rank reads past a vector
// and crashes the process (found by fuzz_gradients). Refuse such a node first, naming it.
void check_conv_pool_ranks(const Graph& g) {
  static const std::set<std::string> kOps{"Conv", "ConvTranspose", "MaxPool", "AveragePool", "LpPool", "ConvInteger",
                                          "QLinearConv"};
  auto rank_of = [&](const std::string& v) -> std::optional<size_t> {
    const TypeInfo* t = v.empty() ? nullptr : g.type_of(v);
    if (!t || !t->shape) return std::nullopt;
    return t->shape->size();
  };
  for (const Node& n : g.nodes) {
    if (!(n.domain.empty() || n.domain == "ai.onnx") || !kOps.count(n.op_type) || !n.has_input(0)) continue;
    for (const char* a : {"strides", "dilations", "kernel_shape"})
      if (n.attributes.count(a))
        for (int64_t v : n.attr_ints(a))
          if (v <= 0)  // ONNX divides by strides: a zero is a floating-point exception, not an error
            fail(n.describe(), std::string("attribute '") + a + "' has " + std::to_string(v) + "; expected every value >= 1");
    const std::optional<size_t> x = rank_of(n.inputs[0]);
    if (!x) continue;
    if (*x < 3)
      fail(n.describe(), "input '" + n.inputs[0] + "' has rank " + std::to_string(*x) +
                             "; expected (N, C, spatial...) with at least one spatial dim");
    std::optional<size_t> kernel;
    if (n.attributes.count("kernel_shape")) kernel = n.attr_ints("kernel_shape").size();
    else if (n.op_type.find("Conv") != std::string::npos) {
      const size_t w = n.op_type == "QLinearConv" ? 3 : 1;
      if (n.has_input(w))
        if (const std::optional<size_t> r = rank_of(n.inputs[w]); r && *r >= 2) kernel = *r - 2;
    }
    if (kernel && *kernel != *x - 2)
      fail(n.describe(), "the kernel has " + std::to_string(*kernel) + " spatial dims but input '" + n.inputs[0] +
                             "' has " + std::to_string(*x - 2) + " (rank " + std::to_string(*x) + ")");
  }
}

}  // namespace

// ONNX 1.16's LayerNormalization inference (and others) index the input's dims by `axis` unchecked: an axis
// outside the widest range any op accepts ([-rank - 1, rank], OneHot's) reads out of bounds. Refuse it first.
static void check_axis_ranges(const Graph& g) {
  for (const Node& n : g.nodes) {
    auto it = n.attributes.find("axis");
    if (it == n.attributes.end() || !n.has_input(0)) continue;
    const int64_t* axis = std::get_if<int64_t>(&it->second);
    const TypeInfo* t = g.type_of(n.inputs[0]);
    if (!axis || !t || !t->shape) continue;
    const auto r = static_cast<int64_t>(t->shape->size());
    if (*axis < -r - 1 || *axis > r)
      fail(n.describe(), "attribute 'axis' is " + std::to_string(*axis) + " but input '" + n.inputs[0] + "' has rank " +
                             std::to_string(r));
  }
}

void infer_shapes(Model& m) {
  check_conv_pool_ranks(m.graph);
  check_axis_ranges(m.graph);
  std::string first_error;
  // Data propagation resolves Shape -> Gather -> Reshape chains; if it trips on a model, plain inference
  // still gives element types and most shapes.
  for (bool data_propagation : {true, false}) {
    onnx::ModelProto p = inference_proto(m);
    onnx::ShapeInferenceOptions opts{/*check_type=*/false, /*error_mode=*/0, data_propagation};
    try {
      onnx::shape_inference::InferShapes(p, onnx::OpSchemaRegistry::Instance(), opts);
    } catch (const std::exception& e) {
      if (first_error.empty()) first_error = e.what();
      continue;
    }
    read_back(p.graph(), m.graph);
    infer_missing(m.graph);
    return;
  }
  fail("ONNX shape inference", first_error);
}

}  // namespace onnxtrain
