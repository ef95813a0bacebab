// Shape and data-movement ops on CUDA (the shape family: executor/cpu/shape.cpp, gradients/rules/shape.cpp).
//
// Transpose, Slice, Expand, Tile, Concat, Split, Pad, DepthToSpace, SpaceToDepth and Trilu move elements
// without computing: every output element is one input element or a fill value. At plan time the op layer
// (executor/ops/shape.h) checks the node and builds, from the same geometry the CPU kernels copy by, each
// output's gather map (the element each output element reads, or the fill); the device then runs one gather per
// output. Maps are int32 where the inputs allow.
// Reshape, Flatten, Squeeze and Unsqueeze are views (or one device copy); Gather reads its indices on the
// device. Shape, Size, Constant, ConstantOfShape and Range only ever run at plan time (see fold_only).
#include <cstring>
#include <limits>
#include <memory>

#include "executor/cuda/common.h"
#include "executor/cuda/device_util.cuh"
#include "executor/ops/shape.h"
#include "graph/error.h"

namespace onnxtrain::cuda {
namespace {

constexpr int kMaxSources = 32;

template <class E> struct Sources {
  const E* p[kMaxSources];
  int64_t base[kMaxSources];
  int n;
};

template <class E, class I>
__global__ void map_gather_kernel(int64_t count, const I* map, Sources<E> src, const E* fill, E* out) {
  for (int64_t i = global_index(); i < count; i += grid_stride()) {
    const int64_t m = static_cast<int64_t>(map[i]);
    if (m < 0) {
      out[i] = fill ? *fill : E(0);
      continue;
    }
    int k = 0;
    while (k + 1 < src.n && m >= src.base[k + 1]) ++k;
    out[i] = src.p[k][m - src.base[k]];
  }
}

// Element types by size: the gather copies bits, so any dtype of that size moves as this one.
template <size_t S> struct Bits;
template <> struct Bits<1> { using type = uint8_t; };
template <> struct Bits<2> { using type = uint16_t; };
template <> struct Bits<4> { using type = uint32_t; };
template <> struct Bits<8> { using type = uint64_t; };

template <class E, class I> class MapGatherKernel final : public Kernel {
 public:
  MapGatherKernel(std::vector<Tensor> maps, std::vector<size_t> data, std::vector<int64_t> bases, int fill_input)
      : maps_(std::move(maps)), data_(std::move(data)), bases_(std::move(bases)), fill_input_(fill_input) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    Sources<E> src{};
    src.n = static_cast<int>(data_.size());
    for (size_t k = 0; k < data_.size(); ++k) {
      src.p[k] = in[data_[k]]->ptr<E>();
      src.base[k] = bases_[k];
    }
    const E* fill = fill_input_ >= 0 && static_cast<size_t>(fill_input_) < in.size() && in[fill_input_]
                        ? in[fill_input_]->ptr<E>()
                        : nullptr;
    for (size_t o = 0; o < out.size(); ++o) {
      const int64_t n = out[o]->numel();
      if (n == 0) continue;
      map_gather_kernel<<<blocks_for(n), kBlock, 0, stream()>>>(n, maps_[o].ptr<I>(), src, fill, out[o]->ptr<E>());
      check_launch("gather-map kernel");
    }
  }

