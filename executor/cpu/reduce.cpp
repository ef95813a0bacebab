// Reductions (ReduceSum, ReduceMean, ... ReduceLogSumExp), ArgMax/ArgMin, CumSum and TopK on the CPU.
//
// At plan time the reduced axes are folded into the fewest dims: adjacent dims that are both reduced or both
// kept merge. Most real reductions then become one of three loops:
//   [outer, R]        row reduction over contiguous memory (softmax denominators, losses)
//   [R, inner]        column reduction (bias gradients: [batch, N] -> [N]), vectorised along inner
//   [outer, R, inner] a column reduction per outer slice
// Anything else (e.g. reducing axes 0 and 2 of 4) runs one strided pass over the input.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <type_traits>

#include "executor/cpu/kernel_util.h"
#include "executor/functors.h"
#include "executor/kernel.h"
#include "executor/ops/reduce.h"
#include "graph/error.h"

namespace onnxtrain {
namespace {

using RKind = ReduceKind;
using Combine = ReduceCombine;
constexpr Combine combine_of(RKind k) { return reduce_combine_of(k); }

// Below this many input elements threads cost more than they save.
constexpr int64_t kParallelThreshold = 1 << 15;


// The reduction folded to its essential dims (see the file comment).
struct ReduceLayout {
  std::vector<int64_t> dims;  // merged input dims
  std::vector<bool> reduced;  // per merged dim
  int64_t count = 1;          // elements reduced into each output
  int64_t out_numel = 1;
};

ReduceLayout fold(const std::vector<int64_t>& shape, const std::vector<bool>& is_reduced) {
  ReduceLayout l;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (is_reduced[i]) l.count *= shape[i];
    else l.out_numel *= shape[i];
    // A size-1 dim is the same whether reduced or not, so it never splits a run.
    if (shape[i] == 1) continue;
    if (!l.dims.empty() && l.reduced.back() == is_reduced[i]) {
      l.dims.back() *= shape[i];
    } else {
      l.dims.push_back(shape[i]);
      l.reduced.push_back(is_reduced[i]);
    }
  }
  return l;
}

// The op is a template parameter so pre/post/combine resolve at compile time: a runtime switch inside the
// loops would be if-converted by the vectoriser, evaluating exp() for every element of a plain sum.
template <class T, RKind K> struct Reducer {
  static constexpr RKind kind = K;
  T init;

  // The maths is ReduceFn (executor/functors.h), shared with the CUDA kernels; inputs of combine() are already
  // transformed by pre().
  T combine(T a, T b) const { return ReduceFn<K>{}.combine(a, b); }
  T pre(T x, T shift) const { return ReduceFn<K>{}.pre(x, shift); }
  T post(T acc, int64_t n, T shift) const { return ReduceFn<K>{}.post(acc, n, shift); }
};

template <class T> T initial_value(RKind k) { return reduce_init<T>(k); }

// Reduces n contiguous values; written per combine so the compiler vectorises with OpenMP simd reductions.
template <class T, Combine C, class Pre>
T reduce_row(const T* x, int64_t n, T init, Pre pre) {
  T acc = init;
  if constexpr (C == Combine::Add) {
#pragma omp simd reduction(+ : acc)
    for (int64_t i = 0; i < n; ++i) acc += pre(x[i]);
  } else if constexpr (C == Combine::Mul) {
#pragma omp simd reduction(* : acc)
    for (int64_t i = 0; i < n; ++i) acc *= pre(x[i]);
  } else if constexpr (C == Combine::Max) {
#pragma omp simd reduction(max : acc)
    for (int64_t i = 0; i < n; ++i) acc = std::max(acc, pre(x[i]));
  } else {
#pragma omp simd reduction(min : acc)
    for (int64_t i = 0; i < n; ++i) acc = std::min(acc, pre(x[i]));
  }
  return acc;
}

template <class T, RKind K> class ReduceKernel final : public Kernel {
 public:
  ReduceKernel(T init, ReduceLayout layout, bool identity) : r_{init}, l_(std::move(layout)), identity_(identity) {
    if (K == RKind::LogSumExp) shift_.resize(static_cast<size_t>(l_.out_numel));
    const auto& d = l_.dims;
    const auto& red = l_.reduced;
    if (l_.count == 1) shape_ = Layout::Elementwise;
    else if (d.size() == 1 || (d.size() == 2 && !red[0])) shape_ = Layout::Rows;
    else if ((d.size() == 2 && red[0]) || (d.size() == 3 && !red[0])) shape_ = Layout::Columns;
    else shape_ = Layout::General;
    if (shape_ == Layout::General) {
      ostride_.assign(d.size(), 0);
      idx_.assign(d.size(), 0);
      int64_t s = 1;
      for (size_t i = d.size(); i-- > 0;)
        if (!red[i]) {
          ostride_[i] = s;
          s *= d[i];
        }
    }
    partials_.resize(kChunks);
  }

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const T* x = in[0]->ptr<T>();
    T* y = out[0]->ptr<T>();
    if (identity_) {
      if (x != y && out[0]->nbytes()) std::memmove(y, x, out[0]->nbytes());
      return;
    }
    if constexpr (K == RKind::LogSumExp) {
      // log(sum(exp(x - m))) + m with m the max, so large inputs do not overflow; an infinite m (all -inf,
      // or an empty set) shifts by 0 instead so inf - inf never makes a NaN.
      reduce(Reducer<T, RKind::Max>{initial_value<T>(RKind::Max)}, x, shift_.data(), nullptr);
      for (T& m : shift_) m = logsumexp_shift(m);
      reduce(r_, x, y, shift_.data());
    } else {
      reduce(r_, x, y, nullptr);
    }
  }

