#include "graph/proto.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <type_traits>

#include "graph/error.h"

namespace onnxtrain {

namespace {

namespace fs = std::filesystem;

std::string dims_string(const std::vector<int64_t>& dims) {
  std::string out = "[";
  for (size_t i = 0; i < dims.size(); ++i) out += (i ? ", " : "") + std::to_string(dims[i]);
  return out + "]";
}

// "" and "ai.onnx" name the same domain; the IR always uses "".
std::string norm_domain(const std::string& d) { return d == "ai.onnx" ? std::string() : d; }

bool is_supported_dtype(int32_t t) {
  switch (static_cast<DType>(t)) {
    case DType::Float32: case DType::UInt8: case DType::Int8: case DType::UInt16: case DType::Int16:
    case DType::Int32: case DType::Int64: case DType::Bool: case DType::Float16: case DType::Float64:
    case DType::UInt32: case DType::UInt64: case DType::BFloat16:
      return true;
    default:
      return false;
  }
}

std::string proto_dtype_name(int32_t t) {
  if (onnx::TensorProto_DataType_IsValid(t))
    return onnx::TensorProto_DataType_Name(static_cast<onnx::TensorProto_DataType>(t));
  return "data type " + std::to_string(t);
}

// Copies a typed repeated field into the tensor's bytes, converting each element to the tensor's C type.
template <class Dst, class Field>
void copy_typed(const Field& field, TensorData& d, const std::string& where, const char* field_name) {
  const int64_t n = d.numel();
  if (static_cast<int64_t>(field.size()) != n)
    fail(where, std::string(field_name) + " holds " + std::to_string(field.size()) + " values but shape " +
                    dims_string(d.dims) + " needs " + std::to_string(n));
  d.bytes.resize(static_cast<size_t>(n) * sizeof(Dst));
  auto* out = reinterpret_cast<Dst*>(d.bytes.data());
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<Dst>(field.Get(static_cast<int>(i)));
}

void read_external(const onnx::TensorProto& t, const std::string& base_dir, TensorData& d, const std::string& where,
                   size_t want) {
  std::string location;
  int64_t offset = 0;
  int64_t length = -1;
  for (const auto& e : t.external_data()) {
    try {
      if (e.key() == "location")
        location = e.value();
      else if (e.key() == "offset")
        offset = std::stoll(e.value());
      else if (e.key() == "length")
        length = std::stoll(e.value());
    } catch (const std::exception&) {
      fail(where, "external data entry '" + e.key() + "' has value '" + e.value() + "', expected an integer");
    }
  }
  if (location.empty()) fail(where, "data is stored externally but no 'location' entry is given");
  if (base_dir.empty())
    fail(where, "data is stored externally in '" + location +
                    "', which can only be read when the model is loaded from a file (no base folder is known)");
  const fs::path rel(location);
  // External data must stay beside the model: an absolute or escaping path could read any file.
  if (rel.is_absolute()) fail(where, "external data location '" + location + "' must be relative to the model");
  for (const auto& part : rel)
    if (part == "..") fail(where, "external data location '" + location + "' must not leave the model's folder");
  if (offset < 0) fail(where, "external data offset " + std::to_string(offset) + " is negative");
  const fs::path path = fs::path(base_dir) / rel;
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (ec) fail(where, "external data file '" + path.string() + "' cannot be read: " + ec.message());
  if (length < 0) length = static_cast<int64_t>(want);
  if (static_cast<size_t>(length) != want)
    fail(where, "external data length " + std::to_string(length) + " does not match shape " + dims_string(d.dims) +
                    " of " + dtype_name(d.dtype) + " (" + std::to_string(want) + " bytes)");
  if (static_cast<uintmax_t>(offset) + static_cast<uintmax_t>(length) > size)
    fail(where, "external data file '" + path.string() + "' holds " + std::to_string(size) + " bytes; offset " +
                    std::to_string(offset) + " + length " + std::to_string(length) + " runs past its end");
  std::ifstream in(path, std::ios::binary);
  d.bytes.resize(want);
  if (!in.seekg(offset) || !in.read(reinterpret_cast<char*>(d.bytes.data()), static_cast<std::streamsize>(want)))
    fail(where, "reading external data file '" + path.string() + "' failed");
}

TypeInfo type_from_proto(const onnx::TypeProto& tp) {
  TypeInfo t;
  const auto& tt = tp.tensor_type();
  t.dtype = static_cast<DType>(tt.elem_type());
  if (tt.has_shape()) {
    Shape s;
    for (const auto& d : tt.shape().dim()) {
      if (d.has_dim_value())
        s.push_back(Dim::of(d.dim_value()));
      else if (d.has_dim_param() && !d.dim_param().empty())
        s.push_back(Dim::sym(d.dim_param()));
      else
        s.push_back(Dim{});
    }
    t.shape = std::move(s);
  }
  return t;
}

// Graph inputs and outputs must be tensors of a type we model; the reason is given rather than guessed at later.
ValueInfo io_from_proto(const onnx::ValueInfoProto& v, const char* what) {
  ValueInfo out{v.name(), {}};
  if (!v.has_type()) return out;
  const auto& tp = v.type();
  if (tp.value_case() != onnx::TypeProto::kTensorType)
    fail(std::string(what) + " '" + v.name() + "'", "only tensor types are supported (found a non-tensor type)");
  const int32_t et = tp.tensor_type().elem_type();
  if (et != 0 && et != static_cast<int32_t>(DType::String) && !is_supported_dtype(et))
    fail(std::string(what) + " '" + v.name() + "'", "element type " + proto_dtype_name(et) + " is not supported");
  out.type = type_from_proto(tp);
  return out;
}

Node node_from_proto(const onnx::NodeProto& n, const std::string& base_dir);

Attribute attr_from_proto(const onnx::AttributeProto& a, const Node& owner, const std::string& base_dir) {
  const std::string where = owner.describe() + ", attribute '" + a.name() + "'";
  if (!a.ref_attr_name().empty())
    fail(where, "refers to function attribute '" + a.ref_attr_name() + "'; attribute references are not supported");
  auto type = a.type();
  if (type == onnx::AttributeProto::UNDEFINED) {
    // Very old exporters left the type unset; the populated field tells it.
    if (a.has_f()) type = onnx::AttributeProto::FLOAT;
    else if (a.has_i()) type = onnx::AttributeProto::INT;
    else if (a.has_s()) type = onnx::AttributeProto::STRING;
    else if (a.has_t()) type = onnx::AttributeProto::TENSOR;
    else if (a.has_g()) type = onnx::AttributeProto::GRAPH;
    else if (a.floats_size()) type = onnx::AttributeProto::FLOATS;
    else if (a.ints_size()) type = onnx::AttributeProto::INTS;
    else if (a.strings_size()) type = onnx::AttributeProto::STRINGS;
    else fail(where, "has no type and no value");
  }
  switch (type) {
    case onnx::AttributeProto::FLOAT: return a.f();
    case onnx::AttributeProto::INT: return a.i();
    case onnx::AttributeProto::STRING: return a.s();
    case onnx::AttributeProto::FLOATS: return std::vector<float>(a.floats().begin(), a.floats().end());
    case onnx::AttributeProto::INTS: return std::vector<int64_t>(a.ints().begin(), a.ints().end());
    case onnx::AttributeProto::STRINGS: return std::vector<std::string>(a.strings().begin(), a.strings().end());
    case onnx::AttributeProto::TENSOR:
      try {
        return tensor_from_proto(a.t(), base_dir);
      } catch (const Error& e) {
        fail(where, e.what());
      }
    case onnx::AttributeProto::GRAPH:
      try {
        return std::make_shared<Graph>(graph_from_proto(a.g(), base_dir));
      } catch (const Error& e) {
        fail(where, e.what());
      }
    default:
      fail(where, "attribute kind " + onnx::AttributeProto_AttributeType_Name(type) +
                      " is not supported (supported: int, float, string, ints, floats, strings, tensor, graph)");
  }
}

Node node_from_proto(const onnx::NodeProto& n, const std::string& base_dir) {
  Node out;
  out.name = n.name();
  out.op_type = n.op_type();
  out.domain = norm_domain(n.domain());
  out.inputs.assign(n.input().begin(), n.input().end());
  out.outputs.assign(n.output().begin(), n.output().end());
  for (const auto& a : n.attribute()) {
    if (out.attributes.count(a.name()) || out.attribute_refs.count(a.name()))
      fail(out.describe(), "attribute '" + a.name() + "' is given twice");
    if (!a.ref_attr_name().empty()) out.attribute_refs[a.name()] = {a.ref_attr_name(), static_cast<int32_t>(a.type())};
    else out.attributes.emplace(a.name(), attr_from_proto(a, out, base_dir));
  }
  return out;
}

void node_to_proto(const Node& n, onnx::NodeProto* out);

void attr_to_proto(const std::string& name, const Attribute& a, onnx::AttributeProto* out) {
  out->set_name(name);
  std::visit(
      [&](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, int64_t>) {
          out->set_type(onnx::AttributeProto::INT);
          out->set_i(v);
        } else if constexpr (std::is_same_v<T, float>) {
          out->set_type(onnx::AttributeProto::FLOAT);
          out->set_f(v);
        } else if constexpr (std::is_same_v<T, std::string>) {
          out->set_type(onnx::AttributeProto::STRING);
          out->set_s(v);
        } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
          out->set_type(onnx::AttributeProto::INTS);
          for (auto x : v) out->add_ints(x);
        } else if constexpr (std::is_same_v<T, std::vector<float>>) {
          out->set_type(onnx::AttributeProto::FLOATS);
          for (auto x : v) out->add_floats(x);
        } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
          out->set_type(onnx::AttributeProto::STRINGS);
          for (const auto& x : v) out->add_strings(x);
        } else if constexpr (std::is_same_v<T, TensorData>) {
          out->set_type(onnx::AttributeProto::TENSOR);
          tensor_to_proto({}, v, out->mutable_t());
        } else {
          static_assert(std::is_same_v<T, std::shared_ptr<Graph>>);
          out->set_type(onnx::AttributeProto::GRAPH);
          if (!v) throw Error("attribute '" + name + "' holds a null graph");
          graph_to_proto(*v, out->mutable_g());
        }
      },
      a);
}

