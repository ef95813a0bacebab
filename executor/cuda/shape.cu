// Shape and data-movement ops on CUDA (the shape family: executor/cpu/shape.cpp, gradients/rules/shape.cpp).
//
// Transpose, Slice, Expand, Tile, Concat, Split, Pad, DepthToSpace, SpaceToDepth and Trilu move elements
// without computing: every output element is one input element or a fill value. At plan time their CPU
// kernel is run once on index tensors (1, 2, 3, ... in place of the data; 0 is the fill value), which yields
// each output's gather map; the device then runs one gather per output. The CPU kernel so defines the
// semantics of both backends, and the CPU tests cover them. Maps are int32 where the inputs allow.
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

// Which inputs carry data (the rest are plan-time parameters), and which one holds the fill value.
struct MovementSpec {
  bool all_inputs_are_data = false;  // Concat
  int fill_input = -1;               // Pad (opset 11+): constant_value
};

template <size_t S> std::unique_ptr<Kernel> gather_kernel_for(std::vector<Tensor> maps, bool wide, std::vector<size_t> data,
                                                              std::vector<int64_t> bases, int fill) {
  using E = typename Bits<S>::type;
  if (wide) return std::make_unique<MapGatherKernel<E, int64_t>>(std::move(maps), std::move(data), std::move(bases), fill);
  return std::make_unique<MapGatherKernel<E, int32_t>>(std::move(maps), std::move(data), std::move(bases), fill);
}

std::unique_ptr<Kernel> make_traced(PrepareContext& ctx, const KernelFactory& host, MovementSpec spec) {
  host_prepare(ctx, host);  // validation and the real output dtypes and shapes
  std::vector<size_t> data;
  for (size_t i = 0; i < ctx.inputs.size(); ++i)
    if ((i == 0 || spec.all_inputs_are_data) && ctx.inputs[i].present()) data.push_back(i);
  if (data.size() > static_cast<size_t>(kMaxSources))
    ctx.fail("the CUDA kernel takes at most " + std::to_string(kMaxSources) + " data inputs, got " +
             std::to_string(data.size()));

  // The same node, traced on the CPU with int64 index tensors as its data.
  PrepareContext t{ctx.node, ctx.opset, Device::CPU, ctx.inputs, {}};
  t.outputs.resize(ctx.outputs.size());
  std::vector<Tensor> iotas;
  iotas.reserve(data.size());
  std::vector<int64_t> bases;
  int64_t total = 0;
  for (size_t i : data) {
    Tensor idx = Tensor::empty(DType::Int64, ctx.inputs[i].shape);
    int64_t* p = idx.ptr<int64_t>();
    for (int64_t j = 0; j < idx.numel(); ++j) p[j] = total + j + 1;
    bases.push_back(total);
    total += idx.numel();
    t.inputs[i] = {DType::Int64, ctx.inputs[i].shape, nullptr};
    iotas.push_back(std::move(idx));
  }
  Tensor zero = Tensor::empty(DType::Int64, {});
  if (spec.fill_input >= 0 && static_cast<size_t>(spec.fill_input) < t.inputs.size() && t.inputs[spec.fill_input].present())
    t.inputs[spec.fill_input] = {DType::Int64, ctx.inputs[spec.fill_input].shape, &zero};
  std::unique_ptr<Kernel> tracer = host(t);
  std::vector<const Tensor*> ins(t.inputs.size(), nullptr);
  for (size_t k = 0; k < data.size(); ++k) ins[data[k]] = &iotas[k];
  for (size_t i = 0; i < t.inputs.size(); ++i) {
    if (ins[i] || !t.inputs[i].present()) continue;
    if (!t.inputs[i].value)
      ctx.fail("input " + std::to_string(i) + " ('" + ctx.node.inputs[i] +
               "') must be known at plan time for the CUDA kernel (it shapes the output)");
    ins[i] = t.inputs[i].value;
  }
  std::vector<Tensor> host_maps;
  std::vector<Tensor*> outs;
  for (const KernelOutput& o : t.outputs) host_maps.push_back(Tensor::empty(DType::Int64, o.shape));
  for (Tensor& m : host_maps) outs.push_back(&m);
  tracer->run(ins, outs);

  // 0 (fill) becomes -1, index k+1 becomes k; narrowed to int32 when every index fits.
  const bool wide = total >= std::numeric_limits<int32_t>::max();
  std::vector<Tensor> maps;
  for (Tensor& m : host_maps) {
    int64_t* p = m.ptr<int64_t>();
    if (wide) {
      for (int64_t j = 0; j < m.numel(); ++j) p[j] -= 1;
      maps.push_back(m.to(Device::CUDA));
    } else {
      Tensor narrow = Tensor::empty(DType::Int32, m.shape);
      int32_t* q = narrow.ptr<int32_t>();
      for (int64_t j = 0; j < m.numel(); ++j) q[j] = static_cast<int32_t>(p[j] - 1);
      maps.push_back(narrow.to(Device::CUDA));
    }
  }
  switch (dtype_size(ctx.outputs[0].dtype)) {
    case 1: return gather_kernel_for<1>(std::move(maps), wide, std::move(data), std::move(bases), spec.fill_input);
    case 2: return gather_kernel_for<2>(std::move(maps), wide, std::move(data), std::move(bases), spec.fill_input);
    case 4: return gather_kernel_for<4>(std::move(maps), wide, std::move(data), std::move(bases), spec.fill_input);
    case 8: return gather_kernel_for<8>(std::move(maps), wide, std::move(data), std::move(bases), spec.fill_input);
    default: ctx.fail("elements of " + std::to_string(dtype_size(ctx.outputs[0].dtype)) + " bytes are not supported on CUDA");
  }
}

CudaFactory traced(MovementSpec spec = {}) {
  return [spec](PrepareContext& ctx, const KernelFactory& host) { return make_traced(ctx, host, spec); };
}

// Pad's fill is its constant_value input from opset 11; before that an attribute, which only the zero
// default can be traced for (the CPU factory accepts others only for float data).
std::unique_ptr<Kernel> make_pad(PrepareContext& ctx, const KernelFactory& host) {
  if (ctx.opset < 11 && ctx.node.attr_float("value", 0.0f) != 0.0f)
    ctx.fail("on CUDA, Pad before opset 11 supports only value = 0 (use opset 11+, where it is an input)");
  return make_traced(ctx, host, MovementSpec{false, ctx.opset >= 11 ? 2 : -1});
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
  for (const char* op : {"Transpose", "Slice", "Expand", "Tile", "Split", "DepthToSpace", "SpaceToDepth", "Trilu"})
    twin(r, op, traced());
  twin(r, "Concat", traced(MovementSpec{true, -1}));
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
