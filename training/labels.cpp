#include "training/labels.h"

#include "graph/error.h"

namespace onnxtrain {

std::optional<LabelRange> label_range(const LossSpec& loss, const TypeInfo* prediction, const std::string& target) {
  if (loss.kind != "cross_entropy" && loss.kind != "nll") return std::nullopt;
  if (loss.target_format != "indices" || !prediction || !prediction->shape) return std::nullopt;
  const Shape& s = *prediction->shape;
  if (s.size() < 2 || !s[1].known()) return std::nullopt;
  return LabelRange{target, s[1].value, loss.ignore_index};
}

void check_labels(const LabelRange& r, const Tensor& labels) {
  if (labels.dtype != DType::Int64 || labels.device != Device::CPU) return;  // the executor reports dtype errors
  const int64_t* p = labels.ptr<int64_t>();
  const int64_t n = labels.numel();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t v = p[i];
    if ((v >= 0 && v < r.classes) || (r.ignore_index && v == *r.ignore_index)) continue;
    std::string accepted = "0.." + std::to_string(r.classes - 1);
    if (r.ignore_index) accepted += " or ignore_index " + std::to_string(*r.ignore_index);
    fail("target '" + r.target + "'", "class index " + std::to_string(v) + " at flat position " + std::to_string(i) +
                                          " is out of range; the prediction has " + std::to_string(r.classes) +
                                          " classes, so expected " + accepted);
  }
}

}  // namespace onnxtrain
