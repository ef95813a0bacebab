#pragma once
// Plan-time rewrites of a graph's nodes for the CPU executor. They run on the plan's private copy of the node
// list, never on the model: errors, gradients and exports keep seeing the graph as written.
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

// Folds Transposes into the MatMuls that read them, as strided GEMM operands: an operand Transpose(X, p) (or a
// chain of Transposes) whose permutation keeps one of X's elements contiguous along a matrix dim, that is
// p[r-1] == r-1 (row-major rows of stride ld) or p[r-2] == r-1 (a transposed matrix), becomes X read with
// kMatMulPermA/B. A Transpose that is a MatMul's only reader is written by the MatMul directly (kMatMulPermY;
// computing B^T·A^T instead when that keeps rows contiguous) when both operands' ranks are known to be >= 2
// (from `types`' value_info, may be null). Transposes left without readers are dropped; `keep` names values
// that must still be computed (the plan's outputs). Returns the number of Transpose nodes removed. Graphs with
// subgraph attributes (If/Loop/Scan bodies, which may read outer values) are left alone.
size_t fold_transposes_into_matmuls(std::vector<Node>& nodes, const std::vector<std::string>& keep,
                                    const Graph* types = nullptr);

}  // namespace onnxtrain
