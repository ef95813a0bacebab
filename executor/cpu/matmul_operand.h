#pragma once
// A MatMul operand as its kernels read it: dims and element strides, so that a Transpose folded into the MatMul
// (its perm in the attribute `transpose_a`/`transpose_b` that executor/plan_fusion.h writes) is read in place.
// Shared by the float32 MatMul (matmul.cpp) and the half-precision ones (half_matmul.cpp).
#include <cstdint>
#include <vector>

#include "executor/kernel.h"

namespace onnxtrain::cpu {

struct Operand {
  std::vector<int64_t> dims, strides;
};

// x as it is, or Transpose(x, perm) read in place when the node carries the perm attribute `attr`; fails naming
// `what` when perm is not a permutation of x's dims.
Operand operand(PrepareContext& ctx, const KernelInput& x, const char* attr, const char* what);

}  // namespace onnxtrain::cpu
