#pragma once
// The plan-time part of MatMul and Gemm, shared by the CPU kernels (executor/cpu/matmul.cpp, and the float16/
// bfloat16 ones of executor/cpu/half_matmul.cpp) and their CUDA twins (executor/cuda/matmul.cu): input checks,
// attributes, the output dtype and shape, and the product's geometry. Which dtypes run, and how the operands are
// laid out in memory, is each backend's: on the CPU a MatMul may read its operands through Transposes the plan
// folded into it (executor/plan_fusion.h), so prepare_matmul also takes the operands' logical shapes.
#include <cstdint>
#include <vector>

#include "executor/kernel.h"

namespace onnxtrain::ops {

// MatMul with numpy semantics: Y[b...] = A[b...] · B[b...], batch dims broadcast.
struct MatMulGeometry {
  int64_t M = 0, N = 0, K = 0;
  // A 1-D A is the row [1, K], a 1-D B the column [K, 1]; the dim added is not in the output.
  bool a_vector = false, b_vector = false;
  std::vector<int64_t> out_batch;         // the output's batch dims (A's and B's broadcast)
  std::vector<int64_t> a_batch, b_batch;  // A's and B's batch dims, left-padded with 1 to out_batch's rank
  // The number of products (of out_batch's dims).
  int64_t batch() const;
};
// Checks A and B (present, the same dtype, rank >= 1, K agreeing, batch dims broadcasting) and sets Y.
MatMulGeometry prepare_matmul(PrepareContext& ctx);
// The same on the operands' logical shapes (the CPU's, when the plan folded Transposes into the node): `a_shape`
// and `b_shape` replace the inputs' shapes, in the checks, their messages and the output.
MatMulGeometry prepare_matmul(PrepareContext& ctx, const std::vector<int64_t>& a_shape,
                              const std::vector<int64_t>& b_shape);

// Gemm: Y = alpha * op(A) · op(B) + beta * C, op(A) [M, K], op(B) [K, N], C broadcast (unidirectionally) to [M, N].
struct GemmGeometry {
  int64_t M = 0, N = 0, K = 0;
  bool trans_a = false, trans_b = false;  // A stored [K, M], B stored [N, K]
  double alpha = 1.0, beta = 1.0;
  bool has_c = false;
  // With C: its shape left-padded with 1 to [rows, cols], rows 1 or M and cols 1 or N (1: broadcast).
  std::vector<int64_t> c_shape;
};
// Checks A, B (present, the same dtype, 2-D, K agreeing) and C (A's dtype, rank <= 2, broadcasting to [M, N]) and
// sets Y [M, N].
GemmGeometry prepare_gemm(PrepareContext& ctx);

}  // namespace onnxtrain::ops
