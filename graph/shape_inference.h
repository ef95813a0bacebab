#pragma once
#include "graph/ir.h"

namespace onnxtrain {

// Fills g.value_info with element types and shapes (symbolic where the model has symbols) through ONNX shape
// inference. Ops that ONNX does not know (our own domain) are skipped, not errors: the executor derives
// concrete shapes per plan anyway.
void infer_shapes(Model& m);

}  // namespace onnxtrain
