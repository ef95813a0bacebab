#pragma once
// GELU and its derivatives, written once as templates over three types: M supplies the element functions
// (erf, exp, tanh, square) for values of type V, and T is the type the constants are made in (T(0.5)). They are
// evaluated on scalars by the CUDA kernels (executor/functors.h's ScalarMath), on Eigen arrays by the CPU kernels
// (executor/cpu/eigen_map.h's EigenMath), and on function-body values by gradients/fused.cpp, which appends one
// standard ONNX node per operation: the body of onnxtrain.GeluGrad/GeluTanhGrad is this formula, not a copy of it.
//   Gelu, approximate = "none":  0.5 x (1 + erf(x / sqrt 2))
//   Gelu, approximate = "tanh":  0.5 x (1 + tanh(k (x + c x^3))),  k = sqrt(2/pi), c = 0.044715
//   d/dx, erf:   Phi(x) + x phi(x)
//   d/dx, tanh:  (1 + t)/2 + x/2 (1 - t^2) k (1 + 3c x^2),  t = tanh(k (x + c x^3))
// The gradients take (dY, X) and return dX = dY * d/dx.
#include "formulas/hd.h"

namespace onnxtrain::formulas {

template <class M, class V, class T> ONNXTRAIN_FORMULA_HD auto gelu_erf(const V& x) {
  return T(0.5) * x * (T(1) + M::erf(x * T(0.70710678118654752440)));
}

template <class M, class V, class T> ONNXTRAIN_FORMULA_HD auto gelu_tanh(const V& x) {
  return T(0.5) * x * (T(1) + M::tanh(T(0.79788456080286535588) * (x + T(0.044715) * M::square(x) * x)));
}

template <class M, class V, class T> ONNXTRAIN_FORMULA_HD auto gelu_erf_grad(const V& dy, const V& x) {
  const T rsqrt2 = T(0.70710678118654752440), rsqrt2pi = T(0.39894228040143267794);
  return dy * (T(0.5) * (T(1) + M::erf(x * rsqrt2)) + x * (M::exp(T(-0.5) * M::square(x)) * rsqrt2pi));
}

template <class M, class V, class T> ONNXTRAIN_FORMULA_HD auto gelu_tanh_grad(const V& dy, const V& x) {
  const T k = T(0.79788456080286535588), c = T(0.044715);
  const auto t = M::tanh(k * (x + c * M::square(x) * x));
  return dy * (T(0.5) * (T(1) + t) + T(0.5) * k * x * (T(1) - M::square(t)) * (T(1) + T(3) * c * M::square(x)));
}

}  // namespace onnxtrain::formulas
