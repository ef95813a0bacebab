// Ops that fit no other family: CumSum, Dropout, onnxtrain.DropoutMask, DepthToSpace/SpaceToDepth, Einsum, the two
// loss ops, Trilu and TopK. They are small loops;
// none of them is hot enough in the models we train to deserve a tuned path.
#include <algorithm>
#include <cstring>
#include <map>
#include <cctype>
#include <cmath>
#include <optional>
#include <random>

#include "executor/cpu/kernel_util.h"
#include "executor/functors.h"
#include "executor/kernel.h"
#include "executor/ops/einsum_plan.h"
#include "graph/einsum.h"
#include "graph/error.h"

namespace onnxtrain {
namespace {

using cpu::contiguous_strides;
using cpu::dispatch;
using cpu::elem_size;
using cpu::fail_dtype;
using cpu::has_input;
using cpu::ints_of;
using cpu::normalize_axis;
using cpu::required_input;
using cpu::set_output;

// ---------------------------------------------------------------------------------------------------------
// CumSum

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
  const KernelInput& x = required_input(ctx, 0, "x");
  required_input(ctx, 1, "axis");
  const std::vector<int64_t> axis_v = ints_of(ctx, ctx.constant_input(1), "axis");
  if (axis_v.size() != 1) ctx.fail("axis must hold one value, got " + std::to_string(axis_v.size()));
  const int64_t rank = static_cast<int64_t>(x.shape.size());
  if (rank == 0) ctx.fail("x must have rank >= 1");
  const auto axis = static_cast<size_t>(normalize_axis(ctx, axis_v[0], rank));
  int64_t outer = 1, inner = 1;
  for (size_t i = 0; i < x.shape.size(); ++i) {
    if (i < axis) outer *= x.shape[i];
    if (i > axis) inner *= x.shape[i];
  }
  const bool exclusive = ctx.node.attr_int("exclusive", 0) != 0, reverse = ctx.node.attr_int("reverse", 0) != 0;
  set_output(ctx, 0, x.dtype, x.shape);
  std::unique_ptr<Kernel> k;
  dispatch<float, double, int32_t, int64_t>(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    k = std::make_unique<CumSumKernel<T>>(outer, x.shape[axis], inner, exclusive, reverse);
  });
  if (!k) fail_dtype(ctx);
  return k;
}

// ---------------------------------------------------------------------------------------------------------
// Dropout. Inference (no training_mode, or false): y = x and an all-true mask. Training: the mask keeps an
// element when a uniform draw in [0, 1) is >= ratio, and kept elements are scaled by 1 / (1 - ratio).
// The draws are numpy's legacy `np.random.seed(seed); np.random.uniform(0, 1, shape)` (MT19937 and the
// 53-bit double from two 32-bit words), so a given seed reproduces the ONNX reference exactly. With a seed
// every run uses the same mask (so a step can be recomputed); without one the generator runs on.

template <class T> class DropoutKernel final : public Kernel {
 public:
  DropoutKernel(std::string where, std::optional<uint32_t> seed, bool has_ratio, bool has_mode, double fixed_ratio)
      : where_(std::move(where)), seed_(seed), has_ratio_(has_ratio), has_mode_(has_mode), fixed_ratio_(fixed_ratio) {
    if (!seed_) gen_.seed(std::random_device{}());
  }
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const T* x = in[0]->ptr<T>();
    T* y = out[0]->ptr<T>();
    bool* mask = out.size() > 1 && out[1] ? out[1]->ptr<bool>() : nullptr;
    const int64_t n = in[0]->numel();
    bool training = false;
    if (has_mode_ && in.size() > 2 && in[2]) training = *in[2]->ptr<bool>();
    double ratio = fixed_ratio_;
    if (has_ratio_ && in.size() > 1 && in[1]) {
      const Tensor& r = *in[1];
      if (r.numel() != 1) fail(where_, "ratio must be a scalar, got " + r.describe());
      if (r.dtype == DType::Float32) ratio = *r.ptr<float>();
      else if (r.dtype == DType::Float64) ratio = *r.ptr<double>();
      else fail(where_, "ratio must be float32 or float64, got " + dtype_name(r.dtype));
    }
    if (!training || ratio == 0.0) {
      if (y != x) std::memcpy(y, x, static_cast<size_t>(n) * sizeof(T));
      if (mask) std::fill(mask, mask + n, true);
      return;
    }
    if (!(ratio >= 0.0 && ratio < 1.0)) fail(where_, "ratio must be in [0, 1) in training mode, got " + std::to_string(ratio));
    if (seed_) gen_.seed(*seed_);
    const T scale = static_cast<T>(1.0 / (1.0 - ratio));
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t a = static_cast<uint32_t>(gen_()) >> 5, b = static_cast<uint32_t>(gen_()) >> 6;
      const double u = (a * 67108864.0 + b) / 9007199254740992.0;
      const bool keep = u >= ratio;
      y[i] = keep ? x[i] * scale : T(0);
      if (mask) mask[i] = keep;
    }
  }

 private:
  std::string where_;
  std::optional<uint32_t> seed_;
  bool has_ratio_, has_mode_;
  double fixed_ratio_;
  std::mt19937 gen_;
};

