// Shape and data-movement ops on the CPU. They never look at element values, so every kernel here works on
// raw bytes of any fixed-size dtype. Everything that only rearranges memory (Transpose, Slice, Expand, Tile)
// is one StridedCopy built at plan time: the output walked in order, the input through per-dim strides.
// Reshape, Flatten, Squeeze and Unsqueeze copy their input; aliasing them is a plan-level decision.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "executor/cpu/kernel_util.h"
#include "executor/kernel.h"
#include "executor/ops/shape.h"
#include "graph/error.h"

namespace onnxtrain {
namespace {

constexpr int64_t kParallelBytes = 1 << 20;  // below this, threads cost more than the copy

// ---------------------------------------------------------------------------------------------------------
// Plan-time helpers.

using cpu::CopyKernel;
using cpu::contiguous_strides;
using cpu::elem_size;
using cpu::has_input;
using cpu::ints_of;
using cpu::normalize_axis;
using cpu::required_input;
using cpu::set_output;

std::vector<int64_t> constant_ints(const PrepareContext& ctx, size_t i, const std::string& what) {
  return ints_of(ctx, ctx.constant_input(i), what);
}

// ---------------------------------------------------------------------------------------------------------
// StridedCopy: out (contiguous, shape dims) [i0, i1, ...] = in[base + sum_k i_k * strides_k].

template <class E> void copy_strided_row(const std::byte* in, int64_t stride, int64_t n, std::byte* out) {
  const E* s = reinterpret_cast<const E*>(in);
  E* d = reinterpret_cast<E*>(out);
  for (int64_t j = 0; j < n; ++j) d[j] = s[j * stride];
}

class StridedCopy {
 public:
  StridedCopy() = default;
  StridedCopy(const std::vector<int64_t>& dims, const std::vector<int64_t>& strides, int64_t base, size_t esize)
      : es_(esize), base_(base) {
    numel_ = 1;
    for (int64_t d : dims) numel_ *= d;
    // Drop size-1 dims and merge neighbours that are contiguous with each other in the input, so a copy
    // of a contiguous block becomes one memcpy and a 2-D transpose stays 2-D whatever the rank.
    for (size_t k = 0; k < dims.size(); ++k) {
      if (dims[k] == 1) continue;
      if (!dims_.empty() && strides_.back() == strides[k] * dims[k]) {
        dims_.back() *= dims[k];
        strides_.back() = strides[k];
      } else {
        dims_.push_back(dims[k]);
        strides_.push_back(strides[k]);
      }
    }
    if (dims_.empty()) {
      dims_.push_back(1);
      strides_.push_back(1);
    }
    const size_t r = dims_.size();
    ostrides_ = contiguous_strides(dims_);
    // A transpose: the input's contiguous dim is not the output's last. Copy in tiles so both sides stay in
    // cache.
    if (strides_.back() != 1 && dims_.back() >= 8) {
      for (size_t k = 0; k + 1 < r; ++k)
        if (strides_[k] == 1 && dims_[k] >= 8) tile_ = static_cast<int>(k);
    }
    for (size_t k = 0; k + 1 < r; ++k)
      if (static_cast<int>(k) != tile_) outer_.push_back(k);
  }

  void operator()(const void* in_v, void* out_v) const {
    if (numel_ == 0) return;
    const std::byte* in = static_cast<const std::byte*>(in_v) + base_ * static_cast<int64_t>(es_);
    std::byte* out = static_cast<std::byte*>(out_v);
    int64_t rows = 1;
    for (size_t k : outer_) rows *= dims_[k];
    const int64_t bytes = numel_ * static_cast<int64_t>(es_);
    const int nth = bytes >= kParallelBytes && rows > 1 ? omp_get_max_threads() : 1;
    if (nth == 1 && tile_ >= 0 && rows == 1 && bytes >= kParallelBytes) {
      // A single big 2-D transpose: split its rows of tiles between threads instead.
      const int64_t n = dims_[static_cast<size_t>(tile_)];
#pragma omp parallel
      {
        const int t = omp_get_thread_num(), k = omp_get_num_threads();
        tile_copy(in, out, n * t / k, n * (t + 1) / k);
      }
      return;
    }
    if (nth == 1) {
      rows_range(in, out, 0, rows);
      return;
    }
#pragma omp parallel num_threads(nth)
    {
      const int t = omp_get_thread_num(), n = omp_get_num_threads();
      const int64_t b = rows * t / n, e = rows * (t + 1) / n;
      rows_range(in, out, b, e);
    }
  }

 private:
  // Rows [b, e) of the outer dims; each row is one inner line (or one tile column strip).
  void rows_range(const std::byte* in, std::byte* out, int64_t b, int64_t e) const {
    if (b >= e) return;
    const size_t no = outer_.size();
    int64_t idx[16] = {};
    int64_t ioff = 0, ooff = 0;
    // Decompose b once; then advance like an odometer.
    int64_t rem = b;
    for (size_t q = no; q-- > 0;) {
      const size_t k = outer_[q];
      idx[q] = rem % dims_[k];
      rem /= dims_[k];
      ioff += idx[q] * strides_[k];
      ooff += idx[q] * ostrides_[k];
    }
    const int64_t es = static_cast<int64_t>(es_);
    const int64_t n = dims_.back(), s = strides_.back();
    for (int64_t row = b; row < e; ++row) {
      if (tile_ >= 0) {
        tile_copy(in + ioff * es, out + ooff * es, 0, dims_[static_cast<size_t>(tile_)]);
      } else if (s == 1) {
        std::memcpy(out + ooff * es, in + ioff * es, static_cast<size_t>(n * es));
      } else {
        line(in + ioff * es, s, n, out + ooff * es);
      }
      for (size_t q = no; q-- > 0;) {
        const size_t k = outer_[q];
        ioff += strides_[k];
        ooff += ostrides_[k];
        if (++idx[q] < dims_[k]) break;
        ioff -= strides_[k] * dims_[k];
        ooff -= ostrides_[k] * dims_[k];
        idx[q] = 0;
      }
    }
  }

