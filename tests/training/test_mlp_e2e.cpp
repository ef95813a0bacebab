// End to end: an MLP from an .onnx file trains (the loss falls at least 10x) and its first-step gradients
// match an independent numpy computation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <random>

#include "common/test_env.h"
#include "training/npy.h"
#include "training/session.h"

namespace onnxtrain {
namespace {

struct Data {
  Tensor x, y;
};

Data regression(int64_t n, int64_t f, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> a(f), b(f);
  for (auto& v : a) v = nd(rng) / std::sqrt(float(f));
  for (auto& v : b) v = nd(rng) / std::sqrt(float(f));
  Data d{Tensor::empty(DType::Float32, {n, f}), Tensor::empty(DType::Float32, {n, 1})};
  for (int64_t i = 0; i < n; ++i) {
    float pa = 0, pb = 0;
    for (int64_t k = 0; k < f; ++k) {
      float v = nd(rng);
      d.x.ptr<float>()[i * f + k] = v;
      pa += v * a[k];
      pb += v * b[k];
    }
    d.y.ptr<float>()[i] = std::tanh(pa) + 0.5f * std::sin(pb);
  }
  return d;
}

Feeds batch(const TrainingSession& s, Data& d, int64_t k, int64_t bs) {
  const int64_t f = d.x.shape[1];
  return {{"x", Tensor::view(DType::Float32, {bs, f}, d.x.ptr<float>() + k * bs * f)},
          {s.target_name(), Tensor::view(DType::Float32, {bs, 1}, d.y.ptr<float>() + k * bs)}};
}

TEST(MlpEndToEnd, FirstStepGradientsMatchNumpy) {
  auto dir = test::temp_dir("mlp_grads");
  TrainingSession s = TrainingSession::from_file(test::make_mlp(dir, "64 256 256 1"), {});
  Data d = regression(32, 64, 7);
  Feeds f = batch(s, d, 0, 32);
  auto g = s.gradients(f);
  write_npy(dir / "x.npy", f.at("x"));
  write_npy(dir / "target.npy", f.at(s.target_name()));
  write_npy(dir / "loss.npy", Tensor::from_vector<float>({}, {g.loss}));
  ASSERT_EQ(g.grads.size(), 6u);
  for (const auto& [name, t] : g.grads) write_npy(dir / (name + "_grad.npy"), t);
  std::string cmd = test::python() + " " +
                    (test::source_dir() / "tests/python/mlp_reference.py").string() + " " + dir.string();
  EXPECT_EQ(std::system(cmd.c_str()), 0) << "numpy disagrees with onnxtrain's gradients (see output above)";
  // gradients() must not update anything.
  auto again = s.gradients(f);
  EXPECT_EQ(again.loss, g.loss);
}

TEST(MlpEndToEnd, LossFallsTenfold) {
  auto dir = test::temp_dir("mlp_train");
  TrainingConfig cfg;
  cfg.optimizer.learning_rate = 0.05;
  TrainingSession s = TrainingSession::from_file(test::make_mlp(dir, "64 256 256 1"), cfg);
  const int64_t n = 4096, bs = 64;
  Data d = regression(n, 64, 11);
  auto full_loss = [&] {
    Tensor pred = s.infer({{"x", d.x}}).at(0);
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += std::pow(pred.ptr<float>()[i] - d.y.ptr<float>()[i], 2);
    return sum / n;
  };
  const double before = full_loss();
  for (int epoch = 0; epoch < 15; ++epoch)
    for (int64_t k = 0; k < n / bs; ++k) s.train_step(batch(s, d, k, bs));
  const double after = full_loss();
  std::printf("MSE before %.5f after %.5f (ratio %.1f)\n", before, after, before / after);
  EXPECT_LT(after * 10, before);
}

}  // namespace
}  // namespace onnxtrain
