#pragma once
#include "graph/ir.h"

namespace onnxtrain {

// Fills g.value_info with element types and shapes (symbolic where the model has symbols) through ONNX shape
// inference. Ops that ONNX does not know (our own domain) are skipped, not errors: the executor derives
// concrete shapes per plan anyway. ONNX's inference runs in a child process (graph/isolate.h), so a crash or
// hang inside it is an Error naming the node (or the timeout) rather than the end of this process;
// docs/reliability.md has the settings (ONNXTRAIN_ONNX_TIMEOUT, ONNXTRAIN_ISOLATE_ONNX).
void infer_shapes(Model& m);

}  // namespace onnxtrain