std::unique_ptr<Kernel> make_dropout(PrepareContext& ctx) {
  const KernelInput& x = required_input(ctx, 0, "data");
  set_output(ctx, 0, x.dtype, x.shape);
  if (ctx.outputs.size() > 1) set_output(ctx, 1, DType::Bool, x.shape);
  // Before opset 12 ratio is an attribute and there is no training mode: the op is the identity.
  const bool inputs_form = ctx.opset >= 12;
  if (!inputs_form && ctx.node.attr_int("is_test", 1) == 0) ctx.fail("is_test=0 (training) is not supported");
  const bool has_ratio = inputs_form && has_input(ctx, 1), has_mode = inputs_form && has_input(ctx, 2);
  if (has_mode && ctx.inputs[2].dtype != DType::Bool)
    ctx.fail("training_mode must be bool, got " + dtype_name(ctx.inputs[2].dtype));
  std::optional<uint32_t> seed;
  if (ctx.node.has_attr("seed")) {
    const int64_t s = ctx.node.attr_int("seed", 0);
    if (s < 0 || s > 0xffffffffLL) ctx.fail("seed must be in [0, 2^32), got " + std::to_string(s));
    seed = static_cast<uint32_t>(s);
  }
  const double fixed = inputs_form ? 0.5 : ctx.node.attr_float("ratio", 0.5f);
  std::unique_ptr<Kernel> k;
  dispatch<float, double>(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    k = std::make_unique<DropoutKernel<T>>(ctx.node.describe(), seed, has_ratio, has_mode, fixed);
  });
  if (!k) fail_dtype(ctx);
  return k;
}

// ---------------------------------------------------------------------------------------------------------
// onnxtrain.DropoutMask(x, counter) -> mask: bool, x's shape; attributes ratio (float) and seed (int). The
// training graph's LoRA dropout (training/adapters.h add_lora_dropout) draws its masks here. A counter-based
// stream, so a mask is a function of (seed, counter, element) alone: the session advances the int64 scalar
// counter once per training step and checkpoints it, which makes a resumed run draw the masks a straight one
// draws. With splitmix64 (Steele et al., as java.util.SplittableRandom):
//   run = splitmix64(splitmix64(seed) ^ counter),  u_i = (splitmix64(run + i) >> 11) * 2^-53,  keep_i = u_i >= ratio

uint64_t splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

class DropoutMaskKernel final : public Kernel {
 public:
  DropoutMaskKernel(uint64_t key, double ratio) : key_(key), ratio_(ratio) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const uint64_t run = splitmix64(key_ ^ static_cast<uint64_t>(*in[1]->ptr<int64_t>()));
    bool* mask = out[0]->ptr<bool>();
    const int64_t n = out[0]->numel();
    for (int64_t i = 0; i < n; ++i)
      mask[i] = static_cast<double>(splitmix64(run + static_cast<uint64_t>(i)) >> 11) * 0x1.0p-53 >= ratio_;
  }

 private:
  uint64_t key_;
  double ratio_;
};

