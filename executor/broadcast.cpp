#include "executor/broadcast.h"

#include <omp.h>

#include "executor/tensor.h"
#include "graph/error.h"

namespace onnxtrain {

std::optional<std::vector<int64_t>> broadcast_shapes(std::span<const std::vector<int64_t>> shapes) {
  size_t rank = 0;
  for (const auto& s : shapes) rank = std::max(rank, s.size());
  std::vector<int64_t> out(rank, 1);
  for (const auto& s : shapes) {
    const size_t lead = rank - s.size();
    for (size_t d = 0; d < s.size(); ++d) {
      int64_t& o = out[lead + d];
      const int64_t v = s[d];
      if (v == o || v == 1) continue;
      if (o != 1) return std::nullopt;
      o = v;  // includes 0: a 0-sized dim broadcasts against 1 only
    }
  }
  return out;
}

std::string shapes_string(std::span<const std::vector<int64_t>> shapes) {
  std::string r;
  for (size_t i = 0; i < shapes.size(); ++i) r += (i ? ", " : "") + shape_string(shapes[i]);
  return r;
}

bool BroadcastPlan::all_contiguous() const {
  if (dims.size() > 1) return false;
  for (size_t i = 0; i < num_inputs; ++i)
    if (inner_stride(i) != 1 && numel > 1) return false;
  return true;
}

BroadcastPlan plan_broadcast(std::span<const std::vector<int64_t>> inputs, std::span<const int64_t> out_shape) {
  BroadcastPlan p;
  p.out_shape.assign(out_shape.begin(), out_shape.end());
  p.numel = numel_of(out_shape);
  p.num_inputs = inputs.size();
  const size_t rank = out_shape.size();
  const size_t n = inputs.size();

  // Full-rank strides of every input against the output, 0 where it is broadcast.
  std::vector<std::vector<int64_t>> full(n, std::vector<int64_t>(rank, 0));
  for (size_t i = 0; i < n; ++i) {
    const auto& s = inputs[i];
    if (s.size() > rank)
      throw Error("cannot broadcast shape " + shape_string(s) + " to " + shape_string(out_shape) +
                  ": it has more dimensions");
    const size_t lead = rank - s.size();
    int64_t stride = 1;
    for (size_t d = s.size(); d-- > 0;) {
      const int64_t o = out_shape[lead + d];
      if (s[d] == o) {
        full[i][lead + d] = o == 1 ? 0 : stride;
      } else if (s[d] == 1) {
        full[i][lead + d] = 0;
      } else {
        throw Error("cannot broadcast shape " + shape_string(s) + " to " + shape_string(out_shape) + ": dimension " +
                    std::to_string(d) + " is " + std::to_string(s[d]) + ", expected " + std::to_string(o) + " or 1");
      }
      stride *= s[d];
    }
  }
  if (p.numel == 0) return p;  // nothing to iterate

  // Drop size-1 dims, then merge a dim into its outer neighbour when every input steps through both alike.
  std::vector<int64_t> dims;
  std::vector<std::vector<int64_t>> st(n);
  for (size_t d = 0; d < rank; ++d) {
    if (out_shape[d] == 1) continue;
    bool merge = !dims.empty();
    for (size_t i = 0; merge && i < n; ++i) merge = st[i].back() == full[i][d] * out_shape[d];
    if (merge) {
      dims.back() *= out_shape[d];
      for (size_t i = 0; i < n; ++i) st[i].back() = full[i][d];
    } else {
      dims.push_back(out_shape[d]);
      for (size_t i = 0; i < n; ++i) st[i].push_back(full[i][d]);
    }
  }
  if (dims.size() > BroadcastPlan::kMaxRank)
    throw Error("broadcasting " + shapes_string(inputs) + " to " + shape_string(out_shape) + " needs " +
                std::to_string(dims.size()) + " distinct dimensions; at most " +
                std::to_string(BroadcastPlan::kMaxRank) + " are supported");
  p.dims = std::move(dims);
  p.strides.reserve(n * p.dims.size());
  for (size_t i = 0; i < n; ++i) p.strides.insert(p.strides.end(), st[i].begin(), st[i].end());
  return p;
}

void parallel_chunks_impl(int64_t n, int64_t min_parallel, void (*fn)(void*, int64_t, int64_t), void* ctx) {
  // One thread: call directly. A one-thread `omp parallel` still makes (and allocates) a team on every call.
  if (n <= min_parallel || omp_get_max_threads() < 2) {
    fn(ctx, 0, n);
    return;
  }
#pragma omp parallel
  {
    const int64_t nt = omp_get_num_threads();
    const int64_t t = omp_get_thread_num();
    auto bound = [&](int64_t k) { return k == nt ? n : std::min(n, (n * k / nt) / 16 * 16); };
    const int64_t b = bound(t), e = bound(t + 1);
    if (b < e) fn(ctx, b, e);
  }
}

}  // namespace onnxtrain
