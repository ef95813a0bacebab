#pragma once
// Elementwise maths written once for the CPU loops and a future CUDA backend. Every functor is a plain struct
// whose operator() is ONNXTRAIN_HD and templated on the element type, so the same expression runs on both
// sides and the CPU tests check the GPU's maths too. Keep them free of host-only calls (no exceptions, no
// std containers); std:: maths functions have device overloads under nvcc.
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "formulas/gelu.h"
#include "formulas/optimizer_updates.h"
#include "graph/hd.h"

namespace onnxtrain {

// ---- binary arithmetic ----------------------------------------------------------------------------------

struct AddOp {
  template <class T> ONNXTRAIN_HD T operator()(T a, T b) const { return a + b; }
};
struct SubOp {
  template <class T> ONNXTRAIN_HD T operator()(T a, T b) const { return a - b; }
};
struct MulOp {
  template <class T> ONNXTRAIN_HD T operator()(T a, T b) const { return a * b; }
};
struct DivOp {
  template <class T> ONNXTRAIN_HD T operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>) {
      // Integer division by zero (and INT_MIN / -1) trap on x86; a user's data must not kill the process,
      // so follow numpy and give 0 (and the wrapped quotient).
      if (b == 0) return T(0);
      if constexpr (std::is_signed_v<T>)
        if (b == T(-1)) return static_cast<T>(T(0) - static_cast<std::make_unsigned_t<T>>(a));
      return a / b;
    } else {
      return a / b;
    }
  }
};
// Pow allows the exponent's type to differ from the base's (opset 12+); the result has the base's type.
struct PowOp {
  template <class T, class U> ONNXTRAIN_HD T operator()(T a, U b) const {
    if constexpr (std::is_same_v<T, float> && std::is_same_v<U, float>)
      return std::pow(a, b);
    else
      return static_cast<T>(std::pow(static_cast<double>(a), static_cast<double>(b)));
  }
};
// ONNX Mod: fmod=1 takes the dividend's sign (C fmod/%), fmod=0 the divisor's (Python %).
struct ModOp {
  bool fmod = false;
  template <class T> ONNXTRAIN_HD T operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>) {
      if (b == 0) return T(0);  // see DivOp
      if constexpr (std::is_signed_v<T>) {
        if (b == T(-1)) return T(0);
        T r = a % b;
        if (!fmod && r != 0 && ((r < 0) != (b < 0))) r += b;
        return r;
      } else {
        return a % b;
      }
    } else {
      T r = std::fmod(a, b);
      if (!fmod && r != 0 && ((r < 0) != (b < 0))) r += b;
      return r;
    }
  }
};
// NaN propagates, as numpy.maximum/minimum (the ONNX reference) do.
struct MaxOp {
  template <class T> ONNXTRAIN_HD T operator()(T a, T b) const { return (a != a || a > b) ? a : b; }
};
struct MinOp {
  template <class T> ONNXTRAIN_HD T operator()(T a, T b) const { return (a != a || a < b) ? a : b; }
};

// ---- comparisons and logic (bool results) ----------------------------------------------------------------

struct EqualOp {
  template <class T> ONNXTRAIN_HD bool operator()(T a, T b) const { return a == b; }
};
struct LessOp {
  template <class T> ONNXTRAIN_HD bool operator()(T a, T b) const { return a < b; }
};
struct GreaterOp {
  template <class T> ONNXTRAIN_HD bool operator()(T a, T b) const { return a > b; }
};
struct LessOrEqualOp {
  template <class T> ONNXTRAIN_HD bool operator()(T a, T b) const { return a <= b; }
};
struct GreaterOrEqualOp {
  template <class T> ONNXTRAIN_HD bool operator()(T a, T b) const { return a >= b; }
};
struct AndOp {
  template <class T> ONNXTRAIN_HD bool operator()(T a, T b) const { return a && b; }
};
struct OrOp {
  template <class T> ONNXTRAIN_HD bool operator()(T a, T b) const { return a || b; }
};
struct XorOp {
  template <class T> ONNXTRAIN_HD bool operator()(T a, T b) const { return bool(a) != bool(b); }
};