std::unique_ptr<Kernel> make_dropout_mask(PrepareContext& ctx) {
  const KernelInput& x = required_input(ctx, 0, "x");
  const KernelInput& c = required_input(ctx, 1, "counter");
  if (c.dtype != DType::Int64 || !c.shape.empty()) ctx.fail("counter must be an int64 scalar");
  const double ratio = ctx.node.attr_float("ratio", 0.0f);
  if (!(ratio >= 0.0 && ratio < 1.0)) ctx.fail("ratio must be in [0, 1), got " + std::to_string(ratio));
  if (!ctx.node.has_attr("seed")) ctx.fail("needs a seed attribute");
  set_output(ctx, 0, DType::Bool, x.shape);
  return std::make_unique<DropoutMaskKernel>(splitmix64(static_cast<uint64_t>(ctx.node.attr_int("seed", 0))), ratio);
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
// Einsum: one loop over every index of the equation, output indices outer and summed ones inner. An
// ellipsis becomes fresh indices aligned from the right, and a size-1 dim broadcasts (stride 0).

using ops::EinsumPlan;

EinsumPlan plan_einsum(const PrepareContext& ctx, std::vector<int64_t>& out_shape) {
  const EinsumEquation parsed = parse_einsum_equation(ctx.node.attr_string("equation", ""));
  const std::string& eq = parsed.text;
  if (eq.empty()) ctx.fail("attribute 'equation' is required");
  const std::vector<std::string>& terms = parsed.terms;
  if (terms.size() != ctx.inputs.size())
    ctx.fail("equation '" + eq + "' has " + std::to_string(terms.size()) + " operands but the node has " +
             std::to_string(ctx.inputs.size()) + " inputs");
  // Ellipsis dims are named by characters outside the letters: '0' + k counted from the right.
  int64_t ell_rank = 0;
  std::vector<std::vector<char>> labels(terms.size());
  for (size_t t = 0; t < terms.size(); ++t) {
    const KernelInput& in = required_input(ctx, t, "Inputs");
    const std::string& term = terms[t];
    const size_t dots = term.find("...");
    int64_t letters = 0;
    for (char ch : term)
      if (std::isalpha(static_cast<unsigned char>(ch))) ++letters;
      else if (ch != '.') ctx.fail("equation '" + eq + "' has an invalid character '" + std::string(1, ch) + "'");
    const auto rank = static_cast<int64_t>(in.shape.size());
    const int64_t e = dots == std::string::npos ? 0 : rank - letters;
    if (e < 0 || (dots == std::string::npos && letters != rank))
      ctx.fail("operand " + std::to_string(t) + " '" + term + "' does not match its rank " + std::to_string(rank));
    ell_rank = std::max(ell_rank, e);
    for (size_t i = 0; i < term.size(); ++i) {
      if (term[i] == '.') {
        if (i == dots)
          for (int64_t k = e; k-- > 0;) labels[t].push_back(static_cast<char>('0' + k));
        continue;
      }
      labels[t].push_back(term[i]);
    }
  }
  std::map<char, int64_t> size;
  for (size_t t = 0; t < terms.size(); ++t)
    for (size_t i = 0; i < labels[t].size(); ++i) {
      const int64_t d = ctx.inputs[t].shape[i];
      auto [it, fresh] = size.emplace(labels[t][i], d);
      if (!fresh && it->second != d) {
        if (it->second == 1) it->second = d;
        else if (d != 1)
          ctx.fail("index '" + std::string(1, labels[t][i]) + "' has sizes " + std::to_string(it->second) + " and " +
                   std::to_string(d));
      }
    }
  std::vector<char> out;
  {
    const std::string& rhs = parsed.output;  // the implicit output spelled out too
    for (size_t i = 0; i < rhs.size(); ++i) {
      if (rhs[i] == '.') {
        if (rhs.compare(i, 3, "...") != 0) ctx.fail("equation '" + eq + "' has a stray '.'");
        for (int64_t k = ell_rank; k-- > 0;) out.push_back(static_cast<char>('0' + k));
        i += 2;
        continue;
      }
      if (!size.count(rhs[i])) ctx.fail("output index '" + std::string(1, rhs[i]) + "' is not in any operand");
      if (std::find(out.begin(), out.end(), rhs[i]) != out.end())
        ctx.fail("output index '" + std::string(1, rhs[i]) + "' is repeated");
      out.push_back(rhs[i]);
    }
  }
  std::vector<char> summed;
  for (const auto& [ch, d] : size)
    if (std::find(out.begin(), out.end(), ch) == out.end()) summed.push_back(ch);
  EinsumPlan p;
  for (char ch : out) p.out_dims.push_back(size.at(ch));
  for (char ch : summed) p.sum_dims.push_back(size.at(ch));
  for (size_t t = 0; t < terms.size(); ++t) {
    const std::vector<int64_t> st = contiguous_strides(ctx.inputs[t].shape);
    // A label repeated within an operand (a diagonal) adds its strides.
    auto stride_of = [&](char ch) {
      int64_t s = 0;
      for (size_t i = 0; i < labels[t].size(); ++i)
        if (labels[t][i] == ch && ctx.inputs[t].shape[i] != 1) s += st[i];
      return s;
    };
    std::vector<int64_t> os, ss;
    for (char ch : out) os.push_back(stride_of(ch));
    for (char ch : summed) ss.push_back(stride_of(ch));
    p.out_strides.push_back(std::move(os));
    p.sum_strides.push_back(std::move(ss));
  }
  out_shape = p.out_dims;
  return p;
}

template <class T> class EinsumKernel final : public Kernel, public ops::EinsumPlanned {
 public:
  explicit EinsumKernel(EinsumPlan p) : p_(std::move(p)) {}
  const EinsumPlan& plan() const override { return p_; }
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const size_t nt = in.size();
    std::vector<const T*> src(nt);
    for (size_t t = 0; t < nt; ++t) src[t] = in[t]->ptr<T>();
    T* y = out[0]->ptr<T>();
    const int64_t no = numel_of(p_.out_dims), ns = numel_of(p_.sum_dims);
    std::vector<int64_t> oi(p_.out_dims.size(), 0), si(p_.sum_dims.size(), 0);
    std::vector<int64_t> base(nt, 0), off(nt, 0);
    for (int64_t o = 0; o < no; ++o) {
      T acc = T(0);
      off = base;
      std::fill(si.begin(), si.end(), 0);
      for (int64_t s = 0; s < ns; ++s) {
        T prod = T(1);
        for (size_t t = 0; t < nt; ++t) prod *= src[t][off[t]];
        acc += prod;
        advance(si, p_.sum_dims, p_.sum_strides, off);
      }
      y[o] = acc;
      advance(oi, p_.out_dims, p_.out_strides, base);
    }
  }

 private:
  // Odometer step of idx over dims, moving every operand's offset by its strides.
  static void advance(std::vector<int64_t>& idx, const std::vector<int64_t>& dims,
                      const std::vector<std::vector<int64_t>>& strides, std::vector<int64_t>& off) {
    for (size_t q = idx.size(); q-- > 0;) {
      for (size_t t = 0; t < off.size(); ++t) off[t] += strides[t][q];
      if (++idx[q] < dims[q]) return;
      for (size_t t = 0; t < off.size(); ++t) off[t] -= strides[t][q] * dims[q];
      idx[q] = 0;
    }
  }
  EinsumPlan p_;
};

