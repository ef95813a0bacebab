#pragma once
// The Python edge: numpy arrays <-> Tensor, models from paths/bytes/ModelProto, and the Python exception types.
#include <map>
#include <string>
#include <vector>

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "executor/tensor.h"
#include "graph/ir.h"

namespace onnxtrain::py_binding {

namespace py = pybind11;

// Feeds as Tensor views over numpy buffers. `keep` holds the arrays the views point into (C-contiguous copies
// where the caller's layout did not allow a view); destroy it only while holding the GIL.
struct Feeds {
  std::map<std::string, Tensor> tensors;
  std::vector<py::object> keep;
};

// `expected` maps feed names to their dtype: an ndarray of another dtype is a TypeError naming the input, and
// other objects (lists, scalars) are converted to that dtype. Names not in `expected` pass through unchecked
// (the session reports unknown inputs).
Feeds to_feeds(const py::handle& feeds, const std::map<std::string, DType>& expected, const char* what);
// One array as a Tensor view; `what` names it in errors ("input 'x'", "weight 'fc1.weight'").
Tensor to_tensor(const py::handle& value, DType expected, const std::string& what, std::vector<py::object>& keep);

// An owning tensor becomes a numpy array that owns it (no copy); a view is copied first.
py::array to_numpy(Tensor t);
py::dict to_numpy(std::map<std::string, Tensor> tensors);
py::list to_numpy(std::vector<Tensor> tensors);

// A model from a path (str or os.PathLike), bytes, or anything with SerializeToString() (onnx.ModelProto).
// Loads with the GIL released. Sets `source` to what errors should name.
Model load_model_from(const py::handle& model, std::string& source);
std::string fspath(const py::handle& path, const char* what);

DType dtype_from_numpy(const py::dtype& dt);  // Undefined when onnxtrain has no such dtype
py::dtype numpy_dtype(DType t);

// Models inputs/outputs that sessions expose: non-initializer graph inputs with their dtypes.
std::vector<std::string> model_input_names(const Graph& g);
std::map<std::string, DType> input_dtypes(const Graph& g);

// Raised for onnxtrain::Error (bad user input): a subclass of ValueError so `except ValueError` catches it.
void register_exceptions(py::module_& m);
[[noreturn]] void raise_type_error(const std::string& message);

}  // namespace onnxtrain::py_binding
