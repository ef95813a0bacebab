#pragma once
// Helpers shared by the rule files (internal to gradients/rules).
#include <optional>
#include <vector>

#include "gradients/rule.h"

namespace onnxtrain::rules {

// The value of a tensor the graph defines as a constant (an initializer or a Constant node), else nullptr.
const TensorData* constant_tensor(const Graph& g, const std::string& value);
// The values of an int64 tensor the graph defines as a constant (an initializer or a Constant node);
// nullopt when the value is computed at run time.
std::optional<std::vector<int64_t>> constant_int64s(const Graph& g, const std::string& value);

// An axes list given as attribute `attr` before `input_since` and as input `input` from then on; nullopt
// when it is an input whose value is not a constant. `present` tells whether axes were given at all.
std::optional<std::vector<int64_t>> axes_arg(RuleContext& c, const std::string& attr, size_t input,
                                             int64_t input_since, bool& present);

// The emitted nodes must be valid at the model's opset, and Squeeze, Unsqueeze and ReduceSum moved their
// axes from an attribute to an input at opset 13: these helpers emit the form the opset expects (Expr
// itself always emits the opset 13+ form).
//
// x with the dims at `axes` (positions in the result) re-inserted as size 1: undoes a keepdims=0 reduction.
Expr unsqueeze(const Expr& x, const std::vector<int64_t>& axes, int64_t opset);
// Same, with axes held by a run-time int64 value (only exists from opset 13).
Expr unsqueeze(const Expr& x, const Expr& axes, std::optional<size_t> result_rank);
Expr squeeze(const Expr& x, const std::vector<int64_t>& axes, int64_t opset);
Expr reduce_sum(const Expr& x, const std::vector<int64_t>& axes, bool keepdims, int64_t opset);

}  // namespace onnxtrain::rules

namespace onnxtrain::rules {

// The type of input i without recording a read of its value (for rules that need only its static shape).
TypeInfo input_type(RuleContext& c, size_t i);
// The input's dims when all are known statically.
std::optional<std::vector<int64_t>> static_dims(const TypeInfo& t);
// dY reshaped to input i's shape: a constant target when known, else the input's run-time shape.
Expr reshape_to_input(RuleContext& c, const Expr& dy, size_t i);

// The gradient g of node n's input x, computed in the broadcast (output) shape, summed back to x's shape.
// ONNX broadcasts only dims of size 1 (or missing): those are summed with ReduceSum when the shapes tell
// statically which they are, and by onnxtrain.SumToShape(g, Shape(x)) at run time when symbolic dims (or an
// unknown rank) leave it open.
Expr sum_to_shape(Expr g, const Expr& x, const Node& n, int64_t opset);

// A fused gradient op (domain onnxtrain) whose output i is the gradient of input i: the outputs of inputs
// without a wanted gradient are left unnamed (""), so no kernel computes them. All outputs stay listed, since
// onnx's function shape inference expects one per function output.
std::vector<Expr> fused_grads(RuleContext& c, const std::string& op, const std::vector<Expr>& inputs,
                              std::vector<TypeInfo> types, std::map<std::string, Attribute> attrs);

}  // namespace onnxtrain::rules
