#pragma once
// In-memory training data: readers for .npy, .npz and .csv files, a Sampler that decides the order of the
// samples, and a DataLoader that cuts batches. The first axis of every array is the sample axis. docs/trainer.md
// has the file formats and the shuffling algorithm.
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "executor/tensor.h"
#include "training/session.h"

namespace onnxtrain {

// Named arrays with a common first axis (the samples).
using Dataset = std::map<std::string, Tensor>;

// numpy's .npy: little-endian bool, (u)int8/16/32/64, float32/64, C order. Errors name the path.
Tensor read_npy(const std::filesystem::path& path);
// np.savez and np.savez_compressed archives (zip, stored or deflated, zip64): arrays by name (".npy" dropped).
Dataset read_npz(const std::filesystem::path& path);

struct CsvOptions {
  char delimiter = ',';
  bool header = true;  // false: columns are named "0", "1", ...
};
// Every column as a float64 array of shape [rows]; empty fields are errors naming the row and column.
Dataset read_csv(const std::filesystem::path& path, const CsvOptions& opts = {});

// By extension: .npy (one array named after the file stem), .npz, .csv.
Dataset read_data_file(const std::filesystem::path& path, const CsvOptions& csv = {});

// Element conversion between the numeric dtypes (bool, integers, float32/64).
Tensor convert(const Tensor& t, DType to);
// Rows [begin, end) of the first axis, as an owning copy.
Tensor slice_rows(const Tensor& t, int64_t begin, int64_t end);
// Rows `rows` of the first axis gathered into `out` (whose first dimension is rows.size()).
void gather_rows(const Tensor& t, std::span<const int64_t> rows, Tensor& out);

// The order in which an epoch visits the samples. The trainer asks for each epoch's indices, so a sharding
// sampler (one shard per data-parallel rank) can wrap another one without the trainer knowing.
class Sampler {
 public:
  virtual ~Sampler() = default;
  virtual std::vector<int64_t> indices(int64_t epoch) const = 0;
  virtual uint64_t seed() const { return 0; }
};

// The epoch's order from training/sampler.h's definition (Fisher-Yates driven by SplitMix64 seeded with
// (seed, epoch): the same on every platform, docs/distributed.md). With world_size > 1 it returns rank `rank`'s
// share, as DistributedSampler does; with the defaults, the whole permutation.
class RandomSampler : public Sampler {
 public:
  RandomSampler(int64_t size, bool shuffle, uint64_t seed, int rank = 0, int world_size = 1);
  std::vector<int64_t> indices(int64_t epoch) const override;
  uint64_t seed() const override { return seed_; }

 private:
  int64_t size_;
  bool shuffle_;
  uint64_t seed_;
  int rank_, world_;
};

// Batches of feeds from in-memory arrays. `feeds` maps each feed name (model input or loss target) to an array
// whose first axis has one row per sample; all arrays must have the same number of rows.
class DataLoader {
 public:
  DataLoader(std::map<std::string, Tensor> feeds, int64_t batch_size, std::shared_ptr<Sampler> sampler = nullptr,
             bool drop_last = false);

  int64_t size() const { return rows_; }
  int64_t batch_size() const { return batch_size_; }
  int64_t batches_per_epoch() const;
  const Sampler& sampler() const { return *sampler_; }
  const std::map<std::string, Tensor>& arrays() const { return arrays_; }

  // Fixes the order of an epoch; batch() then cuts it.
  void start_epoch(int64_t epoch);
  int64_t epoch() const { return epoch_; }
  // Batch b of the current epoch: views into buffers owned by the loader, valid until the next call.
  const Feeds& batch(int64_t b);

 private:
  std::map<std::string, Tensor> arrays_;
  int64_t rows_ = 0, batch_size_;
  std::shared_ptr<Sampler> sampler_;
  bool drop_last_;
  int64_t epoch_ = -1;
  std::vector<int64_t> order_;
  std::map<std::string, Tensor> buffers_;
  Feeds current_;
};

}  // namespace onnxtrain
