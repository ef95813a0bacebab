#pragma once
// Class-index targets (cross_entropy / nll with target_format "indices") are turned into one-hot masks by
// equality, so an index outside [0, classes) would silently contribute nothing to the loss. The session checks
// each batch's targets instead, naming the offending sample.
#include <cstdint>
#include <optional>
#include <string>

#include "executor/tensor.h"
#include "graph/ir.h"
#include "losses/loss.h"

namespace onnxtrain {

struct LabelRange {
  std::string target;  // the graph input holding the indices
  int64_t classes = 0;
  std::optional<int64_t> ignore_index;
};

// The range the loss accepts, when it reads class indices and the prediction's class axis (axis 1) has a
// static size; nullopt otherwise.
std::optional<LabelRange> label_range(const LossSpec& loss, const TypeInfo* prediction, const std::string& target);

// Throws Error naming the target, the first offending element and the accepted range. Allocates nothing when
// the labels are fine.
void check_labels(const LabelRange& range, const Tensor& labels);

}  // namespace onnxtrain