void node_to_proto(const Node& n, onnx::NodeProto* out) {
  out->set_name(n.name);
  out->set_op_type(n.op_type);
  out->set_domain(n.domain);
  for (const auto& i : n.inputs) out->add_input(i);
  for (const auto& o : n.outputs) out->add_output(o);
  for (const auto& [k, v] : n.attributes) {
    try {
      attr_to_proto(k, v, out->add_attribute());
    } catch (const Error& e) {
      fail(n.describe(), e.what());
    }
  }
  for (const auto& [k, ref] : n.attribute_refs) {
    onnx::AttributeProto* a = out->add_attribute();
    a->set_name(k);
    a->set_ref_attr_name(ref.caller);
    a->set_type(static_cast<onnx::AttributeProto::AttributeType>(ref.onnx_type));
  }
}

void value_info_to_proto(const std::string& name, const TypeInfo& t, onnx::ValueInfoProto* out) {
  out->set_name(name);
  if (t.dtype != DType::Undefined || t.shape) type_to_proto(t, out->mutable_type());
}

Function function_from_proto(const onnx::FunctionProto& f, const std::string& base_dir) {
  Function out;
  out.name = f.name();
  out.domain = norm_domain(f.domain());
  out.inputs.assign(f.input().begin(), f.input().end());
  out.outputs.assign(f.output().begin(), f.output().end());
  out.attributes.assign(f.attribute().begin(), f.attribute().end());
  // Attributes with defaults (IR 9) keep their names; the IR has no place for the default values.
  for (const auto& a : f.attribute_proto()) out.attributes.push_back(a.name());
  try {
    for (const auto& n : f.node()) out.nodes.push_back(node_from_proto(n, base_dir));
  } catch (const Error& e) {
    fail("function '" + f.domain() + "." + f.name() + "'", e.what());
  }
  for (const auto& o : f.opset_import()) out.opset_imports[norm_domain(o.domain())] = o.version();
  out.doc = f.doc_string();
  return out;
}

}  // namespace

