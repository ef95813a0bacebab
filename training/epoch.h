#pragma once
// One epoch of mini-batch training driven natively over whole-data-set arrays: the loop the scikit-learn
// estimators ran in Python (slice the batch, build the feeds, call train_step, read the loss back). For a small
// network that Python work cost as much as the step itself (docs/performance.md, "W1-sk").
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "training/session_interface.h"

namespace onnxtrain {

struct EpochSpec {
  int64_t batch_size = 0;  // rows per step; the last batch of the epoch takes what is left
  // Row indices in the order they are fed (a shuffle drawn by the caller); empty = rows 0..n-1 in order, fed as
  // views of the data with no copy. Rows named here are gathered into buffers reused by every step.
  std::vector<int64_t> order;
  // When not empty: the feed that receives each batch's per-sample weights. Each batch's raw weights (1 for
  // every sample when none are given) are scaled to sum to the batch's row count (`weights_sum_to_one` false:
  // losses that divide by the count themselves) or to 1 (true: "sum" losses), as scikit-learn's weighted mean.
  std::string sample_weight_feed;
  bool weights_sum_to_one = false;
  // Trainable weights whose total sum of squares is reported for every batch, read before its step (the L2
  // term scikit-learn adds to the reported loss).
  std::vector<std::string> squares_of;
  // Called before every step; may throw to stop the epoch (the Python binding checks for Ctrl-C here).
  std::function<void()> before_step;
};

// Per batch, in order.
struct EpochResult {
  std::vector<float> losses;        // train_step's loss (NaN for a step skipped with on_non_finite = "skip")
  std::vector<int64_t> rows;        // batch size
  std::vector<double> weight_sums;  // the batch's raw sample weights summed (= rows without weights)
  std::vector<double> squares;      // sum of squares of squares_of before the step; empty when none asked
};

// `data`: one array per feed, all with the same number of rows (dimension 0), on the host; `sample_weight`:
// null or one raw weight per row (float32 or float64). Errors name the feed, index or weight at fault. A step
// that throws (a non-finite loss with on_non_finite = "raise", before_step) ends the epoch there: the steps
// before it were applied.
// Any session kind: replicas split each batch across them.
EpochResult train_epoch(Session& session, const Feeds& data, const Tensor* sample_weight, const EpochSpec& spec);

}  // namespace onnxtrain