  void line(const std::byte* in, int64_t stride, int64_t n, std::byte* out) const {
    switch (es_) {
      case 1: return copy_strided_row<uint8_t>(in, stride, n, out);
      case 2: return copy_strided_row<uint16_t>(in, stride, n, out);
      case 4: return copy_strided_row<uint32_t>(in, stride, n, out);
      case 8: return copy_strided_row<uint64_t>(in, stride, n, out);
      default:
        for (int64_t j = 0; j < n; ++j) std::memcpy(out + j * es_, in + j * stride * es_, es_);
    }
  }

  // Rows [r0, r1) of the tile dim.
  template <class E> void tile_typed(const std::byte* in_b, std::byte* out_b, int64_t r0, int64_t r1) const {
    const E* in = reinterpret_cast<const E*>(in_b);
    E* out = reinterpret_cast<E*>(out_b);
    const int64_t cols = dims_.back();
    const int64_t os = ostrides_[static_cast<size_t>(tile_)], is = strides_.back();
    constexpr int64_t T = 16;  // measured: 32 and up thrash on power-of-two strides
    for (int64_t i0 = r0; i0 < r1; i0 += T)
      for (int64_t j0 = 0; j0 < cols; j0 += T) {
        const int64_t i1 = std::min(r1, i0 + T), j1 = std::min(cols, j0 + T);
        for (int64_t i = i0; i < i1; ++i)
          for (int64_t j = j0; j < j1; ++j) out[i * os + j] = in[i + j * is];
      }
  }

  void tile_copy(const std::byte* in, std::byte* out, int64_t r0, int64_t r1) const {
    switch (es_) {
      case 1: return tile_typed<uint8_t>(in, out, r0, r1);
      case 2: return tile_typed<uint16_t>(in, out, r0, r1);
      case 4: return tile_typed<uint32_t>(in, out, r0, r1);
      case 8: return tile_typed<uint64_t>(in, out, r0, r1);
      default: {
        const int64_t es = static_cast<int64_t>(es_);
        for (int64_t i = r0; i < r1; ++i)
          for (int64_t j = 0; j < dims_.back(); ++j)
            std::memcpy(out + (i * ostrides_[static_cast<size_t>(tile_)] + j) * es, in + (i + j * strides_.back()) * es, es_);
      }
    }
  }

  size_t es_ = 1;
  int64_t base_ = 0, numel_ = 0;
  std::vector<int64_t> dims_, strides_, ostrides_;
  std::vector<size_t> outer_;  // dims walked by the odometer (all but the last and the tile dim)
  int tile_ = -1;
};

class StridedCopyKernel final : public Kernel {
 public:
  explicit StridedCopyKernel(StridedCopy c) : copy_(std::move(c)) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    copy_(in[0]->data, out[0]->data);
  }

 private:
  StridedCopy copy_;
};

std::unique_ptr<Kernel> strided_kernel(PrepareContext& ctx, const std::vector<int64_t>& dims,
                                       const std::vector<int64_t>& strides, int64_t base, size_t es) {
  if (dims.size() > 16) ctx.fail("tensors of rank above 16 are not supported");
  return std::make_unique<StridedCopyKernel>(StridedCopy(dims, strides, base, es));
}

// Output is the input's bytes under a new shape.
// Writes bytes fixed at plan time (Shape, Size, Constant, ConstantOfShape's fill, Range).
class ConstantKernel final : public Kernel {
 public:
  explicit ConstantKernel(Tensor value) : value_(std::move(value)) {}
  void run(std::span<const Tensor* const>, std::span<Tensor* const> out) override {
    if (value_.nbytes()) std::memcpy(out[0]->data, value_.data, value_.nbytes());
  }

 private:
  Tensor value_;
};

// ---------------------------------------------------------------------------------------------------------
// Reshape-like ops.

// The checks and the output shape are the op layer's (executor/ops/shape.h); the kernel copies bytes, which the
// plan usually turns into a view.
std::unique_ptr<Kernel> make_reshape(PrepareContext& ctx) {
  ops::prepare_reshape(ctx);
  return std::make_unique<CopyKernel>();
}

std::unique_ptr<Kernel> make_flatten(PrepareContext& ctx) {
  ops::prepare_flatten(ctx);
  return std::make_unique<CopyKernel>();
}

std::unique_ptr<Kernel> make_squeeze(PrepareContext& ctx) {
  ops::prepare_squeeze(ctx);
  return std::make_unique<CopyKernel>();
}

std::unique_ptr<Kernel> make_unsqueeze(PrepareContext& ctx) {
  ops::prepare_unsqueeze(ctx);
  return std::make_unique<CopyKernel>();
}

// ---------------------------------------------------------------------------------------------------------
// Shape, Size, Constant, ConstantOfShape, Range.

// Their checks and values are the op layer's (executor/ops/shape.h); the kernels write the value.
std::unique_ptr<Kernel> make_shape(PrepareContext& ctx) {
  return std::make_unique<ConstantKernel>(ops::prepare_shape(ctx));
}

std::unique_ptr<Kernel> make_size(PrepareContext& ctx) { return std::make_unique<ConstantKernel>(ops::prepare_size(ctx)); }

std::unique_ptr<Kernel> make_constant(PrepareContext& ctx) {
  return std::make_unique<ConstantKernel>(ops::prepare_constant(ctx));
}

class FillKernel final : public Kernel {
 public:
  explicit FillKernel(std::vector<std::byte> value) : value_(std::move(value)) {}
  void run(std::span<const Tensor* const>, std::span<Tensor* const> out) override {
    std::byte* p = static_cast<std::byte*>(out[0]->data);
    const size_t es = value_.size();
    const int64_t n = out[0]->numel();
    bool zero = std::all_of(value_.begin(), value_.end(), [](std::byte b) { return b == std::byte{0}; });
    if (zero) {
      std::memset(p, 0, static_cast<size_t>(n) * es);
      return;
    }
    for (int64_t i = 0; i < n; ++i) std::memcpy(p + i * es, value_.data(), es);
  }

