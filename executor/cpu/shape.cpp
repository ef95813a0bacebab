// Shape and data-movement ops on the CPU. They never look at element values, so every kernel here works on
// raw bytes of any fixed-size dtype. Each op's checks, output and geometry are the op layer's
// (executor/ops/shape.h), shared with the CUDA twins; this file holds the runners. Everything that only
// rearranges memory (Transpose, Slice, Expand, Tile) is one StridedCopy of the op layer's view: the output
// walked in order, the input through per-dim strides.
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

// The op layer's view (executor/ops/shape.h) as one StridedCopy; it has checked the rank against StridedCopy's 16.
std::unique_ptr<Kernel> strided_kernel(const PrepareContext& ctx, const ops::StridedView& v) {
  return std::make_unique<StridedCopyKernel>(StridedCopy(v.dims, v.strides, v.base, elem_size(ctx, ctx.inputs[0].dtype)));
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

// The checks, the output and the view are the op layer's (executor/ops/shape.h).
std::unique_ptr<Kernel> make_transpose(PrepareContext& ctx) { return strided_kernel(ctx, ops::prepare_transpose(ctx)); }
std::unique_ptr<Kernel> make_slice(PrepareContext& ctx) { return strided_kernel(ctx, ops::prepare_slice(ctx)); }
std::unique_ptr<Kernel> make_expand(PrepareContext& ctx) { return strided_kernel(ctx, ops::prepare_expand(ctx)); }
std::unique_ptr<Kernel> make_tile(PrepareContext& ctx) { return strided_kernel(ctx, ops::prepare_tile(ctx)); }

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

// The kernels take the op layer's chunks (executor/ops/shape.h) in bytes.
std::vector<int64_t> chunk_bytes(const PrepareContext& ctx, const ops::AxisChunks& c) {
  const auto es = static_cast<int64_t>(elem_size(ctx, ctx.inputs[0].dtype));
  std::vector<int64_t> bytes;
  for (int64_t k : c.chunks) bytes.push_back(k * es);
  return bytes;
}

std::unique_ptr<Kernel> make_concat(PrepareContext& ctx) {
  const ops::AxisChunks c = ops::prepare_concat(ctx);
  return std::make_unique<ConcatKernel>(c.outer, chunk_bytes(ctx, c));
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
  const ops::AxisChunks c = ops::prepare_split(ctx);
  return std::make_unique<SplitKernel>(c.outer, chunk_bytes(ctx, c));
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

// The checks, the output and the permuted view are the op layer's (executor/ops/shape.h).
std::unique_ptr<Kernel> permute_kernel(const PrepareContext& ctx, ops::StridedView v) {
  return std::make_unique<PermuteKernel>(std::move(v.dims), std::move(v.strides), elem_size(ctx, ctx.inputs[0].dtype));
}

std::unique_ptr<Kernel> make_depth_to_space(PrepareContext& ctx) {
  return permute_kernel(ctx, ops::prepare_depth_to_space(ctx));
}

std::unique_ptr<Kernel> make_space_to_depth(PrepareContext& ctx) {
  return permute_kernel(ctx, ops::prepare_space_to_depth(ctx));
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
          const bool keep = ops::trilu_keeps(i, j, k_, upper_);
          if (keep) std::memcpy(y + at, x + at, es_);
          else std::memset(y + at, 0, es_);
        }
  }

 private:
  int64_t batch_, n_, m_, k_;
  bool upper_;
  size_t es_;
};

// The checks, the output and the geometry are the op layer's (executor/ops/shape.h), and so is which element is kept.
std::unique_ptr<Kernel> make_trilu(PrepareContext& ctx) {
  const ops::TriluGeometry g = ops::prepare_trilu(ctx);
  return std::make_unique<TriluKernel>(g.batch, g.n, g.m, g.k, g.upper, elem_size(ctx, ctx.inputs[0].dtype));
}

// ---- Pad (constant mode) ---------------------------------------------------------------------------------
// The output is filled with the constant, then the kept part of the input is copied in as contiguous runs
// of its innermost dim. Negative pads crop.

class PadKernel final : public Kernel {
 public:
  // The kept run of each axis is the op layer's pad_span (executor/ops/shape.h), which the CUDA maps use too.
  PadKernel(const ops::PadGeometry& g, size_t es)
      : in_(g.in_shape), out_(g.out_shape), es_(es), attr_value_(g.attr_value) {
    const size_t r = in_.size();
    lo_.resize(r);
    len_.resize(r);
    dst_.resize(r);
    for (size_t d = 0; d < r; ++d) {
      const ops::PadSpan span = ops::pad_span(in_[d], g.begins[d], g.ends[d]);
      lo_[d] = span.src;
      len_[d] = span.len;
      dst_[d] = span.dst;
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

// The checks, the output and the geometry are the op layer's (executor/ops/shape.h).
std::unique_ptr<Kernel> make_pad(PrepareContext& ctx) {
  const ops::PadGeometry g = ops::prepare_pad(ctx);
  return std::make_unique<PadKernel>(g, elem_size(ctx, ctx.inputs[0].dtype));
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
