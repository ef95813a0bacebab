#pragma once
// Shared by the data-parallel tests and their MPI worker (dist_worker): one synthetic data set, the training
// configurations checked, and batching through DistributedSampler, so the single-process reference and the
// ranks read exactly the same samples.
#include <cstdint>
#include <string>
#include <vector>

#include "training/sampler.h"
#include "training/session.h"

namespace onnxtrain::test {

struct Dataset {
  Tensor x, y;  // float32 [n, features], [n, 1]
};
// Deterministic regression data (the same on every rank).
Dataset make_dataset(int64_t n, int64_t features, uint64_t seed);

// "sgd_momentum", "adam", "adam_sum" (loss reduction sum), "sgd_accumulate" (2 micro-batches per update).
TrainingConfig dp_config(const std::string& name);

// How the ranks reduce (DataParallelSpec), the parameter of the equivalence tests: "overlap" (the default:
// AllReduceStart/AllReduceWait), "sync" (one blocking AllReduce per bucket); and "sums" (reduce only the
// accumulated gradients, once per update), "bfloat16" and "float16" (compression), each with overlap.
void set_dp_mode(DataParallelSpec& spec, const std::string& mode);
inline const char* const kDpModes[] = {"overlap", "sync"};

// Rows idx[begin, begin + count) of the data set as a batch for session s.
Feeds gather_batch(const Dataset& d, const std::vector<int64_t>& idx, int64_t begin, int64_t count,
                   const TrainingSession& s);

// Trains `steps` steps of `batch` samples per rank, reading this rank's shard (seed 7, shuffled) from the
// start of epoch 0; returns the loss train_step reported per step.
std::vector<float> train_shard(TrainingSession& s, const Dataset& d, int rank, int world, int steps, int64_t batch);

}  // namespace onnxtrain::test