 private:
  std::vector<Tensor> maps_;  // device, one per output
  std::vector<size_t> data_;  // inputs the maps index, in order
  std::vector<int64_t> bases_;
  int fill_input_;
};

template <size_t S> std::unique_ptr<Kernel> gather_kernel_for(std::vector<Tensor> maps, bool wide, std::vector<size_t> data,
                                                              std::vector<int64_t> bases, int fill) {
  using E = typename Bits<S>::type;
  if (wide) return std::make_unique<MapGatherKernel<E, int64_t>>(std::move(maps), std::move(data), std::move(bases), fill);
  return std::make_unique<MapGatherKernel<E, int32_t>>(std::move(maps), std::move(data), std::move(bases), fill);
}

// The op layer's maps (checks, outputs, geometry and maps: executor/ops/shape.h), narrowed to int32 when every
// index fits, uploaded once.
std::unique_ptr<Kernel> gather_by_maps(PrepareContext& ctx, ops::GatherMaps g) {
  if (g.data.size() > static_cast<size_t>(kMaxSources))
    ctx.fail("the CUDA kernel takes at most " + std::to_string(kMaxSources) + " data inputs, got " +
             std::to_string(g.data.size()));
  const bool wide = g.total >= std::numeric_limits<int32_t>::max();
  std::vector<Tensor> maps;
  for (size_t o = 0; o < g.maps.size(); ++o) {
    const std::vector<int64_t>& m = g.maps[o];
    const std::vector<int64_t>& shape = ctx.outputs[o].shape;
    if (wide) {
      maps.push_back(Tensor::from_vector<int64_t>(shape, m).to(Device::CUDA));
    } else {
      Tensor narrow = Tensor::empty(DType::Int32, shape);
      int32_t* q = narrow.ptr<int32_t>();
      for (size_t j = 0; j < m.size(); ++j) q[j] = static_cast<int32_t>(m[j]);
      maps.push_back(narrow.to(Device::CUDA));
    }
  }
  const int fill = g.fill_input;
  switch (dtype_size(ctx.outputs[0].dtype)) {
    case 1: return gather_kernel_for<1>(std::move(maps), wide, std::move(g.data), std::move(g.bases), fill);
    case 2: return gather_kernel_for<2>(std::move(maps), wide, std::move(g.data), std::move(g.bases), fill);
    case 4: return gather_kernel_for<4>(std::move(maps), wide, std::move(g.data), std::move(g.bases), fill);
    case 8: return gather_kernel_for<8>(std::move(maps), wide, std::move(g.data), std::move(g.bases), fill);
    default: ctx.fail("elements of " + std::to_string(dtype_size(ctx.outputs[0].dtype)) + " bytes are not supported on CUDA");
  }
}

template <ops::GatherMaps (*Maps)(PrepareContext&)> std::unique_ptr<Kernel> make_mapped(PrepareContext& ctx) {
  return gather_by_maps(ctx, Maps(ctx));
}

// Pad's fill is its constant_value input from opset 11; before that an attribute, of which the gather takes
// only the zero default (the CPU kernel accepts others for float data).
std::unique_ptr<Kernel> make_pad(PrepareContext& ctx) {
  if (ctx.opset < 11 && ctx.node.attr_float("value", 0.0f) != 0.0f)
    ctx.fail("on CUDA, Pad before opset 11 supports only value = 0 (use opset 11+, where it is an input)");
  return gather_by_maps(ctx, ops::pad_gather_maps(ctx));
}

template <void (*Prepare)(PrepareContext&)> std::unique_ptr<Kernel> make_view(PrepareContext& ctx) {
  Prepare(ctx);
  return std::make_unique<DeviceCopyKernel>();
}

// Ops whose inputs are always known at plan time (or whose output depends only on shapes): the plan folds
// them on the host and uploads the result, so their CUDA def exists for lookup and never runs. If a model
// makes an input unknown, the op layer reports it (ctx.constant_input); the run() guard is a last line of defence.
class FoldOnlyKernel final : public Kernel {
 public:
  explicit FoldOnlyKernel(std::string where) : where_(std::move(where)) {}
  void run(std::span<const Tensor* const>, std::span<Tensor* const>) override {
    fail(where_, "this op runs only at plan time on CUDA, but its inputs were not known when the plan was built");
  }

