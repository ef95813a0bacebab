#pragma once
// Plan-time rewrites of a graph's nodes for the CPU executor. They run on the plan's private copy of the node
// list, never on the model: errors, gradients and exports keep seeing the graph as written. The CPU backend
// registers fold_transposes_into_matmuls as its node rewrite (executor/plan_pass.h, executor/cpu/fusion_pass.cpp);
// it lives here, below the backends, because the CPU kernels that read its attributes (MatMul, Shape) and its
// tests name them. The elementwise fusion of compiled steps is the CPU's own (executor/cpu/fused_elementwise.h).
#include <string>
#include <vector>

#include "graph/ir.h"

namespace onnxtrain {

// The attributes through which a rewritten MatMul reads an operand through a permutation: operand = Transpose(
// input, perm). Only the CPU MatMul kernel understands them; a graph never carries them outside a plan.
inline constexpr const char* kMatMulPermA = "onnxtrain.perm_a";
inline constexpr const char* kMatMulPermB = "onnxtrain.perm_b";
// And writes its output as Transpose(output, perm) (perm keeps the last dim last).
inline constexpr const char* kMatMulPermY = "onnxtrain.perm_y";

// And a Shape node reports its input's shape permuted: Shape(Transpose(x, perm)) read as Shape(x), so that a
// Transpose whose only other readers are folded MatMuls can go (the gradient builder reads operand shapes).
inline constexpr const char* kShapePerm = "onnxtrain.perm";

// Folds Transposes into the MatMuls that read them, as strided GEMM operands: an operand Transpose(X, p) (or a
// chain of Transposes) whose permutation keeps one of X's elements contiguous along a matrix dim, that is
// p[r-1] == r-1 (row-major rows of stride ld) or p[r-2] == r-1 (a transposed matrix), becomes X read with
// kMatMulPermA/B. A Transpose that is a MatMul's only reader is written by the MatMul directly (kMatMulPermY;
// computing B^T·A^T instead when that keeps rows contiguous) when both operands' ranks are known to be >= 2
// (from `types`' value_info, may be null). Transposes left without readers are dropped; `keep` names values
// that must still be computed (the plan's outputs). Shape nodes read through Transposes (kShapePerm), and
// Transpose(SumToShape(g, Shape(x)), p) becomes SumToShape(Transpose(g, p), Shape(x) permuted by p) when g's rank
// is p's (from `types`), so a MatMul's gradient reaches the Transpose after its broadcast reduction (the reduction
// commutes with a permutation of both sides). Likewise a Cast between a Transpose and the MatMuls that read it, or
// between a MatMul and the Transpose that reads it (mixed precision's), swaps places with the Transpose. Returns the number of Transpose nodes removed. Graphs with subgraph
// attributes (If/Loop/Scan bodies, which may read outer values) are left alone.
size_t fold_transposes_into_matmuls(std::vector<Node>& nodes, const std::vector<std::string>& keep,
                                    const Graph* types = nullptr);

}  // namespace onnxtrain
