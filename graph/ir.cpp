#include "graph/ir.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>

#include "graph/error.h"
#include "graph/float16.h"

namespace onnxtrain {

std::string to_string(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ", ";
    if (s[i].known())
      out += std::to_string(s[i].value);
    else if (!s[i].symbol.empty())
      out += s[i].symbol;
    else
      out += "?";
  }
  return out + "]";
}

namespace {

std::string dims_string(const std::vector<int64_t>& dims) {
  std::string out = "[";
  for (size_t i = 0; i < dims.size(); ++i) out += (i ? ", " : "") + std::to_string(dims[i]);
  return out + "]";
}

template <class I>
I checked_int(double v, DType t) {
  // The range test is done in double so that values just past the limits are caught, not wrapped.
  if (!std::isfinite(v) || v < static_cast<double>(std::numeric_limits<I>::min()) ||
      v > static_cast<double>(std::numeric_limits<I>::max()))
    throw Error("TensorData::scalar_as: " + std::to_string(v) + " does not fit in " + dtype_name(t));
  return static_cast<I>(v);
}

template <class T>
TensorData scalar_bits(DType t, T v) {
  TensorData d;
  d.dtype = t;
  d.bytes.resize(sizeof(T));
  std::memcpy(d.bytes.data(), &v, sizeof(T));
  return d;
}

const char* attr_kind(const Attribute& a) {
  static const char* const names[] = {"int",     "float",  "string", "ints", "floats",
                                      "strings", "tensor", "graph"};
  return names[a.index()];
}

template <class T>
const T* get_attr(const Node& n, const std::string& a, const char* wanted) {
  auto it = n.attributes.find(a);
  if (it == n.attributes.end()) return nullptr;
  if (const T* v = std::get_if<T>(&it->second)) return v;
  fail(n.describe(), "attribute '" + a + "' is " + attr_kind(it->second) + ", expected " + wanted);
}

bool same_domain(const std::string& a, const std::string& b) {
  auto norm = [](const std::string& d) -> const std::string& {
    static const std::string empty;
    return d == "ai.onnx" ? empty : d;
  };
  return norm(a) == norm(b);
}

}  // namespace

int64_t TensorData::numel() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

template <class T>
TensorData TensorData::from(std::vector<int64_t> dims, std::span<const T> values) {
  TensorData d;
  d.dtype = dtype_of<T>();
  d.dims = std::move(dims);
  if (d.numel() != static_cast<int64_t>(values.size()))
    throw Error("TensorData::from: shape " + dims_string(d.dims) + " holds " + std::to_string(d.numel()) +
                " elements but " + std::to_string(values.size()) + " values were given");
  d.bytes.resize(values.size() * sizeof(T));
  if (!values.empty()) std::memcpy(d.bytes.data(), values.data(), d.bytes.size());
  return d;
}

template TensorData TensorData::from<float>(std::vector<int64_t>, std::span<const float>);
template TensorData TensorData::from<double>(std::vector<int64_t>, std::span<const double>);
template TensorData TensorData::from<int64_t>(std::vector<int64_t>, std::span<const int64_t>);
template TensorData TensorData::from<int32_t>(std::vector<int64_t>, std::span<const int32_t>);
template TensorData TensorData::from<bool>(std::vector<int64_t>, std::span<const bool>);
template TensorData TensorData::from<uint8_t>(std::vector<int64_t>, std::span<const uint8_t>);
template TensorData TensorData::from<int8_t>(std::vector<int64_t>, std::span<const int8_t>);