struct WhereOp {
  template <class T> ONNXTRAIN_HD T operator()(bool c, T x, T y) const { return c ? x : y; }
};

// ---- unary ----------------------------------------------------------------------------------------------

struct IdentityOp {
  template <class T> ONNXTRAIN_HD T operator()(T x) const { return x; }
};
struct NegOp {
  template <class T> ONNXTRAIN_HD T operator()(T x) const {
    if constexpr (std::is_integral_v<T> && std::is_signed_v<T>)  // wraps INT_MIN instead of overflowing
      return static_cast<T>(T(0) - static_cast<std::make_unsigned_t<T>>(x));
    else
      return -x;
  }
};
struct AbsOp {
  template <class T> ONNXTRAIN_HD T operator()(T x) const {
    if constexpr (std::is_unsigned_v<T>)
      return x;
    else
      return x < T(0) ? NegOp{}(x) : x;
  }
};
struct SignOp {
  template <class T> ONNXTRAIN_HD T operator()(T x) const { return x > T(0) ? T(1) : (x < T(0) ? T(-1) : T(0)); }
};
struct ReluOp {
  template <class T> ONNXTRAIN_HD T operator()(T x) const { return x > T(0) ? x : T(0); }
};
// 1/(1+e^-x) stays finite at both ends: e^-x overflows to inf for very negative x and gives 0.
struct SigmoidOp {
  template <class T> ONNXTRAIN_HD T operator()(T x) const { return T(1) / (T(1) + std::exp(-x)); }
};
struct TanhOp {
  template <class T> ONNXTRAIN_HD T operator()(T x) const { return std::tanh(x); }
};
struct ExpOp {
  template <class T> ONNXTRAIN_HD T operator()(T x) const { return std::exp(x); }
};
struct LogOp {
  template <class T> ONNXTRAIN_HD T operator()(T x) const { return std::log(x); }
};
struct SqrtOp {
  template <class T> ONNXTRAIN_HD T operator()(T x) const { return std::sqrt(x); }
};
struct ReciprocalOp {
  template <class T> ONNXTRAIN_HD T operator()(T x) const { return T(1) / x; }
};
struct FloorOp {
  template <class T> ONNXTRAIN_HD T operator()(T x) const { return std::floor(x); }
};
struct CeilOp {
  template <class T> ONNXTRAIN_HD T operator()(T x) const { return std::ceil(x); }
};
struct ErfOp {
  template <class T> ONNXTRAIN_HD T operator()(T x) const { return std::erf(x); }
};
// log(1+e^x) without overflow for large x: x + log1p(e^-x).
struct SoftplusOp {
  template <class T> ONNXTRAIN_HD T operator()(T x) const {
    return x > T(0) ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x));
  }
};
struct LeakyReluOp {
  float alpha = 0.01f;
  template <class T> ONNXTRAIN_HD T operator()(T x) const { return x >= T(0) ? x : static_cast<T>(alpha) * x; }
};
struct EluOp {
  float alpha = 1.0f;
  template <class T> ONNXTRAIN_HD T operator()(T x) const {
    return x >= T(0) ? x : static_cast<T>(alpha) * std::expm1(x);
  }
};
struct NotOp {
  ONNXTRAIN_HD bool operator()(bool x) const { return !x; }
};
template <class To> struct CastOp {
  template <class From> ONNXTRAIN_HD To operator()(From x) const { return static_cast<To>(x); }
};
// Bounds are given per call because opset 11+ reads them from (possibly non-constant) inputs at run time.
// When lo > hi every value becomes hi, as the spec says; NaN passes through.
struct ClipOp {
  template <class T> ONNXTRAIN_HD T operator()(T x, T lo, T hi) const {
    T y = x < lo ? lo : x;
    return hi < y ? hi : y;
  }
};

