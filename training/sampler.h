#pragma once
// DistributedSampler: which samples each rank reads in an epoch. Every rank uses the same seed, so they agree
// on one permutation of the data set per epoch; rank r takes positions r, r + N, r + 2N, ... of it (N ranks).
// Hence batch k of every rank, b samples each, together hold exactly positions [k·N·b, (k+1)·N·b) of the
// permutation: the samples a single process reads in its batch k of N·b. With a mean loss, N ranks then
// take the same steps as one process with N times the batch (docs/distributed.md).
//
// The permutation is Fisher-Yates driven by SplitMix64 seeded with (seed, epoch): the same on every platform
// and compiler (std::shuffle is not), so it can be reproduced from its definition in docs/distributed.md.
#include <cstdint>
#include <vector>

namespace onnxtrain {

struct SamplerOptions {
  bool shuffle = true;     // false: the permutation is the identity
  uint64_t seed = 0;       // shared by every rank
  // Data sets whose size is not a multiple of the number of ranks: false pads by repeating the permutation's
  // first samples so every rank has the same count (torch's default); true drops the tail instead.
  bool drop_last = false;
};

class DistributedSampler {
 public:
  DistributedSampler(int64_t dataset_size, int rank, int world_size, SamplerOptions options = {});

  // Selects the epoch's permutation; call at the start of each epoch.
  void set_epoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }
  // This rank's sample indices for the current epoch, in reading order; num_samples() of them.
  std::vector<int64_t> indices() const;
  // Samples per rank per epoch (the same on every rank).
  int64_t num_samples() const { return per_rank_; }
  // The whole epoch's permutation of [0, dataset_size), before padding or dropping.
  std::vector<int64_t> permutation() const;

 private:
  int64_t size_;
  int rank_, world_;
  SamplerOptions opts_;
  int64_t per_rank_;
  int64_t epoch_ = 0;
};

}  // namespace onnxtrain
