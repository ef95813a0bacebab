#pragma once
// The in-memory model: plain value types, names as edges (as in ONNX itself). Protobufs appear only at the
// load/save edge (model_io.h). A value is identified by its name; "" marks an absent optional input.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "graph/dtype.h"

namespace onnxtrain {

// A dimension is a known size (value >= 0), a named symbol ("batch"), or unknown (value < 0, no symbol).
struct Dim {
  int64_t value = -1;
  std::string symbol;
  static Dim of(int64_t v) { return Dim{v, {}}; }
  static Dim sym(std::string s) { return Dim{-1, std::move(s)}; }
  bool known() const { return value >= 0; }
  bool operator==(const Dim&) const = default;
  // True when both sides certainly denote the same size.
  bool same_as(const Dim& o) const { return known() ? value == o.value : (!symbol.empty() && symbol == o.symbol); }
};
using Shape = std::vector<Dim>;
std::string to_string(const Shape& s);

struct TypeInfo {
  DType dtype = DType::Undefined;
  std::optional<Shape> shape;  // nullopt: rank unknown
  bool operator==(const TypeInfo&) const = default;
};

struct ValueInfo {
  std::string name;
  TypeInfo type;
};

// Constant tensor data on the host: initializers and tensor attributes.
struct TensorData {
  DType dtype = DType::Float32;
  std::vector<int64_t> dims;
  std::vector<std::byte> bytes;

  int64_t numel() const;
  template <class T> std::span<const T> as() const {
    return {reinterpret_cast<const T*>(bytes.data()), bytes.size() / sizeof(T)};
  }
  template <class T> std::span<T> as_mut() { return {reinterpret_cast<T*>(bytes.data()), bytes.size() / sizeof(T)}; }
  template <class T> static TensorData from(std::vector<int64_t> dims, std::span<const T> values);
  template <class T> static TensorData scalar(T v) { return from<T>({}, std::span<const T>(&v, 1)); }
  // A scalar of dtype t holding v converted to t (for emitting constants that match another operand).
  static TensorData scalar_as(DType t, double v);
  bool operator==(const TensorData&) const = default;
};

struct Graph;
using Attribute = std::variant<int64_t, float, std::string, std::vector<int64_t>, std::vector<float>,
                               std::vector<std::string>, TensorData, std::shared_ptr<Graph>>;

// In a function body, an attribute that takes the value of the calling node's attribute `caller` (ONNX
// ref_attr_name); absent there, the attribute is left out. `onnx_type` is the AttributeProto type code
// (FLOAT 1, INT 2, STRING 3, FLOATS 6, INTS 7, STRINGS 8), which the file format requires.
struct AttributeRef {
  std::string caller;
  int32_t onnx_type = 0;
  bool operator==(const AttributeRef&) const = default;
};

struct Node {
  std::string name;
  std::string op_type;
  std::string domain;  // "" is the default ONNX domain ("ai.onnx")
  std::vector<std::string> inputs;
  std::vector<std::string> outputs;
  std::map<std::string, Attribute> attributes;
  std::map<std::string, AttributeRef> attribute_refs;  // function bodies only

  bool has_attr(const std::string& a) const { return attributes.count(a) != 0; }
  int64_t attr_int(const std::string& a, int64_t fallback) const;
  float attr_float(const std::string& a, float fallback) const;
  std::string attr_string(const std::string& a, const std::string& fallback) const;
  std::vector<int64_t> attr_ints(const std::string& a, std::vector<int64_t> fallback = {}) const;
  const TensorData* attr_tensor(const std::string& a) const;
  bool has_input(size_t i) const { return i < inputs.size() && !inputs[i].empty(); }
  // "node 'fc1/MatMul' (MatMul)" for error messages.
  std::string describe() const;
};

struct Graph {
  std::string name;
  std::vector<Node> nodes;  // kept in topological order by load and by every pass
  std::vector<ValueInfo> inputs;
  std::vector<ValueInfo> outputs;
  std::map<std::string, TensorData> initializers;
  std::map<std::string, TypeInfo> value_info;  // inferred types of intermediate values

  // The best type known for a value: graph input/output, initializer or inferred; nullptr if none.
  const TypeInfo* type_of(const std::string& value) const;
  bool is_initializer(const std::string& v) const { return initializers.count(v) != 0; }
  const ValueInfo* find_input(const std::string& v) const;
};

// A model-local function (FunctionProto).
struct Function {
  std::string name;
  std::string domain;
  std::vector<std::string> inputs;
  std::vector<std::string> outputs;
  std::vector<std::string> attributes;
  std::vector<Node> nodes;
  std::map<std::string, int64_t> opset_imports;
  std::string doc;
};

// TrainingInfoProto: how to initialize and step a model's training (ONNX IR, docs/checkpoint.md). Bindings are
// (initializer to overwrite, graph output holding its new value), in file order.
struct TrainingInfo {
  Graph initialization;
  std::vector<std::pair<std::string, std::string>> initialization_binding;
  Graph algorithm;
  std::vector<std::pair<std::string, std::string>> update_binding;
};

struct Model {
  int64_t ir_version = 8;
  std::map<std::string, int64_t> opset_imports;  // domain -> version; "" is ai.onnx
  std::string producer_name;
  std::string producer_version;
  std::string domain;
  int64_t model_version = 0;
  std::string doc;
  std::vector<std::pair<std::string, std::string>> metadata;
  Graph graph;
  std::vector<Function> functions;
  std::vector<TrainingInfo> training_info;

  // The opset version the model imports for a domain ("" and "ai.onnx" are the same); 0 if not imported.
  int64_t opset(const std::string& domain) const;
  const Function* find_function(const std::string& domain, const std::string& name) const;
};

}  // namespace onnxtrain
