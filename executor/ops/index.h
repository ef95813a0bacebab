#pragma once
// The plan-time part of GatherElements, ScatterElements, GatherND and ScatterND, shared by the CPU kernels
// (executor/cpu/index.cpp) and their CUDA twins (executor/cuda/index.cu): input checks, attributes and the
// output dtypes and shapes. Out-of-range indices are data, found when the kernels run.
#include <cstdint>

#include "executor/kernel.h"

namespace onnxtrain::ops {

// The scatters' reduction attribute (add and mul from opset 16, max and min from 18).
enum class IndexReduction { None, Add, Mul, Max, Min };

// GatherElements / ScatterElements: indices (int32 or int64) of data's rank, no larger than data off the axis.
struct ElementsAttrs {
  int64_t axis = 0;
  IndexReduction reduction = IndexReduction::None;  // ScatterElements only
};
ElementsAttrs prepare_gather_elements(PrepareContext& ctx);
ElementsAttrs prepare_scatter_elements(PrepareContext& ctx);

// GatherND / ScatterND (batch_dims 0): int64 index tuples of k components, each addressing a slice of `slice`
// elements of data; `batches` * `tuples` tuples in all.
struct NdAttrs {
  int64_t batch_dims = 0, batches = 1, tuples = 1, k = 0, slice = 1;
  IndexReduction reduction = IndexReduction::None;  // ScatterND only
};
NdAttrs prepare_gather_nd(PrepareContext& ctx);
NdAttrs prepare_scatter_nd(PrepareContext& ctx);

}  // namespace onnxtrain::ops