// ---- fused gradients (domain "onnxtrain"): (dY, Y) -> dX, using the forward output Y -----------------------

struct ReluGradOp {
  template <class T> ONNXTRAIN_HD T operator()(T dy, T y) const { return y > T(0) ? dy : T(0); }
};
struct SigmoidGradOp {
  template <class T> ONNXTRAIN_HD T operator()(T dy, T y) const { return dy * y * (T(1) - y); }
};
struct TanhGradOp {
  template <class T> ONNXTRAIN_HD T operator()(T dy, T y) const { return dy * (T(1) - y * y); }
};

// ---- trigonometric and hyperbolic (the unary family: executor/cpu/unary.cpp) --------------------------------

struct SinOp {
  template <class T> ONNXTRAIN_HD T operator()(T x) const { return std::sin(x); }
};
struct CosOp {
  template <class T> ONNXTRAIN_HD T operator()(T x) const { return std::cos(x); }
};
struct TanOp {
  template <class T> ONNXTRAIN_HD T operator()(T x) const { return std::tan(x); }
};
struct AsinOp {
  template <class T> ONNXTRAIN_HD T operator()(T x) const { return std::asin(x); }
};
struct AcosOp {
  template <class T> ONNXTRAIN_HD T operator()(T x) const { return std::acos(x); }
};
struct AtanOp {
  template <class T> ONNXTRAIN_HD T operator()(T x) const { return std::atan(x); }
};
struct SinhOp {
  template <class T> ONNXTRAIN_HD T operator()(T x) const { return std::sinh(x); }
};
struct CoshOp {
  template <class T> ONNXTRAIN_HD T operator()(T x) const { return std::cosh(x); }
};
struct AsinhOp {
  template <class T> ONNXTRAIN_HD T operator()(T x) const { return std::asinh(x); }
};
struct AcoshOp {
  template <class T> ONNXTRAIN_HD T operator()(T x) const { return std::acosh(x); }
};
struct AtanhOp {
  template <class T> ONNXTRAIN_HD T operator()(T x) const { return std::atanh(x); }
};
// Halves go to the even neighbour (numpy.round, the ONNX reference), independent of the FP rounding mode.
struct RoundOp {
  template <class T> ONNXTRAIN_HD T operator()(T x) const {
    const T r = std::round(x);  // halves away from zero
    if (std::abs(x - std::trunc(x)) == T(0.5)) return T(2) * std::round(x / T(2));
    return r;
  }
};

// ---- activations (executor/cpu/activation.cpp); attributes are ONNX floats ---------------------------------