 private:
  enum class Layout { Elementwise, Rows, Columns, General };
  static constexpr int64_t kChunks = 64;  // partial results for one long row split across threads

  template <RKind R> void reduce(const Reducer<T, R>& r, const T* x, T* y, const T* shift) {
    constexpr Combine C = combine_of(R);
    const int64_t nout = l_.out_numel;
    const int64_t n = l_.count;
    auto sh = [shift](int64_t o) { return shift ? shift[o] : T(0); };
    const auto& d = l_.dims;
    const bool par = nout * n >= kParallelThreshold;

    switch (shape_) {
      case Layout::Elementwise:
        for (int64_t o = 0; o < nout; ++o) y[o] = r.post(r.pre(x[o], sh(o)), 1, sh(o));
        return;
      case Layout::Rows:
        if (nout == 1 && par) {
          // One long row (a full reduction): fixed chunks, so the result does not depend on thread count.
          const int64_t step = (n + kChunks - 1) / kChunks;
          const T s = sh(0);
          T* part = partials_.data();
          cpu::parallel_for(kChunks, true, [&](int64_t c) {
            const int64_t b = std::min(n, c * step), e = std::min(n, b + step);
            part[c] = reduce_row<T, C>(x + b, e - b, r.init, [&](T v) { return r.pre(v, s); });
          });
          T acc = r.init;
          for (int64_t c = 0; c < kChunks; ++c) acc = r.combine(acc, part[c]);
          y[0] = r.post(acc, n, s);
          return;
        }
        cpu::parallel_for(nout, par, [&](int64_t o) {
          const T s = sh(o);
          T acc = reduce_row<T, C>(x + o * n, n, r.init, [&](T v) { return r.pre(v, s); });
          y[o] = r.post(acc, n, s);
        });
        return;
      case Layout::Columns: {
        // Whole rows of `inner` accumulate into the output slice, vectorised along inner; threads split
        // the columns so each output element has one writer.
        const int64_t outer = d.size() == 3 ? d[0] : 1;
        const int64_t inner = d.back();
        const int64_t blk = 256;
        const int64_t nblk = (inner + blk - 1) / blk;
        cpu::parallel_for(outer * nblk, par, [&](int64_t t) {
          const int64_t o = t / nblk, b = t % nblk;
          const int64_t j0 = b * blk, j1 = std::min(inner, j0 + blk);
          T* yo = y + o * inner;
          const T* xo = x + o * n * inner;
          const T* so = shift ? shift + o * inner : nullptr;
          for (int64_t j = j0; j < j1; ++j) yo[j] = r.init;
          for (int64_t k = 0; k < n; ++k) {
            const T* xr = xo + k * inner;
            if (so) {
              for (int64_t j = j0; j < j1; ++j) yo[j] = r.combine(yo[j], r.pre(xr[j], so[j]));
            } else {
              for (int64_t j = j0; j < j1; ++j) yo[j] = r.combine(yo[j], r.pre(xr[j], T(0)));
            }
          }
          for (int64_t j = j0; j < j1; ++j) yo[j] = r.post(yo[j], n, so ? so[j] : T(0));
        });
        return;
      }
      case Layout::General: {
        // One pass over the input, the output offset advanced like an odometer.
        const size_t rank = d.size();
        std::fill(y, y + nout, r.init);
        std::fill(idx_.begin(), idx_.end(), 0);
        const int64_t inner = d.back();
        const int64_t is = ostride_.back();
        const int64_t total = nout * n;
        int64_t off = 0;
        for (int64_t base = 0; base < total; base += inner) {
          const T* xr = x + base;
          for (int64_t j = 0; j < inner; ++j) {
            const int64_t oj = off + j * is;
            y[oj] = r.combine(y[oj], r.pre(xr[j], sh(oj)));
          }
          for (size_t k = rank - 1; k-- > 0;) {
            off += ostride_[k];
            if (++idx_[k] < d[k]) break;
            off -= ostride_[k] * d[k];
            idx_[k] = 0;
          }
        }
        for (int64_t o = 0; o < nout; ++o) y[o] = r.post(y[o], n, sh(o));
        return;
      }
    }
  }

