#pragma once
// Each optimizer's per-weight update, written once as a template over the value type V (an element, or a graph
// value) and the scalar type S (its hyper-parameters). The same template yields:
//   - the ONNX function body of the op optimizers/ emits (V = S = Expr, graph/expr.h: every + * / sqrt appends a
//     standard ONNX node), which checkpoints carry so any runtime can run the step;
//   - the CPU kernel's loop (V = S = float or double, executor/cpu/fused_update.cpp);
//   - the CUDA kernel's per-element body (executor/cuda/training_ops.cu).
// The order of operations is torch's (docs/optimizers.md), and every evaluation follows it literally; the CPU file
// is compiled with -ffp-contract=off so that a*b + c rounds twice there as it does in two ONNX nodes. The CPU kernels
// and the function bodies then agree bit for bit (tests/training/test_update_formulas.cpp).
//
// Element functions are called unqualified (sqrt, maximum, where) so that a graph value finds its own overloads by
// argument-dependent lookup; for arithmetic types they resolve to the ones below.
#include <cmath>

#include "formulas/hd.h"

namespace onnxtrain::formulas {

// ONNX Max for one element: a NaN in either operand is the result (executor/functors.h's Max, which the
// standard Max kernel runs), so amsgrad's running maximum keeps a NaN as torch.maximum does.
ONNXTRAIN_FORMULA_HD inline float maximum(float a, float b) { return (a != a || a > b) ? a : b; }
ONNXTRAIN_FORMULA_HD inline double maximum(double a, double b) { return (a != a || a > b) ? a : b; }

// ONNX Where for one element.
ONNXTRAIN_FORMULA_HD inline float where(bool c, float a, float b) { return c ? a : b; }
ONNXTRAIN_FORMULA_HD inline double where(bool c, double a, double b) { return c ? a : b; }

// How an Adam update applies weight decay: none, L2 added to the gradient (adam), or decoupled, the weight scaled
// by (1 - lr*wd) before the step (adamw).
enum class AdamDecay { None, L2, Decoupled };

// The hyper-parameters of one weight's Adam update. The step-dependent ones are computed once per group in float64
// and cast to the weight's type (optimizers/optimizer.cpp), as torch computes them in Python floats.
template <class S> struct AdamScalars {
  S beta1, one_minus_beta1, beta2, one_minus_beta2;
  S bias_correction2_sqrt;  // sqrt(1 - beta2^t)
  S eps;
  S step_size;  // lr / (1 - beta1^t)
  S decay;      // L2: wd; Decoupled: 1 - lr*wd; None: unused
};

template <class V> struct AdamState {
  V p, m, v, vmax;  // vmax: amsgrad only
};

// torch.optim.Adam/AdamW's step for one element (or one graph value):
//   d = g (+ p*wd for L2);  base = p (* (1 - lr*wd) when decoupled)
//   m' = m*b1 + d*(1 - b1);  v' = v*b2 + d*d*(1 - b2);  vmax' = max(vmax, v') (amsgrad)
//   p' = base - step_size*m' / (sqrt(v' or vmax') / sqrt(1 - b2^t) + eps)
// `vmax` is read only with Amsgrad (pass anything otherwise); the result's vmax is then unset.
template <AdamDecay Decay, bool Amsgrad, class V, class S>
ONNXTRAIN_FORMULA_HD AdamState<V> adam_update(const V& p, const V& g, const V& m, const V& v, const V& vmax,
                                              const AdamScalars<S>& s) {
  using std::sqrt;
  AdamState<V> out{};
  V d = g;
  if constexpr (Decay == AdamDecay::L2) d = g + p * s.decay;
  out.m = m * s.beta1 + d * s.one_minus_beta1;
  out.v = v * s.beta2 + d * d * s.one_minus_beta2;
  V second = out.v;
  if constexpr (Amsgrad) {
    out.vmax = maximum(vmax, out.v);
    second = out.vmax;
  }
  const V denom = sqrt(second) / s.bias_correction2_sqrt + s.eps;
  if constexpr (Decay == AdamDecay::Decoupled)
    out.p = p * s.decay - s.step_size * out.m / denom;
  else
    out.p = p - s.step_size * out.m / denom;
  return out;
}

// The onnxtrain-domain op that applies adam_update<Decay, Amsgrad> to whole tensors: optimizers/ emits one per
// weight, the executor's kernels run it, its function body is the same template on graph values. A function body
// cannot branch on an attribute, and one model may hold two variants (a group without weight decay), so the
// variant is in the op's name. Inputs: P, G, M, V, [Vmax], then the AdamScalars in field order (decay only when
// Decay is not None): kAdamScalarNames. Outputs: P_new, M_new, V_new, [Vmax_new]. Same type and shape for the
// arrays; the scalars are one element each, of the arrays' type.
inline constexpr const char* adam_update_op(AdamDecay decay, bool amsgrad) {
  if (decay == AdamDecay::L2) return amsgrad ? "AdamL2AmsgradUpdate" : "AdamL2Update";
  if (decay == AdamDecay::Decoupled) return amsgrad ? "AdamWAmsgradUpdate" : "AdamWUpdate";
  return amsgrad ? "AdamAmsgradUpdate" : "AdamUpdate";
}
inline constexpr AdamDecay kAdamDecays[] = {AdamDecay::None, AdamDecay::L2, AdamDecay::Decoupled};
inline constexpr const char* kAdamScalarNames[] = {"Beta1", "OneMinusBeta1", "Beta2", "OneMinusBeta2",
                                                   "BiasCorrection2Sqrt", "Eps", "StepSize", "Decay"};
inline constexpr int adam_array_inputs(bool amsgrad) { return amsgrad ? 5 : 4; }
inline constexpr int adam_scalar_inputs(AdamDecay decay) { return decay == AdamDecay::None ? 7 : 8; }

// Calls f.template operator()<Decay, Amsgrad>() for run-time values of both: the one place that turns the variant
// into template arguments.
template <class F> decltype(auto) with_adam_variant(AdamDecay decay, bool amsgrad, F&& f) {
  switch (decay) {
    case AdamDecay::L2:
      return amsgrad ? f.template operator()<AdamDecay::L2, true>() : f.template operator()<AdamDecay::L2, false>();
    case AdamDecay::Decoupled:
      return amsgrad ? f.template operator()<AdamDecay::Decoupled, true>()
                     : f.template operator()<AdamDecay::Decoupled, false>();
    case AdamDecay::None:
      break;
  }
  return amsgrad ? f.template operator()<AdamDecay::None, true>() : f.template operator()<AdamDecay::None, false>();
}

// ---- SGD, torch convention (torch.optim.SGD) ----------------------------------------------------------------------

enum class SgdMomentum { None, Momentum, Nesterov };

template <class S> struct SgdScalars {
  S lr;
  S decay;  // L2: wd
  S momentum, one_minus_dampening;  // with momentum
};

template <class V> struct SgdState {
  V p, buf;  // buf: with momentum only
};

//   d = g (+ p*wd for L2)
//   with momentum: buf' = first_step ? d : buf*momentum + d*(1 - dampening)   (torch copies the first gradient)
//                  d = buf' (or d + buf'*momentum for nesterov)
//   p' = p - lr*d
// `buf` and `first_step` are read only with momentum.
template <bool L2, SgdMomentum Momentum, class V, class S, class B>
ONNXTRAIN_FORMULA_HD SgdState<V> sgd_update(const V& p, const V& g, const V& buf, const B& first_step,
                                            const SgdScalars<S>& s) {
  SgdState<V> out{};
  V d = g;
  if constexpr (L2) d = g + p * s.decay;
  if constexpr (Momentum != SgdMomentum::None) {
    const V next = buf * s.momentum + d * s.one_minus_dampening;
    out.buf = where(first_step, d, next);
    if constexpr (Momentum == SgdMomentum::Nesterov)
      d = d + out.buf * s.momentum;
    else
      d = out.buf;
  }
  out.p = p - s.lr * d;
  return out;
}

// The op: inputs P, G, [Buf, FirstStep (bool)], then kSgdScalarNames for this variant: Lr, [Decay], [Momentum,
// OneMinusDampening]; outputs P_new, [Buf_new].
inline constexpr const char* sgd_update_op(bool l2, SgdMomentum momentum) {
  if (momentum == SgdMomentum::Momentum) return l2 ? "SgdL2MomentumUpdate" : "SgdMomentumUpdate";
  if (momentum == SgdMomentum::Nesterov) return l2 ? "SgdL2NesterovUpdate" : "SgdNesterovUpdate";
  return l2 ? "SgdL2Update" : "SgdUpdate";
}
inline constexpr SgdMomentum kSgdMomenta[] = {SgdMomentum::None, SgdMomentum::Momentum, SgdMomentum::Nesterov};
inline constexpr int sgd_array_inputs(SgdMomentum momentum) { return momentum == SgdMomentum::None ? 2 : 3; }
inline constexpr int sgd_scalar_inputs(bool l2, SgdMomentum momentum) {
  return 1 + (l2 ? 1 : 0) + (momentum == SgdMomentum::None ? 0 : 2);
}

template <class F> decltype(auto) with_sgd_variant(bool l2, SgdMomentum momentum, F&& f) {
  switch (momentum) {
    case SgdMomentum::Momentum:
      return l2 ? f.template operator()<true, SgdMomentum::Momentum>()
                : f.template operator()<false, SgdMomentum::Momentum>();
    case SgdMomentum::Nesterov:
      return l2 ? f.template operator()<true, SgdMomentum::Nesterov>()
                : f.template operator()<false, SgdMomentum::Nesterov>();
    case SgdMomentum::None:
      break;
  }
  return l2 ? f.template operator()<true, SgdMomentum::None>() : f.template operator()<false, SgdMomentum::None>();
}

// ---- Adagrad (torch.optim.Adagrad) ------------------------------------------------------------------------------

template <class S> struct AdagradScalars {
  S clr;    // lr / (1 + (t - 1)*lr_decay)
  S eps;
  S decay;  // L2: wd
};

template <class V> struct AdagradState {
  V p, sum;
};

//   d = g (+ p*wd for L2);  sum' = sum + d*d;  p' = p - clr*d / (sqrt(sum') + eps)
template <bool L2, class V, class S>
ONNXTRAIN_FORMULA_HD AdagradState<V> adagrad_update(const V& p, const V& g, const V& sum, const AdagradScalars<S>& s) {
  using std::sqrt;
  AdagradState<V> out{};
  V d = g;
  if constexpr (L2) d = g + p * s.decay;
  out.sum = sum + d * d;
  out.p = p - s.clr * d / (sqrt(out.sum) + s.eps);
  return out;
}

// The op: inputs P, G, Sum, then Clr, Eps, [Decay]; outputs P_new, Sum_new.
inline constexpr const char* adagrad_update_op(bool l2) { return l2 ? "AdagradL2Update" : "AdagradUpdate"; }

// ---- The ONNX spec's optimizers (ai.onnx.preview.training, opset 1) ------------------------------------------------
// Their kernels (executor/functors.h's *Step, run by executor/cpu/training_ops.cpp and executor/cuda/training_ops.cu)
// evaluate these per element; the spec's norm_coefficient is an L2 term it always adds (0*x + g when zero).
// Adagrad is torch's formula with that term: adagrad_update<true> with decay = norm_coefficient and clr = the spec's
// R / (1 + T*decay_factor).

// Momentum, which is also optimizers/'s SGD `convention: onnx` (there on graph values, as standard ops):
//   d = g + p*decay;  v' = v*momentum + d*beta;  p' = p - lr*v'   (nesterov: p - lr*(d + v'*momentum))
// where beta is the spec's beta after the first step and 1 on it (T = 0), which the caller picks.
template <class S> struct OnnxMomentumScalars {
  S lr, decay, momentum, beta;
};

template <class V> struct OnnxMomentumState {
  V p, v;
};

template <bool Nesterov, class V, class S>
ONNXTRAIN_FORMULA_HD OnnxMomentumState<V> onnx_momentum_update(const V& p, const V& g, const V& v,
                                                              const OnnxMomentumScalars<S>& s) {
  OnnxMomentumState<V> out{};
  const V d = g + p * s.decay;
  out.v = v * s.momentum + d * s.beta;
  if constexpr (Nesterov)
    out.p = p - s.lr * (d + out.v * s.momentum);
  else
    out.p = p - s.lr * out.v;
  return out;
}

// Adam as the spec defines it (not torch's: both bias corrections fold into `rate`, and norm_coefficient_post
// scales the result by keep = 1 - norm_coefficient_post):
//   d = g + p*decay;  m' = m*alpha + d*(1 - alpha);  v' = v*beta + d*d*(1 - beta)
//   p' = (p - rate*(m' / (sqrt(v') + eps)))*keep
template <class S> struct OnnxAdamScalars {
  S rate, alpha, one_minus_alpha, beta, one_minus_beta, eps, decay, keep;
};

template <class V> struct OnnxAdamState {
  V p, m, v;
};

template <class V, class S>
ONNXTRAIN_FORMULA_HD OnnxAdamState<V> onnx_adam_update(const V& p, const V& g, const V& m, const V& v,
                                                      const OnnxAdamScalars<S>& s) {
  using std::sqrt;
  OnnxAdamState<V> out{};
  const V d = g + p * s.decay;
  out.m = m * s.alpha + d * s.one_minus_alpha;
  out.v = v * s.beta + d * d * s.one_minus_beta;
  out.p = (p - s.rate * (out.m / (sqrt(out.v) + s.eps))) * s.keep;
  return out;
}

}  // namespace onnxtrain::formulas
