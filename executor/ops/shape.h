#pragma once
// The plan-time part of the shape family's ops (executor/cpu/shape.cpp, executor/cuda/shape.cu,
// gradients/rules/shape.cpp), shared by the CPU kernels and their CUDA twins: input checks, attributes and
// plan-time inputs, the output dtypes and shapes, and what the kernels walk. The views Reshape, Flatten, Squeeze
// and Unsqueeze; Gather; the plan-time values Shape, Size, Constant, ConstantOfShape and Range; and the
// data-movement ops (Transpose, Slice, Expand, Tile, Concat, Split, Pad, DepthToSpace, SpaceToDepth, Trilu),
// whose geometry the CPU runners copy by and whose gather maps (built here from the same geometry) the CUDA
// kernel gathers by.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "executor/kernel.h"
#include "executor/tensor.h"

namespace onnxtrain::ops {

// Each sets output 0 to the input's dtype and the new shape (same number of elements); the kernels copy bytes
// or view them.
void prepare_reshape(PrepareContext& ctx);
void prepare_flatten(PrepareContext& ctx);
void prepare_squeeze(PrepareContext& ctx);
void prepare_unsqueeze(PrepareContext& ctx);

// Gather along `axis`: data read as [outer, n, inner]; indices int32 or int64, checked when the kernels run.
struct GatherGeometry {
  int64_t outer = 1, n = 0, inner = 1;
};
GatherGeometry prepare_gather(PrepareContext& ctx);

// Ops whose output is known at plan time: each sets output 0 and returns its value (a host tensor), which the CPU
// kernel writes and the plan folds; CUDA plans only ever fold them (cuda/shape.cu, fold_only).
Tensor prepare_shape(PrepareContext& ctx);  // reads through a folded Transpose (kShapePerm, plan_fusion.h)
Tensor prepare_size(PrepareContext& ctx);
Tensor prepare_constant(PrepareContext& ctx);
Tensor prepare_range(PrepareContext& ctx);
// ConstantOfShape: the one-element fill value (attribute `value`, float32 0 by default).
TensorData prepare_constant_of_shape(PrepareContext& ctx);

// ---- Data movement: every output element is one input element or a fill value ------------------------------
// Each prepare_* checks the node (the CPU factories' messages, word for word), sets the outputs and returns the
// geometry; the CPU factory runs it with its copy loops (cpu/shape.cpp), and the *_maps functions below turn it
// into gather maps for the CUDA kernel (cuda/shape.cu). All counts and offsets are in elements.

// out (contiguous, shape dims)[i0, i1, ...] = in[base + sum_k i_k * strides_k]. Transpose, Slice, Expand and
// Tile (whose dims are (repeat, original) per input dim, the repeat read with stride 0); DepthToSpace and
// SpaceToDepth (the input viewed 6-D and permuted, base 0).
struct StridedView {
  std::vector<int64_t> dims, strides;
  int64_t base = 0;
};
StridedView prepare_transpose(PrepareContext& ctx);
StridedView prepare_slice(PrepareContext& ctx);  // attributes before opset 10, inputs from then on
StridedView prepare_expand(PrepareContext& ctx);
StridedView prepare_tile(PrepareContext& ctx);
StridedView prepare_depth_to_space(PrepareContext& ctx);
StridedView prepare_space_to_depth(PrepareContext& ctx);

// Concat and Split along one axis: every tensor read as [outer, n_i * inner], `chunks` the n_i * inner of each
// input (Concat) or output (Split).
struct AxisChunks {
  int64_t outer = 1;
  std::vector<int64_t> chunks;
};
AxisChunks prepare_concat(PrepareContext& ctx);
AxisChunks prepare_split(PrepareContext& ctx);

// Trilu: `batch` matrices of n x m; element (i, j) is kept or zeroed by trilu_keeps.
struct TriluGeometry {
  int64_t batch = 0, n = 0, m = 0, k = 0;
  bool upper = true;
};
TriluGeometry prepare_trilu(PrepareContext& ctx);
// On or above diagonal k (upper), on or below it (lower); the rest is zero.
constexpr bool trilu_keeps(int64_t i, int64_t j, int64_t k, bool upper) { return upper ? j - i >= k : j - i <= k; }

// Pad (constant mode, the only one supported): begins/ends per axis, negative ones crop.
struct PadGeometry {
  std::vector<int64_t> in_shape, out_shape, begins, ends;
  // Before opset 11 the constant is the float attribute `value`, here as data's dtype (es bytes, zeros for other
  // dtypes, where only 0 is accepted); empty from opset 11, where it is input 2 (zero when absent).
  std::vector<std::byte> attr_value;
};
PadGeometry prepare_pad(PrepareContext& ctx);
// One axis of a pad: output elements [dst, dst + len) read input elements [src, src + len); the others are the
// constant.
struct PadSpan {
  int64_t src = 0, dst = 0, len = 0;
};
PadSpan pad_span(int64_t dim, int64_t begin, int64_t end);
// The input index output index o reads along that axis, or -1 for the constant.
constexpr int64_t pad_source(const PadSpan& s, int64_t o) { return o >= s.dst && o < s.dst + s.len ? s.src + o - s.dst : -1; }

// Gather maps: for each output, per element in its (contiguous) order, the flat index of the element it reads in
// the data inputs laid end to end (Concat: input 0's elements, then input 1's, ...; the other ops: input 0's), or
// -1 for the fill value. What the CUDA kernel runs; built on the host from the geometry above, so the semantics
// are the op layer's (tests/executor/test_op_layer_movement.cpp checks them against the CPU kernels).
std::vector<int64_t> gather_map(const StridedView& v);
std::vector<int64_t> concat_map(const AxisChunks& c);
std::vector<std::vector<int64_t>> split_maps(const AxisChunks& c);
std::vector<int64_t> trilu_map(const TriluGeometry& g);
std::vector<int64_t> pad_map(const PadGeometry& g);

struct GatherMaps {
  std::vector<std::vector<int64_t>> maps;  // one per output
  std::vector<size_t> data;                // the inputs the maps index, in order
  std::vector<int64_t> bases;              // where each of them starts in the concatenation
  int64_t total = 0;                       // elements of all of them
  int fill_input = -1;                     // the input holding the fill value (Pad from opset 11); else zero
};
// Each op's prepare_* and its maps: the whole plan-time part of the CUDA factory but the upload.
GatherMaps transpose_gather_maps(PrepareContext& ctx);
GatherMaps slice_gather_maps(PrepareContext& ctx);
GatherMaps expand_gather_maps(PrepareContext& ctx);
GatherMaps tile_gather_maps(PrepareContext& ctx);
GatherMaps depth_to_space_gather_maps(PrepareContext& ctx);
GatherMaps space_to_depth_gather_maps(PrepareContext& ctx);
GatherMaps concat_gather_maps(PrepareContext& ctx);
GatherMaps split_gather_maps(PrepareContext& ctx);
GatherMaps trilu_gather_maps(PrepareContext& ctx);
GatherMaps pad_gather_maps(PrepareContext& ctx);

}  // namespace onnxtrain::ops
