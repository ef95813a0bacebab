#pragma once
// The plan-time part of the reductions (ReduceSum ... ReduceLogSumExp), ArgMax/ArgMin, CumSum and TopK, shared by
// the CPU kernels (executor/cpu/reduce.cpp) and their CUDA twins (executor/cuda/reduce.cu): input checks, the
// axes (attribute or plan-time input), and the output dtypes and shapes. Which (op, dtype) pairs run is each
// kernel's: the registry only hands them the dtypes they registered.
#include <cstdint>
#include <vector>

#include "executor/kernel.h"

namespace onnxtrain::ops {

// A reduction's axes over input 0's dims. `identity`: noop_with_empty_axes with no axes (the output is the input).
struct ReduceAxes {
  std::vector<bool> reduced;
  bool identity = false;
};
// `axes_input_since`: the opset from which axes is an input rather than an attribute.
ReduceAxes prepare_reduce(PrepareContext& ctx, int64_t axes_input_since);

// One axis of input 0 viewed as [outer, n, inner].
struct AxisSplit {
  int64_t outer = 1, n = 0, inner = 1;
};

struct ArgAttrs {
  AxisSplit split;
  bool select_last = false;  // select_last_index (opset 12+)
};
ArgAttrs prepare_arg(PrepareContext& ctx);

struct CumSumAttrs {
  AxisSplit split;
  bool exclusive = false, reverse = false;
};
CumSumAttrs prepare_cumsum(PrepareContext& ctx);

struct TopKAttrs {
  AxisSplit split;
  int64_t k = 0;
  bool largest = true;
};
TopKAttrs prepare_topk(PrepareContext& ctx);

}  // namespace onnxtrain::ops