 private:
  std::vector<std::byte> value_;
};

std::unique_ptr<Kernel> make_constant_of_shape(PrepareContext& ctx) {
  return std::make_unique<FillKernel>(ops::prepare_constant_of_shape(ctx).bytes);
}

std::unique_ptr<Kernel> make_range(PrepareContext& ctx) {
  return std::make_unique<ConstantKernel>(ops::prepare_range(ctx));
}

// ---------------------------------------------------------------------------------------------------------
// Transpose, Slice, Expand, Tile: strided copies.

std::unique_ptr<Kernel> make_transpose(PrepareContext& ctx) {
  const KernelInput& x = required_input(ctx, 0, "data");
  const size_t es = elem_size(ctx, x.dtype);
  const size_t rank = x.shape.size();
  std::vector<int64_t> perm = ctx.node.attr_ints("perm");
  if (perm.empty()) {
    for (size_t i = rank; i-- > 0;) perm.push_back(static_cast<int64_t>(i));
  }
  if (perm.size() != rank)
    ctx.fail("perm has " + std::to_string(perm.size()) + " entries but the input has rank " + std::to_string(rank));
  std::vector<bool> seen(rank, false);
  const std::vector<int64_t> in_strides = contiguous_strides(x.shape);
  std::vector<int64_t> dims, strides;
  for (int64_t p : perm) {
    if (p < 0 || p >= static_cast<int64_t>(rank) || seen[static_cast<size_t>(p)])
      ctx.fail("perm " + shape_string(perm) + " is not a permutation of 0.." + std::to_string(rank - 1));
    seen[static_cast<size_t>(p)] = true;
    dims.push_back(x.shape[static_cast<size_t>(p)]);
    strides.push_back(in_strides[static_cast<size_t>(p)]);
  }
  set_output(ctx, 0, x.dtype, dims);
  return strided_kernel(ctx, dims, strides, 0, es);
}

std::unique_ptr<Kernel> make_slice(PrepareContext& ctx) {
  const KernelInput& x = required_input(ctx, 0, "data");
  const size_t es = elem_size(ctx, x.dtype);
  const int64_t rank = static_cast<int64_t>(x.shape.size());
  std::vector<int64_t> starts, ends, axes, steps;
  if (ctx.opset >= 10) {
    required_input(ctx, 1, "starts");
    required_input(ctx, 2, "ends");
    starts = constant_ints(ctx, 1, "starts");
    ends = constant_ints(ctx, 2, "ends");
    if (has_input(ctx, 3)) axes = constant_ints(ctx, 3, "axes");
    if (has_input(ctx, 4)) steps = constant_ints(ctx, 4, "steps");
  } else {
    starts = ctx.node.attr_ints("starts");
    ends = ctx.node.attr_ints("ends");
    axes = ctx.node.attr_ints("axes");
  }
  if (starts.size() != ends.size()) ctx.fail("starts and ends must have the same length");
  if (axes.empty())
    for (size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
  if (steps.empty()) steps.assign(starts.size(), 1);
  if (axes.size() != starts.size() || steps.size() != starts.size())
    ctx.fail("starts, ends, axes and steps must have the same length");

  std::vector<int64_t> strides = contiguous_strides(x.shape);
  std::vector<int64_t> dims = x.shape;
  std::vector<bool> seen(x.shape.size(), false);
  int64_t base = 0;
  for (size_t i = 0; i < axes.size(); ++i) {
    const size_t ax = static_cast<size_t>(normalize_axis(ctx, axes[i], rank));
    if (seen[ax]) ctx.fail("axis " + std::to_string(axes[i]) + " is repeated in axes");
    seen[ax] = true;
    const int64_t d = x.shape[ax], step = steps[i];
    if (step == 0) ctx.fail("steps must not be 0");
    int64_t start = starts[i], end = ends[i];
    // Clamping as the ONNX spec states it: a positive step walks [0, d], a negative one [-1, d-1].
    if (start < 0) start += d;
    if (end < 0) end += d;
    int64_t count;
    if (step > 0) {
      start = std::clamp<int64_t>(start, 0, d);
      end = std::clamp<int64_t>(end, 0, d);
      count = end > start ? (end - start + step - 1) / step : 0;
    } else {
      start = std::clamp<int64_t>(start, 0, d - 1);
      end = std::clamp<int64_t>(end, -1, d - 1);
      count = start > end ? (start - end + (-step) - 1) / (-step) : 0;
    }
    dims[ax] = count;
    if (count > 0) base += start * strides[ax];
    strides[ax] *= step;
  }
  set_output(ctx, 0, x.dtype, dims);
  return strided_kernel(ctx, dims, strides, numel_of(dims) ? base : 0, es);
}

std::unique_ptr<Kernel> make_expand(PrepareContext& ctx) {
  const KernelInput& x = required_input(ctx, 0, "input");
  const size_t es = elem_size(ctx, x.dtype);
  required_input(ctx, 1, "shape");
  const std::vector<int64_t> target = constant_ints(ctx, 1, "shape");
  const size_t rank = std::max(x.shape.size(), target.size());
  std::vector<int64_t> in(rank, 1), tg(rank, 1);
  std::copy(x.shape.begin(), x.shape.end(), in.begin() + static_cast<ptrdiff_t>(rank - x.shape.size()));
  std::copy(target.begin(), target.end(), tg.begin() + static_cast<ptrdiff_t>(rank - target.size()));
  const std::vector<int64_t> in_strides = contiguous_strides(in);
  std::vector<int64_t> dims(rank), strides(rank);
  for (size_t i = 0; i < rank; ++i) {
    if (in[i] != tg[i] && in[i] != 1 && tg[i] != 1)
      ctx.fail("cannot broadcast input " + shape_string(x.shape) + " to shape " + shape_string(target));
    dims[i] = in[i] == 1 ? tg[i] : in[i];
    strides[i] = in[i] == 1 ? 0 : in_strides[i];
  }
  set_output(ctx, 0, x.dtype, dims);
  return strided_kernel(ctx, dims, strides, 0, es);
}

std::unique_ptr<Kernel> make_tile(PrepareContext& ctx) {
  const KernelInput& x = required_input(ctx, 0, "input");
  const size_t es = elem_size(ctx, x.dtype);
  required_input(ctx, 1, "repeats");
  const std::vector<int64_t> reps = constant_ints(ctx, 1, "repeats");
  if (reps.size() != x.shape.size())
    ctx.fail("repeats has " + std::to_string(reps.size()) + " entries but the input has rank " +
             std::to_string(x.shape.size()));
  // Output dim k is (repeat, original) with the repeat outer, so it reads the input with stride 0.
  const std::vector<int64_t> in_strides = contiguous_strides(x.shape);
  std::vector<int64_t> out_shape, dims, strides;
  for (size_t k = 0; k < reps.size(); ++k) {
    if (reps[k] < 0) ctx.fail("repeats must not be negative");
    out_shape.push_back(reps[k] * x.shape[k]);
    dims.insert(dims.end(), {reps[k], x.shape[k]});
    strides.insert(strides.end(), {0, in_strides[k]});
  }
  set_output(ctx, 0, x.dtype, out_shape);
  return strided_kernel(ctx, dims, strides, 0, es);
}

// ---------------------------------------------------------------------------------------------------------
// Concat, Split, Gather.

class ConcatKernel final : public Kernel {
 public:
  ConcatKernel(int64_t outer, std::vector<int64_t> chunk_bytes) : outer_(outer), chunks_(std::move(chunk_bytes)) {
    for (int64_t c : chunks_) row_ += c;
  }
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    std::byte* y = static_cast<std::byte*>(out[0]->data);
    const bool par = outer_ * row_ >= kParallelBytes && outer_ > 1;
    cpu::parallel_for(outer_, par, [&](int64_t o) {
      std::byte* dst = y + o * row_;
      for (size_t i = 0; i < chunks_.size(); ++i) {
        if (!chunks_[i]) continue;
        std::memcpy(dst, static_cast<const std::byte*>(in[i]->data) + o * chunks_[i], static_cast<size_t>(chunks_[i]));
        dst += chunks_[i];
      }
    });
  }

 private:
  int64_t outer_, row_ = 0;
  std::vector<int64_t> chunks_;  // bytes per outer index, per input
};

std::unique_ptr<Kernel> make_concat(PrepareContext& ctx) {
  if (ctx.inputs.empty()) ctx.fail("needs at least one input");
  const KernelInput& first = required_input(ctx, 0, "inputs");
  const size_t es = elem_size(ctx, first.dtype);
  const int64_t rank = static_cast<int64_t>(first.shape.size());
  if (rank == 0) ctx.fail("inputs must have rank >= 1");
  if (!ctx.node.has_attr("axis") && ctx.opset >= 4) ctx.fail("attribute 'axis' is required");
  const size_t axis = static_cast<size_t>(normalize_axis(ctx, ctx.node.attr_int("axis", 1), rank));
  std::vector<int64_t> shape = first.shape;
  shape[axis] = 0;
  int64_t outer = 1, inner = 1;
  for (size_t i = 0; i < first.shape.size(); ++i) {
    if (i < axis) outer *= first.shape[i];
    if (i > axis) inner *= first.shape[i];
  }
  std::vector<int64_t> chunks;
  for (size_t i = 0; i < ctx.inputs.size(); ++i) {
    const KernelInput& in = required_input(ctx, i, "inputs");
    if (in.dtype != first.dtype) ctx.fail("input " + std::to_string(i) + " has type " + dtype_name(in.dtype) +
                                          " but input 0 has " + dtype_name(first.dtype));
    bool ok = in.shape.size() == first.shape.size();
    for (size_t k = 0; ok && k < in.shape.size(); ++k) ok = k == axis || in.shape[k] == first.shape[k];
    if (!ok)
      ctx.fail("input " + std::to_string(i) + " has shape " + shape_string(in.shape) + ", which does not match " +
               shape_string(first.shape) + " outside axis " + std::to_string(axis));
    shape[axis] += in.shape[axis];
    chunks.push_back(in.shape[axis] * inner * static_cast<int64_t>(es));
  }
  set_output(ctx, 0, first.dtype, shape);
  return std::make_unique<ConcatKernel>(outer, std::move(chunks));
}

class SplitKernel final : public Kernel {
 public:
  SplitKernel(int64_t outer, std::vector<int64_t> chunk_bytes) : outer_(outer), chunks_(std::move(chunk_bytes)) {
    for (int64_t c : chunks_) row_ += c;
  }
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const std::byte* x = static_cast<const std::byte*>(in[0]->data);
    for (int64_t o = 0; o < outer_; ++o) {
      const std::byte* src = x + o * row_;
      for (size_t i = 0; i < chunks_.size(); ++i) {
        if (out[i] && chunks_[i])
          std::memcpy(static_cast<std::byte*>(out[i]->data) + o * chunks_[i], src, static_cast<size_t>(chunks_[i]));
        src += chunks_[i];
      }
    }
  }

