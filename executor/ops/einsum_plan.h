#pragma once
// Einsum's plan-time part (executor/ops/einsum_plan.cpp), shared by the CPU kernel (executor/cpu/einsum.cpp) and its
// CUDA twin (executor/cuda/einsum.cu), so both backends check the node and parse the equation once, the same way,
// and neither runs the other's factory. Device-neutral: plain host data.
#include <cstdint>
#include <vector>

#include "executor/kernel.h"

namespace onnxtrain::ops {

// out[o] = sum over the summed indices s of prod_t operand_t[o . out_strides[t] + s . sum_strides[t]].
struct EinsumPlan {
  std::vector<int64_t> out_dims;                   // sizes of the output indices
  std::vector<int64_t> sum_dims;                   // sizes of the summed indices
  std::vector<std::vector<int64_t>> out_strides;   // per operand, stride for each output index
  std::vector<std::vector<int64_t>> sum_strides;   // per operand, stride for each summed index
};

// Checks the inputs (at least one, all present, one dtype) and the equation, sets output 0 (input 0's dtype, the
// output indices' sizes) and returns the index plan. The kernels only pick their element type.
EinsumPlan prepare_einsum(PrepareContext& ctx);

}  // namespace onnxtrain::ops