TensorData TensorData::scalar_as(DType t, double v) {
  switch (t) {
    case DType::Float32: return scalar_bits(t, static_cast<float>(v));
    case DType::Float64: return scalar_bits(t, v);
    case DType::Float16: return scalar_bits(t, FloatToHalf{}(static_cast<float>(v)));
    case DType::BFloat16: return scalar_bits(t, FloatToBFloat16{}(static_cast<float>(v)));
    case DType::Int64: return scalar_bits(t, checked_int<int64_t>(v, t));
    case DType::Int32: return scalar_bits(t, checked_int<int32_t>(v, t));
    case DType::Int16: return scalar_bits(t, checked_int<int16_t>(v, t));
    case DType::Int8: return scalar_bits(t, checked_int<int8_t>(v, t));
    case DType::UInt64: return scalar_bits(t, checked_int<uint64_t>(v, t));
    case DType::UInt32: return scalar_bits(t, checked_int<uint32_t>(v, t));
    case DType::UInt16: return scalar_bits(t, checked_int<uint16_t>(v, t));
    case DType::UInt8: return scalar_bits(t, checked_int<uint8_t>(v, t));
    case DType::Bool: return scalar_bits(t, static_cast<uint8_t>(v != 0.0 ? 1 : 0));
    case DType::String:
    case DType::Undefined: break;
  }
  throw Error("TensorData::scalar_as: cannot make a numeric scalar of type " + dtype_name(t));
}

int64_t Node::attr_int(const std::string& a, int64_t fallback) const {
  const int64_t* v = get_attr<int64_t>(*this, a, "int");
  return v ? *v : fallback;
}

float Node::attr_float(const std::string& a, float fallback) const {
  const float* v = get_attr<float>(*this, a, "float");
  return v ? *v : fallback;
}

std::string Node::attr_string(const std::string& a, const std::string& fallback) const {
  const std::string* v = get_attr<std::string>(*this, a, "string");
  return v ? *v : fallback;
}

std::vector<int64_t> Node::attr_ints(const std::string& a, std::vector<int64_t> fallback) const {
  const auto* v = get_attr<std::vector<int64_t>>(*this, a, "ints");
  return v ? *v : fallback;
}

const TensorData* Node::attr_tensor(const std::string& a) const { return get_attr<TensorData>(*this, a, "tensor"); }

std::string Node::describe() const {
  std::string op = (domain.empty() || domain == "ai.onnx") ? op_type : domain + "." + op_type;
  if (!name.empty()) return "node '" + name + "' (" + op + ")";
  for (const auto& o : outputs)
    if (!o.empty()) return "node '" + o + "' (" + op + ")";
  return "unnamed node (" + op + ")";
}

const TypeInfo* Graph::type_of(const std::string& value) const {
  // A value may be declared in several places, some without element type or shape (subgraph inputs,
  // outputs declared before inference): the most informative declaration wins, earlier sources first.
  const TypeInfo* best = nullptr;
  auto rank = [](const TypeInfo* t) { return t ? (t->dtype != DType::Undefined) + (t->shape.has_value()) : -1; };
  auto consider = [&](const TypeInfo& t) {
    if (rank(&t) > rank(best)) best = &t;
  };
  for (const auto& v : inputs)
    if (v.name == value) consider(v.type);
  for (const auto& v : outputs)
    if (v.name == value) consider(v.type);
  if (auto it = initializers.find(value); it != initializers.end()) {
    // Initializers hold data, not a TypeInfo, so their types are interned: entries are immutable and never
    // erased, which keeps the returned pointer valid and correct for as long as the caller holds it.
    static std::mutex mu;
    static std::map<std::pair<DType, std::vector<int64_t>>, TypeInfo> interned;
    std::lock_guard<std::mutex> lock(mu);
    auto [pos, fresh] = interned.try_emplace({it->second.dtype, it->second.dims});
    if (fresh) {
      Shape s;
      for (int64_t d : it->second.dims) s.push_back(Dim::of(d));
      pos->second = TypeInfo{it->second.dtype, std::move(s)};
    }
    consider(pos->second);
  }
  if (auto it = value_info.find(value); it != value_info.end()) consider(it->second);
  return best;
}

const ValueInfo* Graph::find_input(const std::string& v) const {
  for (const auto& i : inputs)
    if (i.name == v) return &i;
  return nullptr;
}

int64_t Model::opset(const std::string& d) const {
  for (const auto& [dom, ver] : opset_imports)
    if (same_domain(dom, d)) return ver;
  return 0;
}

const Function* Model::find_function(const std::string& d, const std::string& name) const {
  for (const auto& f : functions)
    if (f.name == name && same_domain(f.domain, d)) return &f;
  return nullptr;
}

}  // namespace onnxtrain