 private:
  int64_t outer_, row_ = 0;
  std::vector<int64_t> chunks_;
};

std::unique_ptr<Kernel> make_split(PrepareContext& ctx) {
  const KernelInput& x = required_input(ctx, 0, "input");
  const size_t es = elem_size(ctx, x.dtype);
  const int64_t rank = static_cast<int64_t>(x.shape.size());
  const size_t axis = static_cast<size_t>(normalize_axis(ctx, ctx.node.attr_int("axis", 0), rank));
  const int64_t n = x.shape[axis];
  const size_t nout = ctx.outputs.size();
  std::vector<int64_t> split;
  if (ctx.opset >= 13) {
    if (has_input(ctx, 1)) split = constant_ints(ctx, 1, "split");
  } else {
    split = ctx.node.attr_ints("split");
    if (split.empty() && has_input(ctx, 1)) split = constant_ints(ctx, 1, "split");  // opset 1 allowed an input
  }
  if (split.empty()) {
    if (ctx.opset >= 18 && ctx.node.has_attr("num_outputs")) {
      const int64_t k = ctx.node.attr_int("num_outputs", 0);
      if (k < 1 || static_cast<size_t>(k) != nout)
        ctx.fail("num_outputs is " + std::to_string(k) + " but the node has " + std::to_string(nout) + " outputs");
      // Every part gets ceil(n / k) elements except the last, which takes what is left.
      const int64_t part = (n + k - 1) / k;
      for (int64_t i = 0; i < k; ++i) split.push_back(std::max<int64_t>(0, std::min(part, n - i * part)));
    } else {
      if (nout == 0 || n % static_cast<int64_t>(nout) != 0)
        ctx.fail("axis " + std::to_string(axis) + " of size " + std::to_string(n) + " does not split evenly into " +
                 std::to_string(nout) + " outputs");
      split.assign(nout, n / static_cast<int64_t>(nout));
    }
  }
  if (split.size() != nout)
    ctx.fail("split has " + std::to_string(split.size()) + " entries but the node has " + std::to_string(nout) +
             " outputs");
  int64_t sum = 0;
  for (int64_t s : split) {
    if (s < 0) ctx.fail("split sizes must not be negative");
    sum += s;
  }
  if (sum != n)
    ctx.fail("split sizes add up to " + std::to_string(sum) + " but axis " + std::to_string(axis) + " has size " +
             std::to_string(n));
  int64_t outer = 1, inner = 1;
  for (size_t i = 0; i < x.shape.size(); ++i) {
    if (i < axis) outer *= x.shape[i];
    if (i > axis) inner *= x.shape[i];
  }
  std::vector<int64_t> chunks;
  for (size_t i = 0; i < nout; ++i) {
    std::vector<int64_t> shape = x.shape;
    shape[axis] = split[i];
    set_output(ctx, i, x.dtype, shape);
    chunks.push_back(split[i] * inner * static_cast<int64_t>(es));
  }
  return std::make_unique<SplitKernel>(outer, std::move(chunks));
}

