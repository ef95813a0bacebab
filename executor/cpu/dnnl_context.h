#pragma once
// The one oneDNN CPU engine of the process, and a stream per thread (oneDNN streams must not be shared by
// concurrent callers). Every oneDNN-backed kernel builds its primitives on this engine.
#include <oneapi/dnnl/dnnl.hpp>

namespace onnxtrain::cpu {

dnnl::engine& dnnl_engine();
dnnl::stream& dnnl_stream();

}  // namespace onnxtrain::cpu
