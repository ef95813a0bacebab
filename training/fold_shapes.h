#pragma once
// Folding of shape arithmetic before differentiation. Exporters (torch.onnx among them) compute slice bounds,
// pads and reshape targets at run time from Shape: `x.chunk(3, -1)` becomes Slice(x, Mul(Div(Add(Gather(Shape(x),
// 2), 2), 3), 1), ...). Gradient rules that need those arguments as constants (Slice, Pad, Tile, ...) then
// cannot differentiate the node, although with the input shapes the model declares the values never change.
#include <cstddef>

#include "graph/ir.h"

namespace onnxtrain {

// Replaces with a Constant node every node of m's main graph whose output is an integer or boolean tensor
// computed only from constants (Constant nodes, non-floating initializers) and from dims the value types
// know statically: Shape of a value whose shape is fully known, or Gather of known positions from Shape of a
// partly known one. Floating-point values are never folded (they may lie on a gradient path), nor random
// ops, nodes with subgraphs, or nodes of other domains. The values are computed by the CPU kernels. Needs
// the types infer_shapes fills in, and infers them again when it folds something. Returns how many nodes were
// folded.
size_t fold_static_shapes(Model& m);

}  // namespace onnxtrain