  Reducer<T, K> r_;
  ReduceLayout l_;
  bool identity_;
  Layout shape_;
  // Sized here so run() never allocates.
  std::vector<T> shift_;  // per-output max for LogSumExp
  std::vector<int64_t> ostride_, idx_;
  std::vector<T> partials_;
};

struct ReduceOp {
  const char* name;
  RKind kind;
  int64_t axes_input_since;  // opset from which axes is an input rather than an attribute
};

std::unique_ptr<Kernel> make_reduce(PrepareContext& ctx, const ReduceOp& op) {
  const ops::ReduceAxes axes = ops::prepare_reduce(ctx, op.axes_input_since);
  const KernelInput& x = ctx.inputs[0];
  const bool identity = axes.identity;
  ReduceLayout layout = fold(x.shape, axes.reduced);
  auto make = [&]<class T>(T init) -> std::unique_ptr<Kernel> {
    auto build = [&]<RKind K>() -> std::unique_ptr<Kernel> {
      return std::make_unique<ReduceKernel<T, K>>(init, std::move(layout), identity);
    };
    // Integer and bool inputs only reach the ops registered for them (register_cpu_reduce).
    switch (op.kind) {
      case RKind::Max: return build.template operator()<RKind::Max>();
      case RKind::Min: return build.template operator()<RKind::Min>();
      default: break;
    }
    if constexpr (!std::is_same_v<T, uint8_t>) {
      switch (op.kind) {
        case RKind::Sum: return build.template operator()<RKind::Sum>();
        case RKind::Mean: return build.template operator()<RKind::Mean>();
        case RKind::Prod: return build.template operator()<RKind::Prod>();
        default: break;
      }
    }
    if constexpr (std::is_floating_point_v<T>) {
      switch (op.kind) {
        case RKind::SumSquare: return build.template operator()<RKind::SumSquare>();
        case RKind::L1: return build.template operator()<RKind::L1>();
        case RKind::L2: return build.template operator()<RKind::L2>();
        case RKind::LogSum: return build.template operator()<RKind::LogSum>();
        case RKind::LogSumExp: return build.template operator()<RKind::LogSumExp>();
        default: break;
      }
    }
    ctx.fail("input type " + dtype_name(x.dtype) + " is not supported");
  };
  switch (x.dtype) {
    case DType::Float32: return make(initial_value<float>(op.kind));
    case DType::Float64: return make(initial_value<double>(op.kind));
    case DType::Int64: return make(initial_value<int64_t>(op.kind));
    case DType::Int32: return make(initial_value<int32_t>(op.kind));
    case DType::Bool:
      // One byte holding 0 or 1, so max/min are logical or/and; an empty-set min is true.
      if (op.kind != RKind::Max && op.kind != RKind::Min) ctx.fail("bool input is supported by ReduceMax/Min only");
      return make(uint8_t{op.kind == RKind::Min ? uint8_t{1} : uint8_t{0}});
    default: ctx.fail("input type " + dtype_name(x.dtype) + " is not supported");
  }
}

