#pragma once
// Vectorised elementwise maps for the CPU kernels. GCC does not vectorise calls to std::exp/erf/tanh/log, so a
// scalar loop over the functors of executor/functors.h spends most of its time in libm (scalar erff was 12% of
// the transformer workload). Eigen's packet maths evaluates the same functions 8-16 floats at a time, within a
// few ulp. The functors stay the reference: the node tests compare these kernels against them.
// GCC 12 warns falsely inside its own AVX-512 intrinsics when Eigen vectorises; that is noise.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <Eigen/Core>
#include <unsupported/Eigen/SpecialFunctions>
#pragma GCC diagnostic pop

#include <cmath>
#include <numbers>

#include "executor/broadcast.h"
#include "executor/functors.h"
#include "executor/kernel.h"

namespace onnxtrain::cpu {

template <class T> using EigenArray = Eigen::Array<T, Eigen::Dynamic, 1>;

// y = Op::eval(x) over contiguous memory, threaded above `grain` elements. Op::eval takes an Eigen array
// expression and returns one.
template <class Op, class T> class EigenMapKernel final : public Kernel {
 public:
  explicit EigenMapKernel(int64_t grain) : grain_(grain) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const T* x = in[0]->ptr<T>();
    T* y = out[0]->ptr<T>();
    parallel_chunks(out[0]->numel(), grain_, [&](int64_t s, int64_t e) {
      Eigen::Map<EigenArray<T>>(y + s, e - s) = Op::eval(Eigen::Map<const EigenArray<T>>(x + s, e - s));
    });
  }

 private:
  int64_t grain_;
};

struct EigenExp {
  template <class A> static auto eval(const A& x) { return x.exp(); }
};
struct EigenLog {
  template <class A> static auto eval(const A& x) { return x.log(); }
};
struct EigenTanh {
  template <class A> static auto eval(const A& x) { return x.tanh(); }
};
struct EigenSigmoid {
  template <class A> static auto eval(const A& x) { return x.logistic(); }
};
// Not sqrt: with EIGEN_FAST_MATH (Eigen's default) its AVX-512 sqrt is rsqrt14 plus one Newton step, not correctly
// rounded, which moved Adam's weights past the 2-rank vs 1-process equivalence tolerance (test_mpirun.cpp).
struct EigenErf {
  template <class A> static auto eval(const A& x) { return x.erf(); }
};
// The maths of a functor's `formula` (executor/functors.h: GELU and its derivatives) for Eigen array expressions,
// so the formula written once there runs vectorised here.
struct EigenMath {
  template <class A> static auto erf(const A& x) { return x.erf(); }
  template <class A> static auto exp(const A& x) { return x.exp(); }
  template <class A> static auto tanh(const A& x) { return x.tanh(); }
  template <class A> static auto square(const A& x) { return x.square(); }
};
// Fn::formula as an EigenMapKernel op (one operand) or a two-operand one (dY, X).
template <class Fn> struct EigenFormula {
  template <class A> static auto eval(const A& x) { return Fn::template formula<EigenMath, A, typename A::Scalar>(x); }
  template <class A> static auto eval(const A& a, const A& b) {
    return Fn::template formula<EigenMath, A, typename A::Scalar>(a, b);
  }
};
using EigenGelu = EigenFormula<GeluOp>;
using EigenGeluTanh = EigenFormula<GeluTanhOp>;

// Sum of n values in double (softmax rows of thousands of floats lose digits in float), in kLanes interleaved
// partial sums: the compiler keeps them in 2-4 vector registers, so the additions are not one dependent
// chain. (Four partial sums fill a single AVX register, and that chain was LogSoftmaxGrad's slowest part:
// docs/performance.md.)
inline constexpr int64_t kLanes = 16;
template <class T> double sum_as_double(const T* p, int64_t n) {
  double a[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int64_t k = 0; k < kLanes; ++k) a[k] += static_cast<double>(p[j + k]);
  for (; j < n; ++j) a[0] += static_cast<double>(p[j]);
  double s = 0;
  for (double v : a) s += v;
  return s;
}
// The same for the dot product of two rows.
template <class T> double dot_as_double(const T* p, const T* q, int64_t n) {
  double a[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int64_t k = 0; k < kLanes; ++k) a[k] += static_cast<double>(p[j + k]) * static_cast<double>(q[j + k]);
  for (; j < n; ++j) a[0] += static_cast<double>(p[j]) * static_cast<double>(q[j]);
  double s = 0;
  for (double v : a) s += v;
  return s;
}

}  // namespace onnxtrain::cpu