void function_to_proto(const Function& f, onnx::FunctionProto* out) {
  out->set_name(f.name);
  out->set_domain(f.domain);
  for (const auto& i : f.inputs) out->add_input(i);
  for (const auto& o : f.outputs) out->add_output(o);
  for (const auto& a : f.attributes) out->add_attribute(a);
  for (const auto& n : f.nodes) node_to_proto(n, out->add_node());
  for (const auto& [d, v] : f.opset_imports) {
    auto* o = out->add_opset_import();
    o->set_domain(d);
    o->set_version(v);
  }
  if (!f.doc.empty()) out->set_doc_string(f.doc);
}

TensorData tensor_from_proto(const onnx::TensorProto& t, const std::string& base_dir) {
  const std::string where = t.name().empty() ? std::string("tensor") : "tensor '" + t.name() + "'";
  if (!is_supported_dtype(t.data_type()))
    fail(where, proto_dtype_name(t.data_type()) + " tensors are not supported");
  if (t.has_segment()) fail(where, "segmented tensors are not supported");
  TensorData d;
  d.dtype = static_cast<DType>(t.data_type());
  for (int64_t x : t.dims()) {
    if (x < 0) fail(where, "dimension " + std::to_string(x) + " is negative");
    d.dims.push_back(x);
  }
  // Dimensions come from the file: their product must not wrap around to a size the data happens to match.
  int64_t bytes = static_cast<int64_t>(dtype_size(d.dtype));
  for (int64_t x : d.dims)
    if (__builtin_mul_overflow(bytes, x, &bytes))
      fail(where, "shape " + dims_string(d.dims) + " of " + dtype_name(d.dtype) + " is too large to hold in memory");
  const size_t want = static_cast<size_t>(bytes);
  if (t.data_location() == onnx::TensorProto::EXTERNAL) {
    read_external(t, base_dir, d, where, want);
    return d;
  }
  if (t.has_raw_data()) {
    if (t.raw_data().size() != want)
      fail(where, "raw_data holds " + std::to_string(t.raw_data().size()) + " bytes but shape " + dims_string(d.dims) +
                      " of " + dtype_name(d.dtype) + " needs " + std::to_string(want));
    d.bytes.resize(want);
    if (want) std::memcpy(d.bytes.data(), t.raw_data().data(), want);
    return d;
  }
  switch (d.dtype) {
    case DType::Float32: copy_typed<float>(t.float_data(), d, where, "float_data"); break;
    case DType::Float64: copy_typed<double>(t.double_data(), d, where, "double_data"); break;
    case DType::Int64: copy_typed<int64_t>(t.int64_data(), d, where, "int64_data"); break;
    case DType::UInt64: copy_typed<uint64_t>(t.uint64_data(), d, where, "uint64_data"); break;
    case DType::UInt32: copy_typed<uint32_t>(t.uint64_data(), d, where, "uint64_data"); break;
    case DType::Int32: copy_typed<int32_t>(t.int32_data(), d, where, "int32_data"); break;
    case DType::Int16: copy_typed<int16_t>(t.int32_data(), d, where, "int32_data"); break;
    case DType::Int8: copy_typed<int8_t>(t.int32_data(), d, where, "int32_data"); break;
    case DType::UInt16:
    case DType::Float16:
    case DType::BFloat16: copy_typed<uint16_t>(t.int32_data(), d, where, "int32_data"); break;
    case DType::UInt8: copy_typed<uint8_t>(t.int32_data(), d, where, "int32_data"); break;
    case DType::Bool: {
      copy_typed<uint8_t>(t.int32_data(), d, where, "int32_data");
      for (auto& b : d.bytes) b = std::byte(b != std::byte(0) ? 1 : 0);
      break;
    }
    default: fail(where, dtype_name(d.dtype) + " tensors are not supported");
  }
  return d;
}