template <class I> class GatherKernel final : public Kernel {
 public:
  GatherKernel(std::string where, int64_t outer, int64_t n, int64_t chunk_bytes)
      : where_(std::move(where)), outer_(outer), n_(n), chunk_(chunk_bytes) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const std::byte* x = static_cast<const std::byte*>(in[0]->data);
    const I* idx = in[1]->ptr<I>();
    const int64_t m = in[1]->numel();
    std::byte* y = static_cast<std::byte*>(out[0]->data);
    for (int64_t j = 0; j < m; ++j) {
      const int64_t v = static_cast<int64_t>(idx[j]);
      if (v < -n_ || v >= n_)
        fail(where_, "index " + std::to_string(v) + " is out of range for an axis of size " + std::to_string(n_));
    }
    const bool par = outer_ * m * chunk_ >= kParallelBytes;
    cpu::parallel_for(outer_, par, [&](int64_t o) {
      const std::byte* xo = x + o * n_ * chunk_;
      std::byte* yo = y + o * m * chunk_;
      for (int64_t j = 0; j < m; ++j) {
        int64_t v = static_cast<int64_t>(idx[j]);
        if (v < 0) v += n_;
        std::memcpy(yo + j * chunk_, xo + v * chunk_, static_cast<size_t>(chunk_));
      }
    });
  }

 private:
  std::string where_;
  int64_t outer_, n_, chunk_;
};

std::unique_ptr<Kernel> make_gather(PrepareContext& ctx) {
  const ops::GatherGeometry g = ops::prepare_gather(ctx);
  const int64_t chunk = g.inner * static_cast<int64_t>(elem_size(ctx, ctx.inputs[0].dtype));
  if (ctx.inputs[1].dtype == DType::Int64)
    return std::make_unique<GatherKernel<int64_t>>(ctx.node.describe(), g.outer, g.n, chunk);
  return std::make_unique<GatherKernel<int32_t>>(ctx.node.describe(), g.outer, g.n, chunk);
}

// ---------------------------------------------------------------------------------------------------------
// CenterCropPad (opset 18): each axis in `axes` (default: all) is centre-cropped or zero-padded to its entry of
// `shape`. Crop and pad both put the extra element of an odd difference at the end: the kept window starts at
// floor((dim - target) / 2) of the input when cropping, and the input lands at floor((target - dim) / 2) of
// the output when padding. The output is zeroed, then the overlap copied one innermost run at a time.

class CenterCropPadKernel final : public Kernel {
 public:
  CenterCropPadKernel(std::vector<int64_t> in_shape, std::vector<int64_t> out_shape, std::vector<int64_t> in_start,
                      std::vector<int64_t> out_start, std::vector<int64_t> count, size_t es)
      : in_strides_(contiguous_strides(in_shape)), out_strides_(contiguous_strides(out_shape)),
        in_start_(std::move(in_start)), out_start_(std::move(out_start)), count_(std::move(count)), es_(es) {
    out_bytes_ = static_cast<size_t>(numel_of(out_shape)) * es;
  }

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const auto* src = static_cast<const std::byte*>(in[0]->data);
    auto* dst = static_cast<std::byte*>(out[0]->data);
    std::memset(dst, 0, out_bytes_);
    const size_t rank = count_.size();
    for (int64_t c : count_)
      if (c == 0) return;
    if (rank == 0) {
      std::memcpy(dst, src, es_);
      return;
    }
    const size_t run = static_cast<size_t>(count_[rank - 1]) * es_;
    std::vector<int64_t> idx(rank - 1, 0);  // odometer over the overlap's outer dims
    while (true) {
      int64_t io = in_start_[rank - 1], oo = out_start_[rank - 1];
      for (size_t d = 0; d + 1 < rank; ++d) {
        io += (in_start_[d] + idx[d]) * in_strides_[d];
        oo += (out_start_[d] + idx[d]) * out_strides_[d];
      }
      std::memcpy(dst + oo * es_, src + io * es_, run);
      size_t d = rank - 1;
      while (d > 0 && ++idx[d - 1] == count_[d - 1]) idx[--d] = 0;
      if (d == 0) return;
    }
  }

 private:
  std::vector<int64_t> in_strides_, out_strides_, in_start_, out_start_, count_;
  size_t es_, out_bytes_ = 0;
};

std::unique_ptr<Kernel> make_center_crop_pad(PrepareContext& ctx) {
  const KernelInput& x = required_input(ctx, 0, "input_data");
  required_input(ctx, 1, "shape");
  const size_t es = elem_size(ctx, x.dtype);
  const auto rank = static_cast<int64_t>(x.shape.size());
  const std::vector<int64_t> target = constant_ints(ctx, 1, "shape");
  std::vector<int64_t> axes = ctx.node.attr_ints("axes");
  if (!ctx.node.has_attr("axes"))
    for (int64_t d = 0; d < rank; ++d) axes.push_back(d);
  if (axes.size() != target.size())
    ctx.fail("input 'shape' has " + std::to_string(target.size()) + " entries for " + std::to_string(axes.size()) +
             " axes");
  std::vector<int64_t> out = x.shape, in_start(rank, 0), out_start(rank, 0), count = x.shape;
  std::vector<bool> seen(rank, false);
  for (size_t i = 0; i < axes.size(); ++i) {
    const int64_t a = normalize_axis(ctx, axes[i], rank, "axes");
    if (seen[a]) ctx.fail("axis " + std::to_string(axes[i]) + " is repeated in 'axes'");
    seen[a] = true;
    const int64_t dim = x.shape[a], t = target[i];
    if (t < 0) ctx.fail("input 'shape' must be non-negative, got " + std::to_string(t) + " for axis " + std::to_string(a));
    out[a] = t;
    count[a] = std::min(dim, t);
    if (t < dim) in_start[a] = (dim - t) / 2;
    else out_start[a] = (t - dim) / 2;
  }
  set_output(ctx, 0, x.dtype, out);
  return std::make_unique<CenterCropPadKernel>(x.shape, out, in_start, out_start, count, es);
}