 private:
  std::string where_;
};

// Prepare checks the node and sets its output (the value it returns is the CPU kernel's to write).
template <auto Prepare> std::unique_ptr<Kernel> fold_only(PrepareContext& ctx) {
  Prepare(ctx);
  return std::make_unique<FoldOnlyKernel>(ctx.node.describe());
}

// Gather along an axis with indices read on the device. Out-of-range indices (which the CPU kernel rejects
// with an error) cannot throw from the device; they produce zeros.
template <class E, class I>
__global__ void gather_kernel(int64_t count, int64_t m, int64_t n, int64_t inner, const E* x, const I* idx, E* y) {
  for (int64_t i = global_index(); i < count; i += grid_stride()) {
    const int64_t o = i / (m * inner), rem = i % (m * inner), j = rem / inner, k = rem % inner;
    int64_t v = static_cast<int64_t>(idx[j]);
    if (v < 0) v += n;
    y[i] = v < 0 || v >= n ? E(0) : x[(o * n + v) * inner + k];
  }
}

template <class E, class I> class GatherKernel final : public Kernel {
 public:
  GatherKernel(int64_t n, int64_t inner) : n_(n), inner_(inner) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const int64_t count = out[0]->numel(), m = in[1]->numel();
    if (count == 0) return;
    gather_kernel<<<blocks_for(count), kBlock, 0, stream()>>>(count, m, n_, inner_, in[0]->ptr<E>(), in[1]->ptr<I>(),
                                                               out[0]->ptr<E>());
    check_launch("Gather kernel");
  }

 private:
  int64_t n_, inner_;
};

template <size_t S> std::unique_ptr<Kernel> gather_for(DType idx, int64_t n, int64_t inner) {
  using E = typename Bits<S>::type;
  if (idx == DType::Int32) return std::make_unique<GatherKernel<E, int32_t>>(n, inner);
  return std::make_unique<GatherKernel<E, int64_t>>(n, inner);
}

std::unique_ptr<Kernel> make_gather(PrepareContext& ctx) {
  const ops::GatherGeometry g = ops::prepare_gather(ctx);
  const int64_t n = g.n, inner = g.inner;
  const DType idx = ctx.inputs[1].dtype;
  switch (dtype_size(ctx.inputs[0].dtype)) {
    case 1: return gather_for<1>(idx, n, inner);
    case 2: return gather_for<2>(idx, n, inner);
    case 4: return gather_for<4>(idx, n, inner);
    case 8: return gather_for<8>(idx, n, inner);
    default: ctx.fail("elements of " + std::to_string(dtype_size(ctx.inputs[0].dtype)) + " bytes are not supported on CUDA");
  }
}

}  // namespace

void register_cuda_shape(KernelRegistry& r) {
  twin(r, "Transpose", make_mapped<ops::transpose_gather_maps>);
  twin(r, "Slice", make_mapped<ops::slice_gather_maps>);
  twin(r, "Expand", make_mapped<ops::expand_gather_maps>);
  twin(r, "Tile", make_mapped<ops::tile_gather_maps>);
  twin(r, "Concat", make_mapped<ops::concat_gather_maps>);
  twin(r, "Split", make_mapped<ops::split_gather_maps>);
  twin(r, "DepthToSpace", make_mapped<ops::depth_to_space_gather_maps>);
  twin(r, "SpaceToDepth", make_mapped<ops::space_to_depth_gather_maps>);
  twin(r, "Trilu", make_mapped<ops::trilu_gather_maps>);
  twin(r, "Pad", make_pad);
  twin(r, "Reshape", make_view<ops::prepare_reshape>);
  twin(r, "Flatten", make_view<ops::prepare_flatten>);
  twin(r, "Squeeze", make_view<ops::prepare_squeeze>);
  twin(r, "Unsqueeze", make_view<ops::prepare_unsqueeze>);
  twin(r, "Shape", fold_only<ops::prepare_shape>);
  twin(r, "Size", fold_only<ops::prepare_size>);
  twin(r, "Constant", fold_only<ops::prepare_constant>);
  twin(r, "ConstantOfShape", fold_only<ops::prepare_constant_of_shape>);
  twin(r, "Range", fold_only<ops::prepare_range>);
  twin(r, "Gather", make_gather);
}

}  // namespace onnxtrain::cuda
