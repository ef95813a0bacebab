// Native kernels of two fused gradient ops of the onnxtrain domain (bodies: gradients/fused_gather.cpp).
//
// GatherGrad(dY, indices, shape) -> dX, with Gather's axis: the rows of dY added into zeros of `shape` at the
// gathered positions. The embedding gradient of a transformer, where indices repeat (common tokens) and dX is
// the size of the vocabulary. Indices are grouped by destination row (a counting sort, stable, in buffers
// sized at plan time), then every destination row is written by exactly one thread: zeroed and summed in
// index order. That parallelises without atomics and gives the serial result bit for bit, whatever the
// thread count.
//
// SumToShape(dY, shape) -> dX: dY summed back to `shape` after numpy broadcasting (leading axes and axes
// where shape has 1). The axes are found at plan time, when the shape is known, and the summation is the
// ReduceSum kernel's; an unbroadcast gradient is a view.
#include <algorithm>
#include <memory>

#include "executor/cpu/kernel_util.h"
#include "executor/kernel.h"
#include "executor/ops/gather_grad.h"
#include "graph/error.h"

namespace onnxtrain {
namespace {

using cpu::kCheapGrain;

std::string dims_text(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

template <class T, class I> class GatherGradKernel final : public Kernel {
 public:
  GatherGradKernel(std::string where, int64_t outer, int64_t n, int64_t m, int64_t inner)
      : where_(std::move(where)), outer_(outer), n_(n), m_(m), inner_(inner), start_(n + 1), order_(m) {}

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const T* dy = in[0]->ptr<T>();
    const I* idx = in[1]->ptr<I>();
    T* dx = out[0]->ptr<T>();
    // Counting sort of the index positions by destination row; start_[r]..start_[r+1] are row r's sources.
    std::fill(start_.begin(), start_.end(), 0);
    for (int64_t j = 0; j < m_; ++j) {
      const int64_t v = static_cast<int64_t>(idx[j]);
      if (v < -n_ || v >= n_)
        fail(where_, "index " + std::to_string(v) + " (at position " + std::to_string(j) +
                         ") is out of range for an axis of size " + std::to_string(n_));
      ++start_[(v < 0 ? v + n_ : v) + 1];
    }
    for (int64_t r = 0; r < n_; ++r) start_[r + 1] += start_[r];
    // Filling advances start_[r] to the end of row r, so afterwards row r spans [start_[r-1], start_[r]).
    for (int64_t j = 0; j < m_; ++j) {
      int64_t v = static_cast<int64_t>(idx[j]);
      if (v < 0) v += n_;
      order_[start_[v]++] = j;
    }
    const int64_t rows = outer_ * n_;
    const bool par = (outer_ * m_ + rows) * inner_ >= kCheapGrain;
    cpu::parallel_for(rows, par, [&](int64_t row) {
      const int64_t o = row / n_, r = row % n_;
      T* dst = dx + row * inner_;
      std::fill(dst, dst + inner_, T(0));
      const int64_t begin = r == 0 ? 0 : start_[r - 1];
      const T* base = dy + o * m_ * inner_;
      for (int64_t k = begin; k < start_[r]; ++k) {
        const T* src = base + order_[k] * inner_;
        for (int64_t c = 0; c < inner_; ++c) dst[c] += src[c];
      }
    });
  }

 private:
  std::string where_;
  int64_t outer_, n_, m_, inner_;
  std::vector<int64_t> start_, order_;  // sized at plan time: run() never allocates
};

std::unique_ptr<Kernel> make_gather_grad(PrepareContext& ctx) {
  const ops::GatherGradGeometry g = ops::prepare_gather_grad(ctx);
  const KernelInput& dy = ctx.inputs[0];
  const KernelInput& ind = ctx.inputs[1];
  std::unique_ptr<Kernel> k;
  const std::string where = ctx.node.describe();
  cpu::dispatch<float, double>(dy.dtype, [&](auto t) {
    using T = typename decltype(t)::type;
    if (ind.dtype == DType::Int64) k = std::make_unique<GatherGradKernel<T, int64_t>>(where, g.outer, g.n, g.m, g.inner);
    if (ind.dtype == DType::Int32) k = std::make_unique<GatherGradKernel<T, int32_t>>(where, g.outer, g.n, g.m, g.inner);
  });
  if (!k) ctx.fail("unsupported types: dY " + dtype_name(dy.dtype) + " (float32, float64), indices " +
                   dtype_name(ind.dtype) + " (int32, int64)");
  return k;
}

// The ReduceSum kernel over the broadcast axes (keepdims, so its output has dX's bytes), run on dX's memory.
class SumToShapeKernel final : public Kernel {
 public:
  SumToShapeKernel(std::unique_ptr<Node> node, Tensor axes, std::vector<int64_t> kept_shape, DType t)
      : node_(std::move(node)), axes_(std::move(axes)), view_(Tensor::view(t, std::move(kept_shape), nullptr)) {}
  void bind(std::unique_ptr<Kernel> reduce) { reduce_ = std::move(reduce); }
  const Node& node() const { return *node_; }
  const Tensor& axes() const { return axes_; }

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    view_.data = out[0]->data;
    const Tensor* ins[2] = {in[0], &axes_};
    Tensor* outs[1] = {&view_};
    reduce_->run(ins, outs);
  }