// ---------------------------------------------------------------------------------------------------------
// Compress (opsets 9, 11): the slices along `axis` (or the elements of the flattened input, without axis) whose
// entry of the 1-D bool `condition` is true; entries past the condition's end count as false. The output's
// shape depends on the condition's values, and plans fix every shape before running, so the condition must be
// known at plan time (a constant or an initializer); a run-time one is refused naming the node.

class CompressKernel final : public Kernel {
 public:
  CompressKernel(int64_t outer, int64_t len, int64_t inner, std::vector<int64_t> kept, size_t es)
      : outer_(outer), len_(len), inner_(inner), kept_(std::move(kept)), es_(es) {}

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const auto* src = static_cast<const std::byte*>(in[0]->data);
    auto* dst = static_cast<std::byte*>(out[0]->data);
    const size_t run = static_cast<size_t>(inner_) * es_;
    for (int64_t o = 0; o < outer_; ++o)
      for (int64_t k : kept_) {
        std::memcpy(dst, src + static_cast<size_t>(o * len_ + k) * run, run);
        dst += run;
      }
  }

 private:
  int64_t outer_, len_, inner_;
  std::vector<int64_t> kept_;
  size_t es_;
};

std::unique_ptr<Kernel> make_compress(PrepareContext& ctx) {
  const KernelInput& x = required_input(ctx, 0, "input");
  const KernelInput& c = required_input(ctx, 1, "condition");
  const size_t es = elem_size(ctx, x.dtype);
  if (c.dtype != DType::Bool) ctx.fail("input 'condition' must be bool, got " + dtype_name(c.dtype));
  if (c.shape.size() != 1) ctx.fail("input 'condition' must be 1-D, got shape " + shape_string(c.shape));
  const Tensor& cond = ctx.constant_input(1);  // fails naming the node when the condition is a run-time value
  const auto rank = static_cast<int64_t>(x.shape.size());
  const bool has_axis = ctx.node.has_attr("axis");
  int64_t outer = 1, len = numel_of(x.shape), inner = 1;
  std::vector<int64_t> out_shape;
  int64_t axis = 0;
  if (has_axis) {
    axis = normalize_axis(ctx, ctx.node.attr_int("axis", 0), rank);
    len = x.shape[axis];
    for (int64_t d = 0; d < axis; ++d) outer *= x.shape[d];
    for (int64_t d = axis + 1; d < rank; ++d) inner *= x.shape[d];
  }
  if (c.shape[0] > len)
    ctx.fail("input 'condition' has " + std::to_string(c.shape[0]) + " entries, more than the " + std::to_string(len) +
             (has_axis ? " along axis " + std::to_string(axis) : std::string(" of the flattened input")));
  std::vector<int64_t> kept;
  const auto* cv = static_cast<const uint8_t*>(cond.data);
  for (int64_t i = 0; i < c.shape[0]; ++i)
    if (cv[i]) kept.push_back(i);
  if (has_axis) {
    out_shape = x.shape;
    out_shape[axis] = static_cast<int64_t>(kept.size());
  } else {
    out_shape = {static_cast<int64_t>(kept.size())};
  }
  set_output(ctx, 0, x.dtype, out_shape);
  return std::make_unique<CompressKernel>(outer, len, inner, std::move(kept), es);
}

// ---------------------------------------------------------------------------------------------------------
// Permuting copies: out[i0..] = in[sum i_k * strides_k], output walked in order.

class PermuteKernel final : public Kernel {
 public:
  PermuteKernel(std::vector<int64_t> dims, std::vector<int64_t> strides, size_t es)
      : dims_(std::move(dims)), strides_(std::move(strides)), es_(es) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const auto* src = static_cast<const std::byte*>(in[0]->data);
    auto* dst = static_cast<std::byte*>(out[0]->data);
    const int64_t n = numel_of(dims_);
    const size_t r = dims_.size();
    std::vector<int64_t> idx(r, 0);
    int64_t off = 0;
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(dst + i * es_, src + off * static_cast<int64_t>(es_), es_);
      for (size_t q = r; q-- > 0;) {
        off += strides_[q];
        if (++idx[q] < dims_[q]) break;
        off -= strides_[q] * dims_[q];
        idx[q] = 0;
      }
    }
  }

 private:
  std::vector<int64_t> dims_, strides_;
  size_t es_;
};

// in viewed as `view` (contiguous), transposed by perm, is the output.
std::unique_ptr<Kernel> permute_view(size_t es, const std::vector<int64_t>& view, const std::vector<int64_t>& perm) {
  const std::vector<int64_t> st = contiguous_strides(view);
  std::vector<int64_t> dims, strides;
  for (int64_t p : perm) {
    dims.push_back(view[static_cast<size_t>(p)]);
    strides.push_back(st[static_cast<size_t>(p)]);
  }
  return std::make_unique<PermuteKernel>(std::move(dims), std::move(strides), es);
}

int64_t blocksize(const PrepareContext& ctx) {
  if (!ctx.node.has_attr("blocksize")) ctx.fail("attribute 'blocksize' is required");
  const int64_t b = ctx.node.attr_int("blocksize", 0);
  if (b < 1) ctx.fail("blocksize must be positive, got " + std::to_string(b));
  return b;
}