std::unique_ptr<Kernel> make_einsum(PrepareContext& ctx) {
  if (ctx.inputs.empty()) ctx.fail("needs at least one input");
  const DType t = required_input(ctx, 0, "Inputs").dtype;
  for (size_t i = 1; i < ctx.inputs.size(); ++i)
    if (required_input(ctx, i, "Inputs").dtype != t)
      ctx.fail("input " + std::to_string(i) + " has type " + dtype_name(ctx.inputs[i].dtype) + " but input 0 has " +
               dtype_name(t));
  std::vector<int64_t> shape;
  EinsumPlan p = plan_einsum(ctx, shape);
  set_output(ctx, 0, t, shape);
  std::unique_ptr<Kernel> k;
  dispatch<float, double, int32_t, int64_t>(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    k = std::make_unique<EinsumKernel<T>>(std::move(p));
  });
  if (!k) fail_dtype(ctx);
  return k;
}

// ---------------------------------------------------------------------------------------------------------
// NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (which is the former on log_softmax over axis 1).
// Input [N, C, d...], target [N, d...]; element weight w = weight[t] (or 1), 0 where t == ignore_index;
// loss = -w * input[n, t, d...]; "mean" divides the sum by the sum of w, as the ONNX reference does.

template <class T, class I> class LossKernel final : public Kernel {
 public:
  LossKernel(std::string where, bool softmax, int64_t n, int64_t c, int64_t d, std::string reduction,
             std::optional<int64_t> ignore)
      : where_(std::move(where)), softmax_(softmax), n_(n), c_(c), d_(d), reduction_(std::move(reduction)),
        ignore_(ignore) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const T* x = in[0]->ptr<T>();
    const I* target = in[1]->ptr<I>();
    const T* weight = in.size() > 2 && in[2] ? in[2]->ptr<T>() : nullptr;
    const T* logp = x;
    if (softmax_) {
      T* lp = out.size() > 1 && out[1] ? out[1]->ptr<T>() : nullptr;
      if (!lp) {
        scratch_.resize(static_cast<size_t>(n_ * c_ * d_));
        lp = scratch_.data();
      }
      for (int64_t i = 0; i < n_; ++i)
        for (int64_t k = 0; k < d_; ++k) {
          const T* xs = x + i * c_ * d_ + k;
          T* ls = lp + i * c_ * d_ + k;
          T m = xs[0];
          for (int64_t j = 1; j < c_; ++j) m = std::max(m, xs[j * d_]);
          double s = 0;
          for (int64_t j = 0; j < c_; ++j) s += std::exp(static_cast<double>(xs[j * d_] - m));
          const T lse = static_cast<T>(std::log(s)) + m;
          for (int64_t j = 0; j < c_; ++j) ls[j * d_] = xs[j * d_] - lse;
        }
      logp = lp;
    }
    T* y = out[0]->ptr<T>();
    double total = 0, wsum = 0;
    for (int64_t i = 0; i < n_; ++i)
      for (int64_t k = 0; k < d_; ++k) {
        const int64_t t = static_cast<int64_t>(target[i * d_ + k]);
        if ((!ignore_ || t != *ignore_) && (t < 0 || t >= c_))
          fail(where_, "target " + std::to_string(t) + " is out of range for " + std::to_string(c_) + " classes");
        const NllTerm term = nll_term(t, c_, weight, logp + i * c_ * d_ + k, d_, ignore_.has_value(), ignore_.value_or(0));
        const double w = term.w, l = term.loss;
        if (reduction_ == "none") y[i * d_ + k] = static_cast<T>(l);
        total += l;
        wsum += w;
      }
    if (reduction_ == "sum") *y = static_cast<T>(total);
    if (reduction_ == "mean") *y = static_cast<T>(total / wsum);
  }

 private:
  std::string where_;
  bool softmax_;
  int64_t n_, c_, d_;
  std::string reduction_;
  std::optional<int64_t> ignore_;
  std::vector<T> scratch_;
};

