#pragma once
// The examples' learnable synthetic regression: y = tanh(x . a) + 0.5 * sin(x . b) for fixed random directions
// a, b and standard normal x. The same seed gives the same data on every process (and every rank).
#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include "executor/tensor.h"

namespace onnxtrain::examples {

// x float32 [samples, features], y float32 [samples, 1].
inline std::pair<Tensor, Tensor> make_regression(int64_t samples, int64_t features, unsigned seed = 42) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> dir_a(features), dir_b(features);
  for (auto& v : dir_a) v = nd(rng) / std::sqrt(float(features));
  for (auto& v : dir_b) v = nd(rng) / std::sqrt(float(features));
  Tensor x = Tensor::empty(DType::Float32, {samples, features});
  Tensor y = Tensor::empty(DType::Float32, {samples, 1});
  for (int64_t i = 0; i < samples; ++i) {
    float pa = 0, pb = 0;
    for (int64_t f = 0; f < features; ++f) {
      float v = nd(rng);
      x.ptr<float>()[i * features + f] = v;
      pa += v * dir_a[f];
      pb += v * dir_b[f];
    }
    y.ptr<float>()[i] = std::tanh(pa) + 0.5f * std::sin(pb);
  }
  return {std::move(x), std::move(y)};
}

}  // namespace onnxtrain::examples