struct SeluOp {
  float alpha = 1.67326319217681884765625f;
  float gamma = 1.05070102214813232421875f;
  template <class T> ONNXTRAIN_HD T operator()(T x) const {
    return static_cast<T>(gamma) * (x > T(0) ? x : static_cast<T>(alpha) * std::expm1(x));
  }
};
struct CeluOp {
  float alpha = 1.0f;
  template <class T> ONNXTRAIN_HD T operator()(T x) const {
    const T a = static_cast<T>(alpha);
    return x > T(0) ? x : a * std::expm1(x / a);
  }
};
// GELU and its derivatives are written once, as `formula<M, V, T>`: V is the value type (T itself here and in
// the CUDA kernels; an Eigen array expression in the CPU kernels, which vectorise it: executor/cpu/eigen_map.h)
// and M supplies erf, exp, tanh and square for it. The order of operations is part of the formula: the CPU and
// CUDA kernels round alike.
struct ScalarMath {
  template <class T> ONNXTRAIN_HD static T erf(T x) { return std::erf(x); }
  template <class T> ONNXTRAIN_HD static T exp(T x) { return std::exp(x); }
  template <class T> ONNXTRAIN_HD static T tanh(T x) { return std::tanh(x); }
  template <class T> ONNXTRAIN_HD static T square(T x) { return x * x; }
};
// approximate = "none": x * Phi(x) with the normal CDF written through erf.
struct GeluOp {
  template <class M, class V, class T> ONNXTRAIN_HD static auto formula(const V& x) {
    return formulas::gelu_erf<M, V, T>(x);
  }
  template <class T> ONNXTRAIN_HD T operator()(T x) const { return formula<ScalarMath, T, T>(x); }
};
// approximate = "tanh": 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
struct GeluTanhOp {
  template <class M, class V, class T> ONNXTRAIN_HD static auto formula(const V& x) {
    return formulas::gelu_tanh<M, V, T>(x);
  }
  template <class T> ONNXTRAIN_HD T operator()(T x) const { return formula<ScalarMath, T, T>(x); }
};
struct HardSigmoidOp {
  float alpha = 0.2f;
  float beta = 0.5f;
  template <class T> ONNXTRAIN_HD T operator()(T x) const {
    const T v = static_cast<T>(alpha) * x + static_cast<T>(beta);
    return v < T(0) ? T(0) : (v > T(1) ? T(1) : v);
  }
};
// x * HardSigmoid(x) with alpha = 1/6, beta = 1/2.
struct HardSwishOp {
  template <class T> ONNXTRAIN_HD T operator()(T x) const {
    const T v = x / T(6) + T(0.5);
    return x * (v < T(0) ? T(0) : (v > T(1) ? T(1) : v));
  }
};
struct SoftsignOp {
  template <class T> ONNXTRAIN_HD T operator()(T x) const { return x / (T(1) + std::abs(x)); }
};
// x * tanh(softplus(x)); softplus as in SoftplusOp so large |x| neither overflows nor loses the tail.
struct MishOp {
  template <class T> ONNXTRAIN_HD T operator()(T x) const {
    const T sp = x > T(0) ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x));
    return x * std::tanh(sp);
  }
};
struct ThresholdedReluOp {
  float alpha = 1.0f;
  template <class T> ONNXTRAIN_HD T operator()(T x) const { return x > static_cast<T>(alpha) ? x : T(0); }
};
// (x, slope) -> x for x >= 0, slope * x below; slope broadcasts onto x.
struct PReluOp {
  template <class T> ONNXTRAIN_HD T operator()(T x, T slope) const { return x < T(0) ? slope * x : x; }
};


// ---- GELU derivatives from the forward input x, (dY, X) -> dX (onnxtrain.GeluGrad / GeluTanhGrad) ------------
// One formula each, formulas/gelu.h: the CUDA kernels call operator(), the CPU kernels evaluate `formula` on
// Eigen arrays (executor/cpu/activation.cpp, fused_elementwise.cpp), and gradients/fused.cpp evaluates the same
// template on function-body values to write the fused op's ONNX body, which the tests run against these kernels.
//   erf:  Phi(x) + x phi(x)
//   tanh: (1 + t)/2 + x/2 (1 - t^2) k (1 + 3c x^2),  t = tanh(k (x + c x^3)), k = sqrt(2/pi), c = 0.044715
struct GeluErfGradFn {
  template <class M, class V, class T> ONNXTRAIN_HD static auto formula(const V& dy, const V& x) {
    return formulas::gelu_erf_grad<M, V, T>(dy, x);
  }
  template <class T> ONNXTRAIN_HD T operator()(T dy, T x) const { return formula<ScalarMath, T, T>(dy, x); }
};
struct GeluTanhGradFn {
  template <class M, class V, class T> ONNXTRAIN_HD static auto formula(const V& dy, const V& x) {
    return formulas::gelu_tanh_grad<M, V, T>(dy, x);
  }
  template <class T> ONNXTRAIN_HD T operator()(T dy, T x) const { return formula<ScalarMath, T, T>(dy, x); }
};

// ---- reductions (ReduceSum ... ReduceLogSumExp; executor/cpu/reduce.cpp, executor/cuda/reduce.cu) -----------
// Each op is pre() on every element, combine() of the results, post() on the total. LogSumExp's pre/post take
// a per-output shift (the max, or 0 when the max is not finite) so large inputs do not overflow.
enum class ReduceKind { Sum, Mean, Max, Min, Prod, SumSquare, L1, L2, LogSum, LogSumExp };
enum class ReduceCombine { Add, Mul, Max, Min };

