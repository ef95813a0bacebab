// The Sqrt kernel's vector instructions (executor/cpu/unary.cpp) must give std::sqrt's results bit for bit (both
// are correctly rounded), in the vector body and the scalar tail, and NaN exactly where std::sqrt does.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "executor/kernel_test_util.h"

namespace onnxtrain {
namespace {

template <class T>
void check_sqrt_bit_exact() {
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> expo(-30, 30);
  std::vector<T> in;
  for (int i = 0; i < 1003; ++i) in.push_back(static_cast<T>(std::exp(expo(rng))));  // not a multiple of 16
  for (T special : {T(0), T(-0.0), std::numeric_limits<T>::denorm_min(), std::numeric_limits<T>::max(),
                    std::numeric_limits<T>::infinity(), T(-1), -std::numeric_limits<T>::infinity(),
                    std::numeric_limits<T>::quiet_NaN()})
    in.insert(in.begin() + 5, special);  // inside the first vector
  in.push_back(T(-2));                     // and in the tail
  Tensor x = Tensor::from_vector<T>({static_cast<int64_t>(in.size())}, in);
  Tensor y = test::run1(test::make_node("Sqrt", 1), 13, {&x});
  ASSERT_EQ(y.numel(), x.numel());
  for (size_t i = 0; i < in.size(); ++i) {
    const T got = y.ptr<T>()[i], want = std::sqrt(in[i]);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << "sqrt(" << in[i] << ")";
    } else {
      EXPECT_EQ(std::memcmp(&got, &want, sizeof(T)), 0) << "sqrt(" << in[i] << ") = " << got << ", want " << want;
    }
  }
}

TEST(SqrtKernel, BitExactAgainstStdSqrt) {
  check_sqrt_bit_exact<float>();
  check_sqrt_bit_exact<double>();
}

}  // namespace
}  // namespace onnxtrain
