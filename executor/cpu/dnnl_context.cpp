#include "executor/cpu/dnnl_context.h"

namespace onnxtrain::cpu {

dnnl::engine& dnnl_engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

dnnl::stream& dnnl_stream() {
  static thread_local dnnl::stream s(dnnl_engine());
  return s;
}

}  // namespace onnxtrain::cpu
