#pragma once
// Helpers shared by the Yield-boundary tests (ForwardBackwardSession, TrainingSession::run_forward/run_backward,
// torch parity).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>

#include "common/test_env.h"
#include "executor/tensor.h"
#include "graph/error.h"

namespace onnxtrain::test {

inline std::filesystem::path make_mlp(const std::filesystem::path& dir, const std::string& sizes) {
  auto path = dir / "mlp.onnx";
  std::string cmd = std::string(ONNXTRAIN_PYTHON) + " " + (test::source_dir() / "examples/make_mlp.py").string() + " " +
                    path.string() + " --sizes " + sizes + " > /dev/null";
  if (std::system(cmd.c_str()) != 0) throw std::runtime_error("failed: " + cmd);
  return path;
}

template <class T>
Tensor random_tensor(DType dt, std::vector<int64_t> shape, unsigned seed, double scale = 1.0) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> nd;
  Tensor t = Tensor::empty(dt, std::move(shape));
  for (T& v : t.span<T>()) v = static_cast<T>(scale * nd(rng));
  return t;
}

// Largest elementwise difference relative to the reference's largest magnitude.
template <class T>
double rel_diff(const Tensor& a, const Tensor& ref) {
  EXPECT_EQ(a.shape, ref.shape);
  EXPECT_EQ(a.dtype, ref.dtype);
  double diff = 0, mag = 0;
  auto x = a.span<T>();
  auto y = ref.span<T>();
  for (size_t i = 0; i < y.size() && i < x.size(); ++i) {
    diff = std::max(diff, std::abs(double(x[i]) - double(y[i])));
    mag = std::max(mag, std::abs(double(y[i])));
  }
  return mag == 0 ? diff : diff / mag;
}

inline double max_abs(const Tensor& t) {
  double m = 0;
  for (float v : t.span<float>()) m = std::max(m, double(std::abs(v)));
  return m;
}

// d mean((y - t)^2) / dy, written out by hand: 2 (y - t) / numel.
inline Tensor mse_grad(const Tensor& y, const Tensor& t) {
  Tensor g = Tensor::empty(DType::Float32, y.shape);
  const double n = double(y.numel());
  for (int64_t i = 0; i < y.numel(); ++i) g.ptr<float>()[i] = float(2.0 * (double(y.ptr<float>()[i]) - t.ptr<float>()[i]) / n);
  return g;
}

inline Tensor zeros(DType dt, std::vector<int64_t> shape) {
  Tensor z = Tensor::empty(dt, std::move(shape));
  std::memset(z.data, 0, z.nbytes());
  return z;
}

inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no onnxtrain::Error thrown)";
}

}  // namespace onnxtrain::test