// ArgMax/ArgMin along one axis as [outer, n, inner].
template <class T, bool IsMax> class ArgKernel final : public Kernel {
 public:
  ArgKernel(int64_t outer, int64_t n, int64_t inner, bool last) : outer_(outer), n_(n), inner_(inner), last_(last) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const T* x = in[0]->ptr<T>();
    int64_t* y = out[0]->ptr<int64_t>();
    const bool par = outer_ * n_ * inner_ >= kParallelThreshold;
    cpu::parallel_for(outer_, par, [&](int64_t o) {
      const T* xo = x + o * n_ * inner_;
      int64_t* yo = y + o * inner_;
      for (int64_t j = 0; j < inner_; ++j) {
        T best = xo[j];
        int64_t bi = 0;
        for (int64_t k = 1; k < n_; ++k) {
          T v = xo[k * inner_ + j];
          if (arg_better<IsMax>(v, best, last_)) {
            best = v;
            bi = k;
          }
        }
        yo[j] = bi;
      }
    });
  }

 private:
  int64_t outer_, n_, inner_;
  bool last_;
};

template <bool IsMax> std::unique_ptr<Kernel> make_arg(PrepareContext& ctx) {
  const ops::ArgAttrs a = ops::prepare_arg(ctx);
  const KernelInput& x = ctx.inputs[0];
  const int64_t outer = a.split.outer, n = a.split.n, inner = a.split.inner;
  const bool last = a.select_last;
  switch (x.dtype) {
    case DType::Float32: return std::make_unique<ArgKernel<float, IsMax>>(outer, n, inner, last);
    case DType::Float64: return std::make_unique<ArgKernel<double, IsMax>>(outer, n, inner, last);
    case DType::Int64: return std::make_unique<ArgKernel<int64_t, IsMax>>(outer, n, inner, last);
    case DType::Int32: return std::make_unique<ArgKernel<int32_t, IsMax>>(outer, n, inner, last);
    default: ctx.fail("input type " + dtype_name(x.dtype) + " is not supported");
  }
}

// ---------------------------------------------------------------------------------------------------------
// CumSum and TopK: along one axis, like the reductions (ops::prepare_cumsum and ops::prepare_topk check the
// axis with the shared normalize_axis, rank >= 1; the reductions accept axis 0 of a scalar).

using cpu::dispatch;
using cpu::fail_dtype;

template <class T> class CumSumKernel final : public Kernel {
 public:
  CumSumKernel(int64_t outer, int64_t n, int64_t inner, bool exclusive, bool reverse)
      : outer_(outer), n_(n), inner_(inner), exclusive_(exclusive), reverse_(reverse) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const T* x = in[0]->ptr<T>();
    T* y = out[0]->ptr<T>();
    for (int64_t o = 0; o < outer_; ++o)
      for (int64_t i = 0; i < inner_; ++i) {
        T acc = T(0);
        for (int64_t s = 0; s < n_; ++s) {
          const int64_t k = reverse_ ? n_ - 1 - s : s;
          const int64_t at = (o * n_ + k) * inner_ + i;
          if (exclusive_) {
            y[at] = acc;
            acc += x[at];
          } else {
            acc += x[at];
            y[at] = acc;
          }
        }
      }
  }

 private:
  int64_t outer_, n_, inner_;
  bool exclusive_, reverse_;
};

std::unique_ptr<Kernel> make_cumsum(PrepareContext& ctx) {
  const ops::CumSumAttrs a = ops::prepare_cumsum(ctx);
  const KernelInput& x = ctx.inputs[0];
  std::unique_ptr<Kernel> k;
  dispatch<float, double, int32_t, int64_t>(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    k = std::make_unique<CumSumKernel<T>>(a.split.outer, a.split.n, a.split.inner, a.exclusive, a.reverse);
  });
  if (!k) fail_dtype(ctx);
  return k;
}

// ---------------------------------------------------------------------------------------------------------
// TopK: the k largest (or smallest) along an axis, always sorted; equal values keep the lower index first.

