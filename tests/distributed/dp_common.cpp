#include "dp_common.h"

#include <cmath>
#include <cstring>
#include <random>

#include "graph/error.h"

namespace onnxtrain::test {

Dataset make_dataset(int64_t n, int64_t features, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd;
  Dataset d{Tensor::empty(DType::Float32, {n, features}), Tensor::empty(DType::Float32, {n, 1})};
  std::vector<float> dir(static_cast<size_t>(features));
  for (float& v : dir) v = nd(rng) / std::sqrt(float(features));
  for (int64_t i = 0; i < n; ++i) {
    float dot = 0;
    for (int64_t f = 0; f < features; ++f) {
      const float v = nd(rng);
      d.x.ptr<float>()[i * features + f] = v;
      dot += v * dir[static_cast<size_t>(f)];
    }
    d.y.ptr<float>()[i] = std::tanh(dot) + 0.1f * nd(rng);
  }
  return d;
}

TrainingConfig dp_config(const std::string& name) {
  TrainingConfig c;
  c.loss.kind = "mse";
  if (name == "sgd_momentum") {
    c.optimizer.kind = "sgd";
    c.optimizer.learning_rate = 0.05;
    c.optimizer.momentum = 0.9;
  } else if (name == "adam" || name == "adam_sum") {
    c.optimizer.kind = "adam";
    c.optimizer.learning_rate = 0.01;
    if (name == "adam_sum") c.loss.reduction = "sum";
  } else if (name == "sgd_accumulate") {
    c.optimizer.kind = "sgd";
    c.optimizer.learning_rate = 0.05;
    c.optimizer.momentum = 0.5;
    c.optimizer.gradient_accumulation = 2;
    c.optimizer.max_grad_norm = 1.0;
  } else {
    fail("dp_config", "unknown configuration '" + name + "'");
  }
  return c;
}

void set_dp_mode(DataParallelSpec& spec, const std::string& mode) {
  if (mode == "overlap") spec.overlap = true;
  else if (mode == "sync") spec.overlap = false;
  else if (mode == "sums") spec.reduce_every_micro_batch = false;
  else if (mode == "bfloat16" || mode == "float16") spec.compression = mode;
  else fail("set_dp_mode", "unknown mode '" + mode + "'");
}

Feeds gather_batch(const Dataset& d, const std::vector<int64_t>& idx, int64_t begin, int64_t count,
                   const TrainingSession& s) {
  const int64_t f = d.x.shape[1];
  Tensor x = Tensor::empty(DType::Float32, {count, f});
  Tensor y = Tensor::empty(DType::Float32, {count, 1});
  for (int64_t i = 0; i < count; ++i) {
    const int64_t row = idx.at(static_cast<size_t>(begin + i));
    std::memcpy(x.ptr<float>() + i * f, d.x.ptr<float>() + row * f, sizeof(float) * static_cast<size_t>(f));
    y.ptr<float>()[i] = d.y.ptr<float>()[row];
  }
  return {{"x", x}, {s.target_name(), y}};
}

std::vector<float> train_shard(TrainingSession& s, const Dataset& d, int rank, int world, int steps, int64_t batch) {
  SamplerOptions so;
  so.seed = 7;
  DistributedSampler sampler(d.x.shape[0], rank, world, so);
  sampler.set_epoch(0);
  const std::vector<int64_t> idx = sampler.indices();
  if (int64_t(steps) * batch > sampler.num_samples()) fail("train_shard", "the data set is too small for these steps");
  std::vector<float> losses;
  for (int k = 0; k < steps; ++k) losses.push_back(s.train_step(gather_batch(d, idx, k * batch, batch, s)));
  return losses;
}

}  // namespace onnxtrain::test
