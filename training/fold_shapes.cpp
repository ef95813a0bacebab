#include "training/fold_shapes.h"

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <variant>

#include "executor/executor.h"
#include "graph/error.h"
#include "graph/shape_inference.h"
#include "graph/validate.h"

namespace onnxtrain {

namespace {

bool has_subgraph(const Node& n) {
  return std::any_of(n.attributes.begin(), n.attributes.end(), [](const auto& a) {
    return std::holds_alternative<std::shared_ptr<Graph>>(a.second);
  });
}

// The node run alone by the CPU kernels on its known inputs; nullopt when it cannot be (no kernel, say): the
// value is then left to run time, as before.
std::optional<TensorData> evaluate(const Node& n, const TypeInfo& type, const std::map<std::string, TensorData>& known,
                                   const std::map<std::string, int64_t>& opsets) {
  Graph one;
  one.name = "fold";
  for (const std::string& i : n.inputs)
    if (!i.empty()) one.initializers[i] = known.at(i);
  one.nodes.push_back(n);
  one.outputs.push_back({n.outputs[0], type});
  try {
    Executor ex(std::move(one), opsets, std::make_shared<TensorStore>());
    return ex.run(std::map<std::string, Tensor>{}).at(0).to_data();
  } catch (const Error&) {
    return std::nullopt;
  }
}

constexpr int64_t kMaxFoldedFloats = 4096;

using PartialShape = std::vector<std::optional<int64_t>>;

PartialShape shape_dims(const Node& n, const Shape& s) {
  const auto r = static_cast<int64_t>(s.size());
  auto clamp = [&](int64_t v) { return std::clamp<int64_t>(v < 0 ? v + r : v, 0, r); };
  PartialShape dims;
  for (int64_t i = clamp(n.attr_int("start", 0)); i < clamp(n.attr_int("end", r)); ++i)
    dims.push_back(s[i].known() ? std::optional<int64_t>(s[i].value) : std::nullopt);
  return dims;
}

// Gather(Shape(x), indices) along axis 0, when every gathered dim is known.
std::optional<TensorData> gather_dims(const PartialShape& dims, const TensorData& indices) {
  if (indices.dtype != DType::Int64) return std::nullopt;
  std::vector<int64_t> out;
  const auto r = static_cast<int64_t>(dims.size());
  for (int64_t i : indices.as<int64_t>()) {
    if (i < 0) i += r;
    if (i < 0 || i >= r || !dims[i]) return std::nullopt;
    out.push_back(*dims[i]);
  }
  return TensorData::from<int64_t>(indices.dims, std::span<const int64_t>(out));
}

}  // namespace

size_t fold_static_shapes(Model& m) {
  Graph& g = m.graph;
  std::map<std::string, TensorData> known;
  for (const auto& [name, t] : g.initializers)
    if (!is_floating(t.dtype)) known[name] = t;
  for (const ValueInfo& in : g.inputs) known.erase(in.name);  // an input may override its initializer
  std::map<std::string, PartialShape> shapes;                  // Shape outputs with some dims unknown
  size_t folded = 0;
  for (Node& n : g.nodes) {
    if (!n.domain.empty() && n.domain != "ai.onnx") continue;
    if (n.op_type == "Constant") {
      if (const TensorData* v = n.attr_tensor("value"); v && n.outputs.size() == 1) known[n.outputs[0]] = *v;
      continue;
    }
    if (n.outputs.size() != 1 || n.outputs[0].empty() || has_subgraph(n) || is_random_op(n)) continue;
    const TypeInfo* type = g.type_of(n.outputs[0]);
    if (!type || type->dtype == DType::Undefined || type->dtype == DType::String) continue;

    std::optional<TensorData> value;
    if (n.op_type == "Shape") {
      const TypeInfo* in = g.type_of(n.inputs.at(0));
      if (!in || !in->shape) continue;
      PartialShape dims = shape_dims(n, *in->shape);
      if (std::any_of(dims.begin(), dims.end(), [](const auto& d) { return !d; })) {
        shapes[n.outputs[0]] = std::move(dims);
        continue;
      }
      std::vector<int64_t> v;
      for (const auto& d : dims) v.push_back(*d);
      value = TensorData::from<int64_t>({static_cast<int64_t>(v.size())}, std::span<const int64_t>(v));
    } else if (n.op_type == "Gather" && n.inputs.size() == 2 && shapes.count(n.inputs[0]) && known.count(n.inputs[1]) &&
               n.attr_int("axis", 0) == 0) {
      value = gather_dims(shapes.at(n.inputs[0]), known.at(n.inputs[1]));
    } else if (std::all_of(n.inputs.begin(), n.inputs.end(), [&](const std::string& i) { return i.empty() || known.count(i); })) {
      value = evaluate(n, *type, known, m.opset_imports);
    }
    // A floating-point value computed from constants alone lies on no gradient path (trained weights are never
    // known here); folding it lets Resize read scales that torch writes as Concat(Constant, Constant). Large ones
    // stay to run time, so folding never copies a weight-sized table into the graph.
    if (!value || (is_floating(value->dtype) && value->numel() > kMaxFoldedFloats)) continue;
    known[n.outputs[0]] = *value;
    Node c;
    c.name = n.name;
    c.op_type = "Constant";
    c.outputs = n.outputs;
    c.attributes["value"] = std::move(*value);
    n = std::move(c);
    ++folded;
  }
  if (folded) {
    // Shapes that depended on the folded values (a Pad's output, say) were unknown; infer them afresh, keeping
    // the earlier type of any value ONNX inference still leaves untyped.
    std::map<std::string, TypeInfo> before = std::move(g.value_info);
    g.value_info.clear();
    try {
      infer_shapes(m);
    } catch (const Error&) {
      // The model was inferred before; its earlier types, restored below, are no worse than they were.
    }
    for (auto& [name, t] : before) g.value_info.emplace(name, std::move(t));
  }
  return folded;
}

}  // namespace onnxtrain
