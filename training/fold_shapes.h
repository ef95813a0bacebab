#pragma once
// Folding of shape arithmetic before differentiation. Exporters (torch.onnx among them) compute slice bounds,
// pads and reshape targets at run time from Shape: `x.chunk(3, -1)` becomes Slice(x, Mul(Div(Add(Gather(Shape(x),
// 2), 2), 3), 1), ...). Gradient rules that need those arguments as constants (Slice, Pad, Tile, ...) then
// cannot differentiate the node, although with the input shapes the model declares the values never change.
#include <cstddef>

#include "graph/ir.h"

namespace onnxtrain {

// Replaces with a Constant node every node of m's main graph whose output is computed only from constants
// (Constant nodes, non-floating initializers) and from dims the value types know statically: Shape of a value
// whose shape is fully known, or Gather of known positions from Shape of a partly known one. Floating-point
// initializers are never read as constants (they may be trained), so a folded floating-point value (Resize
// scales that torch writes as Concat(Constant, Constant)) lies on no gradient path; those over 4096 elements
// stay to run time. Random ops, nodes with subgraphs and nodes of other domains are never folded. The values
// are computed by the CPU kernels. Needs
// the types infer_shapes fills in, and infers them again when it folds something. Returns how many nodes were
// folded.
size_t fold_static_shapes(Model& m);

}  // namespace onnxtrain