std::unique_ptr<Kernel> make_depth_to_space(PrepareContext& ctx) {
  const KernelInput& x = required_input(ctx, 0, "input");
  const size_t es = elem_size(ctx, x.dtype);
  if (x.shape.size() != 4) ctx.fail("input must be 4-D [N, C, H, W], got " + shape_string(x.shape));
  const int64_t b = blocksize(ctx), N = x.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3];
  if (C % (b * b) != 0)
    ctx.fail("channels " + std::to_string(C) + " are not divisible by blocksize^2 = " + std::to_string(b * b));
  const int64_t c = C / (b * b);
  const std::string mode = ctx.opset >= 11 ? ctx.node.attr_string("mode", "DCR") : "DCR";
  set_output(ctx, 0, x.dtype, {N, c, H * b, W * b});
  if (mode == "DCR") return permute_view(es, {N, b, b, c, H, W}, {0, 3, 4, 1, 5, 2});
  if (mode == "CRD") return permute_view(es, {N, c, b, b, H, W}, {0, 1, 4, 2, 5, 3});
  ctx.fail("mode must be DCR or CRD, got '" + mode + "'");
}

std::unique_ptr<Kernel> make_space_to_depth(PrepareContext& ctx) {
  const KernelInput& x = required_input(ctx, 0, "input");
  const size_t es = elem_size(ctx, x.dtype);
  if (x.shape.size() != 4) ctx.fail("input must be 4-D [N, C, H, W], got " + shape_string(x.shape));
  const int64_t b = blocksize(ctx), N = x.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3];
  if (H % b != 0 || W % b != 0)
    ctx.fail("height and width " + shape_string(x.shape) + " are not divisible by blocksize " + std::to_string(b));
  set_output(ctx, 0, x.dtype, {N, C * b * b, H / b, W / b});
  return permute_view(es, {N, C, H / b, b, W / b, b}, {0, 3, 5, 1, 2, 4});
}

// ---------------------------------------------------------------------------------------------------------
// Trilu: zero the elements above (upper=0) or below (upper=1) diagonal k of the last two dims. Bytes only.

class TriluKernel final : public Kernel {
 public:
  TriluKernel(int64_t batch, int64_t n, int64_t m, int64_t k, bool upper, size_t es)
      : batch_(batch), n_(n), m_(m), k_(k), upper_(upper), es_(es) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const auto* x = static_cast<const std::byte*>(in[0]->data);
    auto* y = static_cast<std::byte*>(out[0]->data);
    for (int64_t b = 0; b < batch_; ++b)
      for (int64_t i = 0; i < n_; ++i)
        for (int64_t j = 0; j < m_; ++j) {
          const int64_t at = ((b * n_ + i) * m_ + j) * static_cast<int64_t>(es_);
          const bool keep = upper_ ? j - i >= k_ : j - i <= k_;
          if (keep) std::memcpy(y + at, x + at, es_);
          else std::memset(y + at, 0, es_);
        }
  }

 private:
  int64_t batch_, n_, m_, k_;
  bool upper_;
  size_t es_;
};

std::unique_ptr<Kernel> make_trilu(PrepareContext& ctx) {
  const KernelInput& x = required_input(ctx, 0, "input");
  const size_t es = elem_size(ctx, x.dtype);
  if (x.shape.size() < 2) ctx.fail("input must have rank >= 2, got " + shape_string(x.shape));
  int64_t k = 0;
  if (has_input(ctx, 1)) {
    const std::vector<int64_t> kv = ints_of(ctx, ctx.constant_input(1), "k");
    if (kv.size() != 1) ctx.fail("k must hold one value");
    k = kv[0];
  }
  const size_t r = x.shape.size();
  const int64_t n = x.shape[r - 2], m = x.shape[r - 1];
  set_output(ctx, 0, x.dtype, x.shape);
  return std::make_unique<TriluKernel>(n * m != 0 ? numel_of(x.shape) / (n * m) : 0, n, m, k,
                                       ctx.node.attr_int("upper", 1) != 0, es);
}

// ---- Pad (constant mode) ---------------------------------------------------------------------------------
// The output is filled with the constant, then the kept part of the input is copied in as contiguous runs
// of its innermost dim. Negative pads crop.

class PadKernel final : public Kernel {
 public:
  PadKernel(std::vector<int64_t> in_shape, std::vector<int64_t> out_shape, std::vector<int64_t> begins,
            std::vector<int64_t> ends, size_t es, std::vector<std::byte> attr_value)
      : in_(std::move(in_shape)), out_(std::move(out_shape)), es_(es), attr_value_(std::move(attr_value)) {
    const size_t r = in_.size();
    lo_.resize(r);
    len_.resize(r);
    dst_.resize(r);
    for (size_t d = 0; d < r; ++d) {
      lo_[d] = std::max<int64_t>(0, -begins[d]);
      len_[d] = std::max<int64_t>(0, in_[d] - std::max<int64_t>(0, -ends[d]) - lo_[d]);
      dst_[d] = std::max<int64_t>(0, begins[d]);
    }
    in_strides_ = contiguous_strides(in_);
    out_strides_ = contiguous_strides(out_);
  }

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    auto* y = static_cast<std::byte*>(out[0]->data);
    const auto* x = static_cast<const std::byte*>(in[0]->data);
    const int64_t n = out[0]->numel();
    // The constant: input 2 when given (a scalar of data's dtype), the opset 2-10 attribute, else zero.
    std::byte value[16] = {};
    if (!attr_value_.empty())
      std::memcpy(value, attr_value_.data(), es_);
    else if (in.size() > 2 && in[2] && in[2]->numel() > 0)
      std::memcpy(value, in[2]->data, es_);
    if (std::all_of(value, value + es_, [](std::byte b) { return b == std::byte{0}; })) {
      std::memset(y, 0, static_cast<size_t>(n) * es_);
    } else {
      for (int64_t i = 0; i < n; ++i) std::memcpy(y + i * es_, value, es_);
    }
    const size_t r = in_.size();
    if (r == 0) {
      if (n) std::memcpy(y, x, es_);
      return;
    }
    for (size_t d = 0; d < r; ++d)
      if (len_[d] == 0) return;
    // Odometer over the kept region's outer dims; each step copies one innermost run.
    std::vector<int64_t> c(r, 0);
    const size_t run_bytes = static_cast<size_t>(len_[r - 1]) * es_;
    while (true) {
      int64_t src = 0, dst = 0;
      for (size_t d = 0; d < r; ++d) {
        src += (lo_[d] + c[d]) * in_strides_[d];
        dst += (dst_[d] + c[d]) * out_strides_[d];
      }
      std::memcpy(y + dst * es_, x + src * es_, run_bytes);
      size_t d = r - 1;
      while (d > 0) {
        if (++c[d - 1] < len_[d - 1]) break;
        c[d - 1] = 0;
        --d;
      }
      if (d == 0) return;
    }
  }

 private:
  std::vector<int64_t> in_, out_, lo_, len_, dst_, in_strides_, out_strides_;
  size_t es_;
  std::vector<std::byte> attr_value_;
};