ONNXTRAIN_HD constexpr ReduceCombine reduce_combine_of(ReduceKind k) {
  switch (k) {
    case ReduceKind::Max: return ReduceCombine::Max;
    case ReduceKind::Min: return ReduceCombine::Min;
    case ReduceKind::Prod: return ReduceCombine::Mul;
    default: return ReduceCombine::Add;
  }
}

template <ReduceKind K> struct ReduceFn {
  template <class T> ONNXTRAIN_HD T combine(T a, T b) const {
    switch (reduce_combine_of(K)) {
      case ReduceCombine::Add: return a + b;
      case ReduceCombine::Mul: return a * b;
      case ReduceCombine::Max: return b > a ? b : a;
      case ReduceCombine::Min: return b < a ? b : a;
    }
    return a;
  }
  template <class T> ONNXTRAIN_HD T pre(T x, T shift) const {
    switch (K) {
      case ReduceKind::SumSquare:
      case ReduceKind::L2: return x * x;
      case ReduceKind::L1:
        if constexpr (std::is_unsigned_v<T>) return x;
        else return x < T(0) ? T(-x) : x;
      case ReduceKind::LogSumExp: return static_cast<T>(std::exp(static_cast<double>(x - shift)));
      default: return x;
    }
  }
  template <class T> ONNXTRAIN_HD T post(T acc, int64_t n, T shift) const {
    switch (K) {
      case ReduceKind::Mean:
        // Integer mean of an empty set would divide by zero; floats give NaN like numpy.
        if constexpr (std::is_integral_v<T>) return n == 0 ? T(0) : static_cast<T>(acc / static_cast<T>(n));
        else return acc / static_cast<T>(n);
      case ReduceKind::L2: return static_cast<T>(std::sqrt(static_cast<double>(acc)));
      case ReduceKind::LogSum: return static_cast<T>(std::log(static_cast<double>(acc)));
      case ReduceKind::LogSumExp: return static_cast<T>(std::log(static_cast<double>(acc)) + shift);
      default: return acc;
    }
  }
};

// The identity of the combine, as a host-side constant the kernels receive.
template <class T> T reduce_init(ReduceKind k) {
  switch (reduce_combine_of(k)) {
    case ReduceCombine::Add: return T(0);
    case ReduceCombine::Mul: return T(1);
    case ReduceCombine::Max:
      return std::numeric_limits<T>::has_infinity ? -std::numeric_limits<T>::infinity() : std::numeric_limits<T>::lowest();
    case ReduceCombine::Min:
      return std::numeric_limits<T>::has_infinity ? std::numeric_limits<T>::infinity() : std::numeric_limits<T>::max();
  }
  return T(0);
}

// LogSumExp's shift from the max: an infinite max (all -inf, or an empty set) shifts by 0 so inf - inf never
// makes a NaN.
template <class T> ONNXTRAIN_HD T logsumexp_shift(T max) {
  return std::isfinite(static_cast<double>(max)) ? max : T(0);
}

// ArgMax/ArgMin: does v replace the current best? select_last_index makes ties move to the later index.
template <bool IsMax, class T> ONNXTRAIN_HD bool arg_better(T v, T best, bool last) {
  return IsMax ? (last ? v >= best : v > best) : (last ? v <= best : v < best);
}

