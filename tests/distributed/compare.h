#pragma once
// How far a replica's weights are from the single-process reference; shared by the mpirun and thread-rank tests
// (test_threads_tsan includes this alone: it has no mpirun to launch).
#include <algorithm>
#include <cmath>
#include <span>

namespace onnxtrain::test {

// Largest |a - b| / |b| over the elements, with |b| floored at 1e-3 so near-zero weights do not dominate.
inline double max_relative(std::span<const float> a, std::span<const float> b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i)
    m = std::max(m, std::fabs(double(a[i]) - b[i]) / std::max(1e-3, std::fabs(double(b[i]))));
  return m;
}

}  // namespace onnxtrain::test