void tensor_to_proto(const std::string& name, const TensorData& t, onnx::TensorProto* out) {
  if (!is_supported_dtype(static_cast<int32_t>(t.dtype)))
    fail(name.empty() ? "tensor" : "tensor '" + name + "'", dtype_name(t.dtype) + " tensors cannot be saved");
  const size_t want = static_cast<size_t>(t.numel()) * dtype_size(t.dtype);
  if (t.bytes.size() != want)
    fail(name.empty() ? "tensor" : "tensor '" + name + "'",
         "holds " + std::to_string(t.bytes.size()) + " bytes but shape " + dims_string(t.dims) + " of " +
             dtype_name(t.dtype) + " needs " + std::to_string(want));
  if (!name.empty()) out->set_name(name);
  out->set_data_type(static_cast<int32_t>(t.dtype));
  for (int64_t d : t.dims) out->add_dims(d);
  out->set_raw_data(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size());
}

void type_to_proto(const TypeInfo& t, onnx::TypeProto* out) {
  auto* tt = out->mutable_tensor_type();
  tt->set_elem_type(static_cast<int32_t>(t.dtype));
  if (!t.shape) return;
  auto* s = tt->mutable_shape();
  for (const auto& d : *t.shape) {
    auto* pd = s->add_dim();
    if (d.known())
      pd->set_dim_value(d.value);
    else if (!d.symbol.empty())
      pd->set_dim_param(d.symbol);
  }
}