std::unique_ptr<Kernel> make_pad(PrepareContext& ctx) {
  const KernelInput& data = required_input(ctx, 0, "data");
  const size_t es = elem_size(ctx, data.dtype);
  if (es > 16) ctx.fail("elements of " + std::to_string(es) + " bytes are not supported");
  const std::string mode = ctx.node.attr_string("mode", "constant");
  if (mode != "constant") ctx.fail("mode '" + mode + "' is not supported (only 'constant')");
  std::vector<int64_t> pads;
  std::vector<std::byte> attr_value;  // opset 2-10: the constant is the float attribute `value`
  if (ctx.opset < 11) {
    pads = ctx.node.attr_ints("pads");
    const float v = ctx.node.attr_float("value", 0.0f);
    attr_value.resize(es);
    if (data.dtype == DType::Float32) {
      std::memcpy(attr_value.data(), &v, es);
    } else if (data.dtype == DType::Float64) {
      const double dv = v;
      std::memcpy(attr_value.data(), &dv, es);
    } else if (v != 0.0f) {
      ctx.fail("a non-zero value attribute is supported for float32 and float64 only, the data is " +
               dtype_name(data.dtype));
    }
  } else {
    required_input(ctx, 1, "pads");
    const Tensor& pads_t = ctx.constant_input(1);
    if (pads_t.dtype != DType::Int64) ctx.fail("pads must be int64, got " + dtype_name(pads_t.dtype));
    pads.assign(pads_t.span<int64_t>().begin(), pads_t.span<int64_t>().end());
  }
  if (ctx.opset >= 11 && has_input(ctx, 2)) {
    const KernelInput& v = ctx.inputs[2];
    if (v.dtype != data.dtype)
      ctx.fail("constant_value must have data's dtype " + dtype_name(data.dtype) + ", got " + dtype_name(v.dtype));
    if (numel_of(v.shape) != 1) ctx.fail("constant_value must hold one value, got shape " + shape_string(v.shape));
  }
  const auto r = static_cast<int64_t>(data.shape.size());
  std::vector<int64_t> axes;
  if (ctx.opset >= 11 && has_input(ctx, 3)) {
    if (ctx.opset < 18) ctx.fail("the axes input exists from opset 18, the model has " + std::to_string(ctx.opset));
    const Tensor& a = ctx.constant_input(3);
    if (a.dtype == DType::Int64)
      axes.assign(a.span<int64_t>().begin(), a.span<int64_t>().end());
    else if (a.dtype == DType::Int32)
      axes.assign(a.span<int32_t>().begin(), a.span<int32_t>().end());
    else
      ctx.fail("axes must be int32 or int64, got " + dtype_name(a.dtype));
  } else {
    for (int64_t d = 0; d < r; ++d) axes.push_back(d);
  }
  const auto na = static_cast<int64_t>(axes.size());
  if (static_cast<int64_t>(pads.size()) != 2 * na)
    ctx.fail("pads has " + std::to_string(pads.size()) + " values, expected " + std::to_string(2 * na) +
             " (begin and end for each of " + std::to_string(na) + " axes)");
  std::vector<int64_t> begins(r, 0), ends(r, 0);
  std::vector<bool> seen(r, false);
  for (int64_t i = 0; i < na; ++i) {
    const int64_t a = normalize_axis(ctx, axes[i], r);
    if (seen[a]) ctx.fail("axis " + std::to_string(axes[i]) + " is repeated in axes");
    seen[a] = true;
    begins[a] = pads[i];
    ends[a] = pads[i + na];
  }
  std::vector<int64_t> out_shape(r);
  for (int64_t d = 0; d < r; ++d) {
    out_shape[d] = data.shape[d] + begins[d] + ends[d];
    if (out_shape[d] < 0)
      ctx.fail("pads " + shape_string(pads) + " crop more than the " + std::to_string(data.shape[d]) +
               " elements of axis " + std::to_string(d));
  }
  ctx.outputs.at(0) = {data.dtype, out_shape};
  return std::make_unique<PadKernel>(data.shape, out_shape, begins, ends, es, std::move(attr_value));
}

}  // namespace

void register_cpu_shape(KernelRegistry& r) {
  constexpr int64_t kLast = 1 << 30;
  auto add = [&r](const char* op, int64_t since, KernelFactory f, bool shape_only = false) {
    KernelDef d{"", op, since, kLast, Device::CPU, {}, std::move(f)};
    d.shape_only = shape_only;
    r.add(std::move(d));
  };
  add("Reshape", 5, make_reshape);
  add("Flatten", 1, make_flatten);
  add("Squeeze", 1, make_squeeze);
  add("Unsqueeze", 1, make_unsqueeze);
  add("Shape", 1, make_shape, true);
  add("Size", 1, make_size, true);
  add("Constant", 1, make_constant);
  add("ConstantOfShape", 9, make_constant_of_shape);
  add("Range", 11, make_range);
  add("Transpose", 1, make_transpose);
  add("Slice", 1, make_slice);
  add("Expand", 8, make_expand);
  add("Tile", 6, make_tile);
  add("Concat", 1, make_concat);
  add("Split", 1, make_split);
  add("Gather", 1, make_gather);
  add("CenterCropPad", 18, make_center_crop_pad);
  add("Compress", 9, make_compress);
  cpu::add(r, "DepthToSpace", 1, {}, make_depth_to_space);
  cpu::add(r, "SpaceToDepth", 1, {}, make_space_to_depth);
  cpu::add(r, "Trilu", 14, {}, make_trilu);
  // Pads (and the constant) are attributes before opset 11 and inputs from then on; one factory reads both.
  cpu::add(r, "Pad", 2, {}, make_pad);
}

}  // namespace onnxtrain