template <class T> class TopKKernel final : public Kernel {
 public:
  TopKKernel(int64_t outer, int64_t n, int64_t inner, int64_t k, bool largest)
      : outer_(outer), n_(n), inner_(inner), k_(k), largest_(largest) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const T* x = in[0]->ptr<T>();
    T* vals = out[0]->ptr<T>();
    int64_t* idx = out.size() > 1 && out[1] ? out[1]->ptr<int64_t>() : nullptr;
    std::vector<int64_t> order(static_cast<size_t>(n_));
    for (int64_t o = 0; o < outer_; ++o)
      for (int64_t i = 0; i < inner_; ++i) {
        const T* xs = x + o * n_ * inner_ + i;
        for (int64_t j = 0; j < n_; ++j) order[j] = j;
        auto before = [&](int64_t a, int64_t b) {
          const T va = xs[a * inner_], vb = xs[b * inner_];
          if (va != vb) return largest_ ? va > vb : va < vb;
          return a < b;
        };
        std::partial_sort(order.begin(), order.begin() + k_, order.end(), before);
        for (int64_t j = 0; j < k_; ++j) {
          const int64_t at = (o * k_ + j) * inner_ + i;
          vals[at] = xs[order[j] * inner_];
          if (idx) idx[at] = order[j];
        }
      }
  }

 private:
  int64_t outer_, n_, inner_, k_;
  bool largest_;
};

std::unique_ptr<Kernel> make_topk(PrepareContext& ctx) {
  const ops::TopKAttrs a = ops::prepare_topk(ctx);
  const KernelInput& x = ctx.inputs[0];
  std::unique_ptr<Kernel> kern;
  dispatch<float, double, int32_t, int64_t>(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    kern = std::make_unique<TopKKernel<T>>(a.split.outer, a.split.n, a.split.inner, a.k, a.largest);
  });
  if (!kern) fail_dtype(ctx);
  return kern;
}

}  // namespace

void register_cpu_reduce(KernelRegistry& r) {
  const std::vector<DType> numeric = {DType::Float32, DType::Float64, DType::Int64, DType::Int32};
  const std::vector<DType> minmax = {DType::Float32, DType::Float64, DType::Int64, DType::Int32, DType::Bool};
  const std::vector<DType> floats = {DType::Float32, DType::Float64};
  struct Entry {
    ReduceOp op;
    const std::vector<DType>* dtypes;
  };
  const Entry entries[] = {
      {{"ReduceSum", RKind::Sum, 13}, &numeric},        {{"ReduceMean", RKind::Mean, 18}, &numeric},
      {{"ReduceMax", RKind::Max, 18}, &minmax},         {{"ReduceMin", RKind::Min, 18}, &minmax},
      {{"ReduceProd", RKind::Prod, 18}, &numeric},      {{"ReduceSumSquare", RKind::SumSquare, 18}, &floats},
      {{"ReduceL1", RKind::L1, 18}, &floats},           {{"ReduceL2", RKind::L2, 18}, &floats},
      {{"ReduceLogSum", RKind::LogSum, 18}, &floats},   {{"ReduceLogSumExp", RKind::LogSumExp, 18}, &floats},
  };
  for (const Entry& e : entries) {
    const ReduceOp op = e.op;
    KernelFactory f = [op](PrepareContext& ctx) { return make_reduce(ctx, op); };
    // Two defs per op: the axes moved from an attribute to an input, which changes what the plan must know.
    r.add({"", op.name, 1, op.axes_input_since - 1, Device::CPU, *e.dtypes, f});
    r.add({"", op.name, op.axes_input_since, 1 << 30, Device::CPU, *e.dtypes, f});
  }
  r.add({"", "ArgMax", 1, 1 << 30, Device::CPU, numeric, [](PrepareContext& c) { return make_arg<true>(c); }});
  r.add({"", "ArgMin", 1, 1 << 30, Device::CPU, numeric, [](PrepareContext& c) { return make_arg<false>(c); }});
  cpu::add(r, "CumSum", 11, numeric, make_cumsum);
  cpu::add(r, "TopK", 10, numeric, make_topk);
}

}  // namespace onnxtrain
