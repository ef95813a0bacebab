// DistributedSampler: shards partition the epoch, agree across ranks, and make N ranks' batches the single
// process's batches of N times the size.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "training/sampler.h"
#include "graph/error.h"

namespace onnxtrain {
namespace {

std::vector<std::vector<int64_t>> shards(int64_t n, int world, SamplerOptions o, int64_t epoch = 0) {
  std::vector<std::vector<int64_t>> s;
  for (int r = 0; r < world; ++r) {
    DistributedSampler d(n, r, world, o);
    d.set_epoch(epoch);
    s.push_back(d.indices());
  }
  return s;
}

TEST(DistributedSampler, ShardsPartitionAShuffledEpoch) {
  SamplerOptions o;
  o.seed = 11;
  auto s = shards(100, 4, o);
  std::multiset<int64_t> all;
  for (const auto& sh : s) {
    EXPECT_EQ(sh.size(), 25u);
    all.insert(sh.begin(), sh.end());
  }
  std::vector<int64_t> sorted(all.begin(), all.end()), expect(100);
  for (int64_t i = 0; i < 100; ++i) expect[size_t(i)] = i;
  EXPECT_EQ(sorted, expect) << "every sample exactly once";
  EXPECT_NE(s[0], (std::vector<int64_t>{0, 4, 8, 12, 16, 20, 24, 28, 32, 36, 40, 44, 48, 52, 56, 60, 64, 68, 72, 76,
                                        80, 84, 88, 92, 96}))
      << "shuffled";
}

TEST(DistributedSampler, SameSeedSameOrderNewEpochNewOrder) {
  SamplerOptions o;
  o.seed = 5;
  EXPECT_EQ(shards(50, 2, o), shards(50, 2, o));
  EXPECT_NE(shards(50, 2, o, 0), shards(50, 2, o, 1));
  SamplerOptions other = o;
  other.seed = 6;
  EXPECT_NE(shards(50, 2, o), shards(50, 2, other));
}

TEST(DistributedSampler, PermutationIsPinned) {
  // The algorithm is documented (docs/distributed.md) so other languages can reproduce it; these values pin it.
  SamplerOptions o;
  o.seed = 0;
  DistributedSampler d(10, 0, 1, o);
  const std::vector<int64_t> p = d.permutation();
  std::vector<int64_t> sorted = p;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(p, DistributedSampler(10, 0, 1, o).permutation());
  // Computed by the Python transcription of the algorithm in docs/distributed.md.
  EXPECT_EQ(p, (std::vector<int64_t>{0, 1, 4, 6, 3, 9, 8, 7, 2, 5}));
}

TEST(DistributedSampler, RankBatchesTogetherAreTheSingleProcessBatch) {
  SamplerOptions o;
  o.seed = 3;
  const int world = 3;
  const int64_t b = 4;
  DistributedSampler single(120, 0, 1, o);
  const std::vector<int64_t> global = single.indices();
  auto s = shards(120, world, o);
  for (int64_t k = 0; k < 120 / (world * b); ++k) {
    std::set<int64_t> ranks, one(global.begin() + k * world * b, global.begin() + (k + 1) * world * b);
    for (const auto& sh : s) ranks.insert(sh.begin() + k * b, sh.begin() + (k + 1) * b);
    EXPECT_EQ(ranks, one) << "batch " << k;
  }
}

TEST(DistributedSampler, UnevenSizesPadOrDrop) {
  SamplerOptions o;
  o.shuffle = false;
  auto padded = shards(10, 4, o);
  EXPECT_EQ(padded[0], (std::vector<int64_t>{0, 4, 8}));
  EXPECT_EQ(padded[2], (std::vector<int64_t>{2, 6, 0}));  // wraps to the start
  EXPECT_EQ(padded[3], (std::vector<int64_t>{3, 7, 1}));
  o.drop_last = true;
  auto dropped = shards(10, 4, o);
  for (const auto& sh : dropped) EXPECT_EQ(sh.size(), 2u);
  EXPECT_EQ(dropped[3], (std::vector<int64_t>{3, 7}));
  EXPECT_EQ(shards(2, 4, SamplerOptions{false, 0, false})[3], (std::vector<int64_t>{1}));  // tiny: wraps again
  EXPECT_TRUE(shards(0, 2, SamplerOptions{})[1].empty());
}

TEST(DistributedSampler, BadArgumentsAreClearErrors) {
  EXPECT_THROW(DistributedSampler(10, 2, 2), Error);
  EXPECT_THROW(DistributedSampler(10, 0, 0), Error);
  EXPECT_THROW(DistributedSampler(-1, 0, 1), Error);
  try {
    DistributedSampler(10, 3, 2);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 3 is not in [0, 2)"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace onnxtrain
