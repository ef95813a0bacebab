#include "convert.h"

#include <cstdint>
#include <filesystem>
#include <optional>

#include "dlpack.h"
#include "graph/error.h"
#include "graph/model_io.h"

namespace onnxtrain::py_binding {

namespace {

std::string type_name(const py::handle& o) { return py::str(py::type::handle_of(o).attr("__name__")); }

bool viewable(const py::array& a) {
  const auto item = static_cast<uintptr_t>(a.itemsize());
  return (a.flags() & py::array::c_style) && a.dtype().attr("isnative").cast<bool>() &&
         (item == 0 || reinterpret_cast<uintptr_t>(a.data()) % item == 0);
}

DType dtype_from_dlpack(const dlpack::DataType& t) {
  if (t.lanes != 1) return DType::Undefined;
  switch (t.code) {
    case dlpack::kDLFloat:
      return t.bits == 32 ? DType::Float32 : t.bits == 64 ? DType::Float64 : t.bits == 16 ? DType::Float16 : DType::Undefined;
    case dlpack::kDLBfloat:
      return t.bits == 16 ? DType::BFloat16 : DType::Undefined;
    case dlpack::kDLInt:
      return t.bits == 64 ? DType::Int64 : t.bits == 32 ? DType::Int32 : t.bits == 16 ? DType::Int16
           : t.bits == 8 ? DType::Int8 : DType::Undefined;
    case dlpack::kDLUInt:
      return t.bits == 64 ? DType::UInt64 : t.bits == 32 ? DType::UInt32 : t.bits == 16 ? DType::UInt16
           : t.bits == 8 ? DType::UInt8 : DType::Undefined;
    case dlpack::kDLBool:
      return t.bits == 8 ? DType::Bool : DType::Undefined;
    default:
      return DType::Undefined;
  }
}

// A view over a DLPack producer's memory (a torch.Tensor, ...), or nullopt when the layout needs a copy (strided)
// or the memory is not on the host. The capsule is consumed: `keep` gets an owner that calls the producer's
// deleter once the view is dropped, so the producer's buffer stays alive as long as the view.
std::optional<Tensor> dlpack_view(const py::handle& value, DType expected, const std::string& what,
                                  std::vector<py::object>& keep) {
  py::object cap = value.attr("__dlpack__")();
  auto* m = static_cast<dlpack::ManagedTensor*>(PyCapsule_GetPointer(cap.ptr(), "dltensor"));
  if (!m) throw py::error_already_set();
  PyCapsule_SetName(cap.ptr(), "used_dltensor");  // the protocol: a consumed capsule must not be freed by its owner
  py::capsule owner(m, [](void* p) {
    auto* mt = static_cast<dlpack::ManagedTensor*>(p);
    if (mt->deleter) mt->deleter(mt);
  });
  const dlpack::DLTensor& t = m->dl_tensor;
  const DType got = dtype_from_dlpack(t.dtype);
  if (got == DType::Undefined)
    raise_type_error(what + ": DLPack dtype (code " + std::to_string(t.dtype.code) + ", " +
                     std::to_string(t.dtype.bits) + " bits, " + std::to_string(t.dtype.lanes) + " lanes) is not supported");
  if (expected != DType::Undefined && got != expected)
    raise_type_error(what + ": expected dtype " + dtype_name(expected) + ", got " + dtype_name(got));
  if (t.device.device_type != dlpack::kDLCPU && t.device.device_type != dlpack::kDLCUDAHost)
    raise_type_error(what + ": expected a CPU tensor, got one on DLPack device type " +
                     std::to_string(t.device.device_type));
  std::vector<int64_t> shape(t.shape, t.shape + t.ndim);
  if (t.strides) {
    int64_t expect = 1;
    for (int32_t d = t.ndim - 1; d >= 0; --d) {
      if (shape[d] != 1 && t.strides[d] != expect) return std::nullopt;  // owner's destructor releases it
      expect *= shape[d];
    }
  }
  void* data = static_cast<char*>(t.data) + t.byte_offset;
  if (reinterpret_cast<uintptr_t>(data) % dtype_size(got) != 0) return std::nullopt;
  keep.push_back(std::move(owner));
  return Tensor::view(got, std::move(shape), data);
}

}  // namespace

void raise_type_error(const std::string& message) { throw py::type_error(message); }

DType dtype_from_numpy(const py::dtype& dt) {
  const char kind = dt.kind();
  const auto size = dt.itemsize();
  switch (kind) {
    case 'f':
      return size == 4 ? DType::Float32 : size == 8 ? DType::Float64 : size == 2 ? DType::Float16 : DType::Undefined;
    case 'i':
      return size == 8 ? DType::Int64 : size == 4 ? DType::Int32 : size == 2 ? DType::Int16
           : size == 1 ? DType::Int8 : DType::Undefined;
    case 'u':
      return size == 8 ? DType::UInt64 : size == 4 ? DType::UInt32 : size == 2 ? DType::UInt16
           : size == 1 ? DType::UInt8 : DType::Undefined;
    case 'b':
      return DType::Bool;
    default:
      return DType::Undefined;
  }
}

py::dtype numpy_dtype(DType t) {
  if (t == DType::Undefined || t == DType::String || t == DType::BFloat16)
    fail("tensor", "dtype " + dtype_name(t) + " has no numpy equivalent");
  return py::dtype(dtype_name(t));
}

Tensor to_tensor(const py::handle& value, DType expected, const std::string& what, std::vector<py::object>& keep) {
  // numpy is imported only off the fast path: an import runs Python code, which can hand the GIL over
  // mid-call (tests/python/test_py_binding.py relies on a correct array running no Python code at all).
  auto np = [] { return py::module_::import("numpy"); };
  py::array arr;
  if (py::isinstance<py::array>(value)) {
    arr = py::reinterpret_borrow<py::array>(value);
    const DType got = dtype_from_numpy(arr.dtype());
    if (expected != DType::Undefined && got != expected)
      raise_type_error(what + ": expected dtype " + dtype_name(expected) + ", got " +
                       std::string(py::str(arr.dtype())) + " (convert with .astype(numpy." + dtype_name(expected) + "))");
    if (got == DType::Undefined)
      raise_type_error(what + ": numpy dtype " + std::string(py::str(arr.dtype())) + " is not supported");
    // The one copy we make: a layout the executor cannot read in place (strided, byte-swapped, misaligned).
    if (!viewable(arr)) arr = np().attr("ascontiguousarray")(arr, py::arg("dtype") = numpy_dtype(got));
  } else if (py::hasattr(value, "__dlpack__")) {
    // torch.Tensor and other DLPack producers: read in place when C-contiguous on the host.
    if (std::optional<Tensor> view = dlpack_view(value, expected, what, keep)) return *view;
    arr = np().attr("ascontiguousarray")(np().attr("from_dlpack")(value));  // the one copy: a strided layout
  } else {
    // Lists, scalars, objects with __array__: converted to the expected dtype when there is one.
    try {
      py::object dt = expected == DType::Undefined ? py::object(py::none()) : py::object(numpy_dtype(expected));
      arr = np().attr("ascontiguousarray")(value, py::arg("dtype") = dt);
    } catch (py::error_already_set& e) {
      raise_type_error(what + ": expected a numpy array, got " + type_name(value) + " (" + e.what() + ")");
    }
    if (dtype_from_numpy(arr.dtype()) == DType::Undefined)
      raise_type_error(what + ": expected a numeric array, got " + type_name(value) + " of dtype " +
                       std::string(py::str(arr.dtype())));
  }
  std::vector<int64_t> shape(arr.shape(), arr.shape() + arr.ndim());
  // The executor only reads feeds; the const_cast lets read-only arrays (np.broadcast_to, mmaps) in too.
  Tensor t = Tensor::view(dtype_from_numpy(arr.dtype()), std::move(shape), const_cast<void*>(arr.data()));
  keep.push_back(std::move(arr));
  return t;
}

Feeds to_feeds(const py::handle& feeds, const std::map<std::string, DType>& expected, const char* what) {
  if (!py::isinstance<py::dict>(feeds))
    raise_type_error(std::string(what) + ": expected a dict of input name -> array, got " + type_name(feeds));
  Feeds f;
  for (auto [k, v] : py::reinterpret_borrow<py::dict>(feeds)) {
    if (!py::isinstance<py::str>(k))
      raise_type_error(std::string(what) + ": input names must be str, got " + type_name(k));
    std::string name = k.cast<std::string>();
    auto it = expected.find(name);
    f.tensors[name] = to_tensor(v, it == expected.end() ? DType::Undefined : it->second, "input '" + name + "'", f.keep);
  }
  return f;
}

py::array to_numpy(Tensor t) {
  if (t.device != Device::CPU) t = Tensor::from_data(t.to_data());
  else if (!t.owner) t = t.clone();
  py::dtype dt = numpy_dtype(t.dtype);
  auto* held = new Tensor(std::move(t));
  py::capsule owner(held, [](void* p) { delete static_cast<Tensor*>(p); });
  return py::array(dt, held->shape, held->data, owner);
}

py::dict to_numpy(std::map<std::string, Tensor> tensors) {
  py::dict d;
  for (auto& [name, t] : tensors) d[py::str(name)] = to_numpy(std::move(t));
  return d;
}

py::list to_numpy(std::vector<Tensor> tensors) {
  py::list l;
  for (Tensor& t : tensors) l.append(to_numpy(std::move(t)));
  return l;
}

std::string fspath(const py::handle& path, const char* what) {
  try {
    py::object p = py::module_::import("os").attr("fspath")(path);
    return p.cast<std::string>();  // str or bytes
  } catch (py::error_already_set&) {
    raise_type_error(std::string(what) + ": expected a path (str or os.PathLike), got " + type_name(path));
  }
}

Model load_model_from(const py::handle& model, std::string& source) {
  std::string bytes;
  if (py::isinstance<py::bytes>(model) || py::isinstance<py::bytearray>(model)) {
    bytes = py::module_::import("builtins").attr("bytes")(model).cast<std::string>();
    source = "<bytes>";
  } else if (py::isinstance<py::str>(model) || py::hasattr(model, "__fspath__")) {
    source = fspath(model, "model");
    py::gil_scoped_release nogil;
    return load_model(source);
  } else if (py::hasattr(model, "SerializeToString")) {
    bytes = py::bytes(model.attr("SerializeToString")()).cast<std::string>();
    source = "<" + type_name(model) + ">";
  } else {
    raise_type_error("model: expected a path, bytes or onnx.ModelProto, got " + type_name(model));
  }
  py::gil_scoped_release nogil;
  return load_model_from_bytes(bytes, source);
}

std::vector<std::string> model_input_names(const Graph& g) {
  std::vector<std::string> names;
  for (const ValueInfo& v : g.inputs)
    if (!g.is_initializer(v.name)) names.push_back(v.name);
  return names;
}

std::map<std::string, DType> input_dtypes(const Graph& g) {
  std::map<std::string, DType> types;
  for (const ValueInfo& v : g.inputs)
    if (!g.is_initializer(v.name) && v.type.dtype != DType::Undefined) types[v.name] = v.type.dtype;
  return types;
}

void register_exceptions(py::module_& m) {
  py::register_exception<Error>(m, "OnnxtrainError", PyExc_ValueError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const std::filesystem::filesystem_error& e) {
      PyErr_SetString(PyExc_OSError, e.what());
    }
  });
}

}  // namespace onnxtrain::py_binding
