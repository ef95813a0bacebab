#pragma once
// A MatMul operand as its kernels read it: dims and element strides, so that a Transpose folded into the MatMul
// (its perm in the attribute kMatMulPermA/kMatMulPermB that executor/plan_fusion.h writes) is read in place.
// Shared by the float32 MatMul (matmul.cpp) and the half-precision ones (half_matmul.cpp). The checks of the
// product itself are the op layer's (executor/ops/matmul.h), on the operands' logical shapes; the perms and the
// layouts they give are the CPU's alone.
#include <cstdint>
#include <optional>
#include <vector>

#include "executor/kernel.h"
#include "executor/ops/matmul.h"

namespace onnxtrain::cpu {

struct Operand {
  std::vector<int64_t> dims, strides;
};

// x as it is, or Transpose(x, perm) read in place when the node carries the perm attribute `attr`; fails naming
// `what` when perm is not a permutation of x's dims.
Operand operand(PrepareContext& ctx, const KernelInput& x, const char* attr, const char* what);

// A MatMul's operands as read (operand() above, before any 1-D operand is padded to a matrix) and the op layer's
// geometry of the logical product (ops::prepare_matmul on their dims), which also checked the node and set Y.
struct MatMulOperands {
  Operand a, b;
  ops::MatMulGeometry g;
};
MatMulOperands matmul_operands(PrepareContext& ctx);

// Y written as Transpose(Y, perm) when the node carries the output perm (kMatMulPermY): the permuted shape it is
// stored as, and the element strides of Y's logical dims in that buffer; nullopt without the perm. `y` is Y's
// logical shape (ops::prepare_matmul's output). Fails unless perm permutes Y's dims keeping the last one last,
// and Y keeps both matrix dims (no 1-D operand).
struct OutputLayout {
  std::vector<int64_t> shape, strides;
};
std::optional<OutputLayout> permuted_output(PrepareContext& ctx, const ops::MatMulGeometry& g,
                                            const std::vector<int64_t>& y);

}  // namespace onnxtrain::cpu