// ---- NegativeLogLikelihoodLoss / SoftmaxCrossEntropyLoss (executor/cpu/loss.cpp, executor/cuda/loss.cu) -------
// One target element: its weight w (weight[t] or 1; 0 when t is ignore_index) and loss -w * logp[t], class j of
// this element being logp[j * stride]. Both
// accumulate in double on either side. A target outside [0, C) is an error on the CPU (checked before this
// is called); the device cannot throw, so there it yields a NaN loss.
struct NllTerm {
  double w, loss;
};
template <class T>
ONNXTRAIN_HD NllTerm nll_term(int64_t t, int64_t classes, const T* weight, const T* logp, int64_t stride,
                              bool has_ignore, int64_t ignore) {
  if (has_ignore && t == ignore) return {0.0, 0.0};
  if (t < 0 || t >= classes) return {0.0, static_cast<double>(NAN)};
  const double w = weight ? static_cast<double>(weight[t]) : 1.0;
  return {w, -w * static_cast<double>(logp[t * stride])};
}

// ---- optimizer updates (ai.onnx.preview.training, executor/cpu/training_ops.cpp) ----------------------------
// One element of one optimized tensor per call. The step-dependent scalars (bias-corrected rate, Momentum's
// first-step beta) are computed once per run on the host, in double, by the *_coefficients functions below;
// the element maths runs in the tensors' own dtype on either side.

// The element maths is formulas/optimizer_updates.h's (the spec's Momentum is also the optimizer's SGD
// `convention: onnx`, and its Adagrad is torch's with an L2 term); these hold the per-run scalars.
template <class T> struct MomentumStep {
  T r, alpha, beta, norm;
  bool nesterov;
  ONNXTRAIN_HD void operator()(T x, T g, T v, T& x_new, T& v_new) const {
    const formulas::OnnxMomentumScalars<T> s{r, norm, alpha, beta};
    const formulas::OnnxMomentumState<T> o =
        nesterov ? formulas::onnx_momentum_update<true>(x, g, v, s) : formulas::onnx_momentum_update<false>(x, g, v, s);
    x_new = o.p;
    v_new = o.v;
  }
};
// The first update (T = 0) takes the whole gradient, per the spec: V starts from zero.
template <class T>
ONNXTRAIN_HD MomentumStep<T> momentum_step(double r, int64_t t, double alpha, double beta, double norm, bool nesterov) {
  return {static_cast<T>(r), static_cast<T>(alpha), static_cast<T>(t > 0 ? beta : 1.0), static_cast<T>(norm),
          nesterov};
}

template <class T> struct AdamStep {
  formulas::OnnxAdamScalars<T> s;
  ONNXTRAIN_HD void operator()(T x, T g, T v, T h, T& x_new, T& v_new, T& h_new) const {
    const formulas::OnnxAdamState<T> o = formulas::onnx_adam_update(x, g, v, h, s);
    x_new = o.p;
    v_new = o.m;
    h_new = o.v;
  }
};
// Bias correction folds into the rate; T = 0 means "no correction", per the spec.
template <class T>
ONNXTRAIN_HD AdamStep<T> adam_step(double r, int64_t t, double alpha, double beta, double eps, double norm, double norm_post) {
  const double td = static_cast<double>(t);
  const double rate = t > 0 ? r * std::sqrt(1.0 - std::pow(beta, td)) / (1.0 - std::pow(alpha, td)) : r;
  return {{static_cast<T>(rate), static_cast<T>(alpha), static_cast<T>(1.0 - alpha), static_cast<T>(beta),
           static_cast<T>(1.0 - beta), static_cast<T>(eps), static_cast<T>(norm), static_cast<T>(1.0 - norm_post)}};
}

template <class T> struct AdagradStep {
  formulas::AdagradScalars<T> s;  // clr = the decayed rate, decay = norm_coefficient
  ONNXTRAIN_HD void operator()(T x, T g, T h, T& x_new, T& h_new) const {
    const formulas::AdagradState<T> o = formulas::adagrad_update<true>(x, g, h, s);
    x_new = o.p;
    h_new = o.sum;
  }
};
template <class T>
ONNXTRAIN_HD AdagradStep<T> adagrad_step(double r, int64_t t, double decay, double eps, double norm) {
  return {{static_cast<T>(r / (1.0 + static_cast<double>(t) * decay)), static_cast<T>(eps), static_cast<T>(norm)}};
}

}  // namespace onnxtrain