std::unique_ptr<Kernel> make_loss(PrepareContext& ctx, bool softmax) {
  const KernelInput& x = required_input(ctx, 0, softmax ? "scores" : "input");
  const KernelInput& t = required_input(ctx, 1, softmax ? "labels" : "target");
  if (x.shape.size() < 2) ctx.fail("input must have shape [N, C, d...], got " + shape_string(x.shape));
  std::vector<int64_t> want{x.shape[0]};
  want.insert(want.end(), x.shape.begin() + 2, x.shape.end());
  if (t.shape != want) ctx.fail("target has shape " + shape_string(t.shape) + ", expected " + shape_string(want));
  const int64_t C = x.shape[1];
  if (has_input(ctx, 2)) {
    const KernelInput& w = ctx.inputs[2];
    if (w.dtype != x.dtype) ctx.fail("weight must have the input's dtype " + dtype_name(x.dtype));
    if (w.shape != std::vector<int64_t>{C}) ctx.fail("weight must have shape [" + std::to_string(C) + "], got " + shape_string(w.shape));
  }
  const std::string reduction = ctx.node.attr_string("reduction", "mean");
  if (reduction != "none" && reduction != "sum" && reduction != "mean")
    ctx.fail("reduction must be none, sum or mean, got '" + reduction + "'");
  std::optional<int64_t> ignore;
  if (ctx.node.has_attr("ignore_index")) ignore = ctx.node.attr_int("ignore_index", 0);
  set_output(ctx, 0, x.dtype, reduction == "none" ? want : std::vector<int64_t>{});
  if (softmax && ctx.outputs.size() > 1) set_output(ctx, 1, x.dtype, x.shape);
  const int64_t D = numel_of(want) / std::max<int64_t>(1, x.shape[0]);
  std::unique_ptr<Kernel> k;
  dispatch<float, double>(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (t.dtype == DType::Int64)
      k = std::make_unique<LossKernel<T, int64_t>>(ctx.node.describe(), softmax, x.shape[0], C, D, reduction, ignore);
    else if (t.dtype == DType::Int32)
      k = std::make_unique<LossKernel<T, int32_t>>(ctx.node.describe(), softmax, x.shape[0], C, D, reduction, ignore);
    else
      ctx.fail("target must be int32 or int64, got " + dtype_name(t.dtype));
  });
  if (!k) fail_dtype(ctx);
  return k;
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
  const KernelInput& x = required_input(ctx, 0, "X");
  required_input(ctx, 1, "K");
  const std::vector<int64_t> kv = ints_of(ctx, ctx.constant_input(1), "K");
  if (kv.size() != 1) ctx.fail("K must hold one value");
  const int64_t rank = static_cast<int64_t>(x.shape.size());
  if (rank == 0) ctx.fail("X must have rank >= 1");
  const auto axis = static_cast<size_t>(normalize_axis(ctx, ctx.node.attr_int("axis", -1), rank));
  const int64_t k = kv[0], n = x.shape[axis];
  if (k < 0 || k > n) ctx.fail("K = " + std::to_string(k) + " is out of range for an axis of size " + std::to_string(n));
  int64_t outer = 1, inner = 1;
  for (size_t i = 0; i < x.shape.size(); ++i) {
    if (i < axis) outer *= x.shape[i];
    if (i > axis) inner *= x.shape[i];
  }
  std::vector<int64_t> shape = x.shape;
  shape[axis] = k;
  set_output(ctx, 0, x.dtype, shape);
  if (ctx.outputs.size() > 1) set_output(ctx, 1, DType::Int64, shape);
  const bool largest = ctx.opset < 11 || ctx.node.attr_int("largest", 1) != 0;
  std::unique_ptr<Kernel> kern;
  dispatch<float, double, int32_t, int64_t>(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    kern = std::make_unique<TopKKernel<T>>(outer, n, inner, k, largest);
  });
  if (!kern) fail_dtype(ctx);
  return kern;
}

}  // namespace

void register_cpu_misc(KernelRegistry& r) {
  const std::vector<DType> num = {DType::Float32, DType::Float64, DType::Int32, DType::Int64};
  cpu::add(r, "CumSum", 11, num, make_cumsum);
  cpu::add(r, "Dropout", 7, {DType::Float32, DType::Float64}, make_dropout);
  cpu::add(r, "onnxtrain", "DropoutMask", 1, {DType::Float32, DType::Float64}, make_dropout_mask);
  cpu::add(r, "DepthToSpace", 1, {}, make_depth_to_space);
  cpu::add(r, "SpaceToDepth", 1, {}, make_space_to_depth);
  cpu::add(r, "Einsum", 12, num, make_einsum);
  cpu::add(r, "Trilu", 14, {}, make_trilu);
  cpu::add(r, "TopK", 10, num, make_topk);
  cpu::add(r, "NegativeLogLikelihoodLoss", 12, {DType::Float32, DType::Float64},
           [](PrepareContext& ctx) { return make_loss(ctx, false); });
  cpu::add(r, "SoftmaxCrossEntropyLoss", 12, {DType::Float32, DType::Float64},
           [](PrepareContext& ctx) { return make_loss(ctx, true); });
}

}  // namespace onnxtrain