Graph graph_from_proto(const onnx::GraphProto& g, const std::string& base_dir) {
  Graph out;
  out.name = g.name();
  const std::string where = g.name().empty() ? std::string("graph") : "graph '" + g.name() + "'";
  if (g.sparse_initializer_size())
    fail(where, "sparse initializer '" + g.sparse_initializer(0).values().name() +
                    "' is not supported (convert it to a dense initializer)");
  for (const auto& v : g.input()) out.inputs.push_back(io_from_proto(v, "graph input"));
  for (const auto& v : g.output()) out.outputs.push_back(io_from_proto(v, "graph output"));
  for (const auto& t : g.initializer()) {
    if (t.name().empty()) fail(where, "an initializer has no name");
    if (out.initializers.count(t.name())) fail(where, "initializer '" + t.name() + "' is given twice");
    out.initializers.emplace(t.name(), tensor_from_proto(t, base_dir));
  }
  for (const auto& v : g.value_info()) {
    // value_info is advisory: entries we cannot represent (sequences, maps, exotic dtypes) are dropped.
    if (!v.has_type() || v.type().value_case() != onnx::TypeProto::kTensorType) continue;
    if (!is_supported_dtype(v.type().tensor_type().elem_type()) && v.type().tensor_type().elem_type() != 0) continue;
    out.value_info[v.name()] = type_from_proto(v.type());
  }
  out.nodes.reserve(g.node_size());
  for (const auto& n : g.node()) out.nodes.push_back(node_from_proto(n, base_dir));
  return out;
}

void graph_to_proto(const Graph& g, onnx::GraphProto* out) {
  out->set_name(g.name);
  for (const auto& n : g.nodes) node_to_proto(n, out->add_node());
  for (const auto& v : g.inputs) value_info_to_proto(v.name, v.type, out->add_input());
  for (const auto& v : g.outputs) value_info_to_proto(v.name, v.type, out->add_output());
  for (const auto& [name, t] : g.initializers) tensor_to_proto(name, t, out->add_initializer());
  for (const auto& [name, t] : g.value_info)
    if (t.dtype != DType::Undefined || t.shape) value_info_to_proto(name, t, out->add_value_info());
}

Model from_proto(const onnx::ModelProto& p, const std::string& base_dir) {
  Model m;
  m.ir_version = p.ir_version();
  for (const auto& o : p.opset_import()) m.opset_imports[norm_domain(o.domain())] = o.version();
  m.producer_name = p.producer_name();
  m.producer_version = p.producer_version();
  m.domain = p.domain();
  m.model_version = p.model_version();
  m.doc = p.doc_string();
  for (const auto& kv : p.metadata_props()) m.metadata.emplace_back(kv.key(), kv.value());
  m.graph = graph_from_proto(p.graph(), base_dir);
  for (const auto& f : p.functions()) m.functions.push_back(function_from_proto(f, base_dir));
  for (int i = 0; i < p.training_info_size(); ++i) {
    const auto& ti = p.training_info(i);
    TrainingInfo t;
    try {
      t.initialization = graph_from_proto(ti.initialization(), base_dir);
      t.algorithm = graph_from_proto(ti.algorithm(), base_dir);
    } catch (const Error& e) {
      fail("training_info[" + std::to_string(i) + "]", e.what());
    }
    for (const auto& kv : ti.initialization_binding()) t.initialization_binding.emplace_back(kv.key(), kv.value());
    for (const auto& kv : ti.update_binding()) t.update_binding.emplace_back(kv.key(), kv.value());
    m.training_info.push_back(std::move(t));
  }
  return m;
}

onnx::ModelProto to_proto(const Model& m) {
  onnx::ModelProto p;
  p.set_ir_version(m.ir_version);
  for (const auto& [d, v] : m.opset_imports) {
    auto* o = p.add_opset_import();
    o->set_domain(d);
    o->set_version(v);
  }
  if (!m.producer_name.empty()) p.set_producer_name(m.producer_name);
  if (!m.producer_version.empty()) p.set_producer_version(m.producer_version);
  if (!m.domain.empty()) p.set_domain(m.domain);
  if (m.model_version) p.set_model_version(m.model_version);
  if (!m.doc.empty()) p.set_doc_string(m.doc);
  for (const auto& [k, v] : m.metadata) {
    auto* e = p.add_metadata_props();
    e->set_key(k);
    e->set_value(v);
  }
  graph_to_proto(m.graph, p.mutable_graph());
  for (const auto& f : m.functions) function_to_proto(f, p.add_functions());
  for (const TrainingInfo& t : m.training_info) {
    auto* ti = p.add_training_info();
    graph_to_proto(t.initialization, ti->mutable_initialization());
    graph_to_proto(t.algorithm, ti->mutable_algorithm());
    for (const auto& [k, v] : t.initialization_binding) {
      auto* e = ti->add_initialization_binding();
      e->set_key(k);
      e->set_value(v);
    }
    for (const auto& [k, v] : t.update_binding) {
      auto* e = ti->add_update_binding();
      e->set_key(k);
      e->set_value(v);
    }
  }
  return p;
}

}  // namespace onnxtrain
