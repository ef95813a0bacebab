// count_non_finite's vectorised pre-check (any all-ones exponent) must find a single NaN or Inf wherever it is:
// in the vector body or the scalar tail, with finite extremes (max, denormals, -0) never counted.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "executor/finite.h"

namespace onnxtrain {
namespace {

template <class T>
void check_every_position(DType dtype) {
  const int64_t n = 1000;  // not a multiple of any vector width
  Tensor t = Tensor::empty(dtype, {n});
  T* p = t.ptr<T>();
  for (int64_t i = 0; i < n; ++i)
    p[i] = i % 4 == 0 ? std::numeric_limits<T>::max() : i % 4 == 1 ? std::numeric_limits<T>::denorm_min()
         : i % 4 == 2 ? T(-0.0) : -std::numeric_limits<T>::max();
  EXPECT_EQ(count_non_finite(t).count, 0);
  for (int64_t at : {int64_t{0}, int64_t{7}, int64_t{63}, int64_t{500}, n - 9, n - 1}) {
    for (T bad : {std::numeric_limits<T>::quiet_NaN(), std::numeric_limits<T>::infinity(),
                  -std::numeric_limits<T>::infinity()}) {
      const T saved = p[at];
      p[at] = bad;
      NonFiniteCount c = count_non_finite(t);
      EXPECT_EQ(c.count, 1) << "at " << at;
      EXPECT_EQ(c.first, at);
      p[at] = saved;
    }
  }
}

TEST(CountNonFinite, FindsOneBadValueAnywhereInALargeTensor) {
  check_every_position<float>(DType::Float32);
  check_every_position<double>(DType::Float64);
}

}  // namespace
}  // namespace onnxtrain