 private:
  std::unique_ptr<Node> node_;  // the ReduceSum node the inner kernel was prepared for
  Tensor axes_;
  Tensor view_;  // dX with ReduceSum's keepdims shape
  std::unique_ptr<Kernel> reduce_;
};

std::unique_ptr<Kernel> make_sum_to_shape(PrepareContext& ctx) {
  const ops::SumToShapeAxes s = ops::prepare_sum_to_shape(ctx);
  const KernelInput& dy = ctx.inputs[0];
  if (dy.dtype != DType::Float32 && dy.dtype != DType::Float64)
    ctx.fail("unsupported dtype " + dtype_name(dy.dtype) + " for dY (float32, float64)");
  const std::vector<int64_t>& axes = s.axes;
  const std::vector<int64_t>& kept = s.kept;
  if (axes.empty()) return std::make_unique<cpu::CopyKernel>();

  auto node = std::make_unique<Node>();
  node->name = ctx.node.name;
  node->op_type = "ReduceSum";
  node->inputs = {ctx.node.inputs[0], ctx.node.name + "/axes"};
  node->outputs = {ctx.node.outputs.empty() ? std::string() : ctx.node.outputs[0]};
  node->attributes["keepdims"] = int64_t{1};
  constexpr int64_t kReduceSumOpset = 13;  // axes as an input
  const KernelDef* def = default_kernels().find("", "ReduceSum", kReduceSumOpset, Device::CPU, dy.dtype);
  if (!def) ctx.fail("no CPU ReduceSum kernel for " + dtype_name(dy.dtype));
  auto k = std::make_unique<SumToShapeKernel>(
      std::move(node), Tensor::from_vector<int64_t>({static_cast<int64_t>(axes.size())}, axes), kept, dy.dtype);
  PrepareContext inner{k->node(), kReduceSumOpset, Device::CPU,
                       {dy, KernelInput{DType::Int64, {static_cast<int64_t>(axes.size())}, &k->axes()}}, {}};
  inner.outputs.resize(1);
  k->bind(def->factory(inner));
  if (inner.outputs[0].shape != kept) ctx.fail("internal: ReduceSum gave " + dims_text(inner.outputs[0].shape));
  return k;
}

}  // namespace

void register_cpu_gather_grad(KernelRegistry& r) {
  const std::vector<DType> flt = {DType::Float32, DType::Float64};
  cpu::add(r, "onnxtrain", "GatherGrad", 1, flt, make_gather_grad);
  cpu::add(r, "onnxtrain", "SumToShape", 1, flt, make_sum_to_shape);
}

}  // namespace onnxtrain
