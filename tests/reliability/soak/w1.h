#pragma once
// The W1 leak test's workload (test_soak_w1.cpp): W1 of the shared benchmark (benchmarks/bench_train.cpp) on
// synthetic batches, and the process's resident set.
#include <cstdio>
#include <random>
#include <vector>

#include "training/session.h"

namespace onnxtrain::soak {

// Resident set size in kB from /proc/self/statm (pages), or -1 when unavailable.
inline long rss_kb() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return -1;
  long size = 0, resident = 0;
  const int n = std::fscanf(f, "%ld %ld", &size, &resident);
  std::fclose(f);
  return n == 2 ? resident * 4 : -1;
}

// W1's configuration: MSE (the default loss), Adam lr 1e-3.
inline TrainingConfig w1_config() {
  TrainingConfig c;
  c.optimizer.kind = "adam";
  c.optimizer.learning_rate = 1e-3;
  return c;
}

// `count` batches of 128 standard-normal samples (x [128, 64], target [128, 1]), fixed by the seed.
inline std::vector<Feeds> w1_batches(const TrainingSession& s, int count, unsigned seed = 0) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  auto random = [&](std::vector<int64_t> shape) {
    Tensor t = Tensor::empty(DType::Float32, std::move(shape));
    for (float& v : t.span<float>()) v = d(rng);
    return t;
  };
  std::vector<Feeds> batches;
  for (int i = 0; i < count; ++i) batches.push_back({{"x", random({128, 64})}, {s.target_name(), random({128, 1})}});
  return batches;
}

}  // namespace onnxtrain::soak
