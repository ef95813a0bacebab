#include "training/sampler.h"

#include <algorithm>
#include <numeric>
#include <string>

#include "graph/error.h"

namespace onnxtrain {

namespace {

// SplitMix64 (Steele, Lea, Flood 2014): tiny, well mixed, and trivially reimplemented elsewhere.
struct SplitMix64 {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n) without modulo bias: rejects the top partial range.
  uint64_t below(uint64_t n) {
    const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    for (;;)
      if (uint64_t x = next(); x < limit) return x % n;
  }
};

}  // namespace

DistributedSampler::DistributedSampler(int64_t dataset_size, int rank, int world_size, SamplerOptions options)
    : size_(dataset_size), rank_(rank), world_(world_size), opts_(options) {
  if (world_size < 1) fail("DistributedSampler", "world size must be >= 1, got " + std::to_string(world_size));
  if (rank < 0 || rank >= world_size)
    fail("DistributedSampler", "rank " + std::to_string(rank) + " is not in [0, " + std::to_string(world_size) + ")");
  if (dataset_size < 0) fail("DistributedSampler", "data set size must be >= 0, got " + std::to_string(dataset_size));
  per_rank_ = opts_.drop_last ? size_ / world_ : (size_ + world_ - 1) / world_;
}

std::vector<int64_t> DistributedSampler::permutation() const {
  std::vector<int64_t> p(static_cast<size_t>(size_));
  std::iota(p.begin(), p.end(), int64_t{0});
  if (!opts_.shuffle) return p;
  // Seeded from both, so epochs differ and nearby seeds do not give shifted streams.
  SplitMix64 rng{opts_.seed};
  rng.state = rng.next() ^ static_cast<uint64_t>(epoch_);
  for (int64_t i = size_ - 1; i > 0; --i) std::swap(p[i], p[rng.below(static_cast<uint64_t>(i) + 1)]);
  return p;
}

std::vector<int64_t> DistributedSampler::indices() const {
  const std::vector<int64_t> p = permutation();
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(per_rank_));
  // Padding wraps around the permutation (possibly more than once for tiny data sets).
  for (int64_t k = 0; k < per_rank_; ++k) mine.push_back(p[static_cast<size_t>((rank_ + k * world_) % std::max<int64_t>(size_, 1))]);
  return mine;
}

}  // namespace onnxtrain
