#pragma once
// Einsum's plan-time index plan, built by the CPU kernel (executor/cpu/einsum.cpp) and read by its CUDA twin
// (executor/cuda/einsum.cu), so both backends parse the equation once, the same way. Device-neutral: plain host
// data and the interface the CPU kernel implements.
#include <cstdint>
#include <vector>

namespace onnxtrain::ops {

// out[o] = sum over the summed indices s of prod_t operand_t[o . out_strides[t] + s . sum_strides[t]].
struct EinsumPlan {
  std::vector<int64_t> out_dims;                   // sizes of the output indices
  std::vector<int64_t> sum_dims;                   // sizes of the summed indices
  std::vector<std::vector<int64_t>> out_strides;   // per operand, stride for each output index
  std::vector<std::vector<int64_t>> sum_strides;   // per operand, stride for each summed index
};

// Implemented by the CPU Einsum kernel.
class EinsumPlanned {
 public:
  virtual ~EinsumPlanned() = default;
  virtual const EinsumPlan& plan() const = 0;
};

}  // namespace onnxtrain::ops
