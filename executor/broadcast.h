#pragma once
// ONNX multidirectional (numpy) broadcasting, planned once at plan time and walked cheaply at run time.
// A BroadcastPlan collapses the output's iteration space to as few dimensions as the inputs allow (dims of
// size 1 dropped, neighbours merged when every input steps through them the same way), and records each
// input's element stride per collapsed dimension (0 where it is broadcast). The loop driver hands a kernel
// contiguous runs of the innermost dimension, so inner loops stay tight and vectorisable.
#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace onnxtrain {

// The broadcast of several shapes, or nullopt when some dimension pair is neither equal nor 1.
std::optional<std::vector<int64_t>> broadcast_shapes(std::span<const std::vector<int64_t>> shapes);
// "[2,3], [4]" for error messages.
std::string shapes_string(std::span<const std::vector<int64_t>> shapes);

struct BroadcastPlan {
  static constexpr size_t kMaxRank = 16;  // after collapsing; more distinct broadcast patterns are rejected
  std::vector<int64_t> out_shape;
  int64_t numel = 0;
  size_t num_inputs = 0;
  std::vector<int64_t> dims;     // collapsed iteration space, outermost first; empty for a single element
  std::vector<int64_t> strides;  // strides[i * dims.size() + d]: input i's element stride along dims[d]

  size_t rank() const { return dims.size(); }
  int64_t stride(size_t input, size_t d) const { return strides[input * dims.size() + d]; }
  // Stride of input i along the innermost dimension: 1 (contiguous run), 0 (one value repeated) or other.
  int64_t inner_stride(size_t input) const { return dims.empty() ? 0 : stride(input, dims.size() - 1); }
  // Every input has the output's shape (up to leading 1s): the plain elementwise fast path applies.
  bool all_contiguous() const;
};

// Plans inputs broadcast (unidirectionally) onto out_shape; throws Error naming the shapes when one does not
// broadcast to it. Use broadcast_shapes() first for the multidirectional case.
BroadcastPlan plan_broadcast(std::span<const std::vector<int64_t>> inputs, std::span<const int64_t> out_shape);

// Splits [0, n) into one chunk per OpenMP thread when n exceeds min_parallel (else runs inline), aligning
// chunk starts to 16 elements so threads do not share cache lines of the output.
void parallel_chunks_impl(int64_t n, int64_t min_parallel, void (*fn)(void*, int64_t, int64_t), void* ctx);
template <class F> void parallel_chunks(int64_t n, int64_t min_parallel, F&& f) {
  if (n <= 0) return;
  if (n <= min_parallel) {
    f(int64_t{0}, n);
    return;
  }
  parallel_chunks_impl(
      n, min_parallel, [](void* c, int64_t b, int64_t e) { (*static_cast<std::remove_reference_t<F>*>(c))(b, e); },
      &f);
}

// Calls row(out_offset, in_offsets, count) for consecutive runs of the output in order, where output
// elements [out_offset, out_offset+count) read input i at in_offsets[i] + k * plan.inner_stride(i). Work is
// split across threads when the output has more than min_parallel elements.
template <size_t N, class Row>
void for_each_broadcast_row(const BroadcastPlan& p, int64_t min_parallel, Row&& row) {
  const size_t r = p.rank();
  if (p.numel == 0) return;
  if (r == 0) {
    std::array<int64_t, N> off{};
    row(int64_t{0}, off, int64_t{1});
    return;
  }
  parallel_chunks(p.numel, min_parallel, [&](int64_t begin, int64_t end) {
    std::array<int64_t, BroadcastPlan::kMaxRank> coord{};
    std::array<int64_t, N> off{};
    int64_t rem = begin;
    for (size_t d = r; d-- > 0;) {
      coord[d] = rem % p.dims[d];
      rem /= p.dims[d];
      for (size_t i = 0; i < N; ++i) off[i] += coord[d] * p.stride(i, d);
    }
    const int64_t inner = p.dims[r - 1];
    std::array<int64_t, N> inner_stride;
    for (size_t i = 0; i < N; ++i) inner_stride[i] = p.stride(i, r - 1);
    int64_t pos = begin;
    while (pos < end) {
      const int64_t count = std::min(inner - coord[r - 1], end - pos);
      row(pos, off, count);
      pos += count;
      if (pos >= end) break;
      // Advance to the start of the next innermost run (the odometer).
      for (size_t i = 0; i < N; ++i) off[i] += count * inner_stride[i];
      coord[r - 1] += count;
      for (size_t d = r - 1; d > 0 && coord[d] == p.dims[d]; --d) {
        coord[d] = 0;
        coord[d - 1] += 1;
        for (size_t i = 0; i < N; ++i) off[i] += p.stride(i, d - 1) - p.dims[d] * p.stride(i, d);
      }
    }
  });
}

}  // namespace onnxtrain
