// onnxtrain._onnxtrain: the native module. The public API is the onnxtrain package (python/onnxtrain), which
// re-exports these classes and adds the conveniences that are easier in Python (docs/python.md).
#include "convert.h"

namespace onnxtrain::py_binding {
void bind_specs(py::module_& m);
void bind_sessions(py::module_& m);
void bind_communicator(py::module_& m);
}  // namespace onnxtrain::py_binding

PYBIND11_MODULE(_onnxtrain, m) {
  namespace pb = onnxtrain::py_binding;
  m.doc() = "onnxtrain native module: training sessions over ONNX models.";
  m.attr("__version__") = ONNXTRAIN_VERSION;
  pb::register_exceptions(m);
  pb::bind_specs(m);
  pb::bind_communicator(m);
  pb::bind_sessions(m);
}
