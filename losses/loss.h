#pragma once
// Loss subgraphs. A loss reads (prediction, target, optional per-sample weight) and produces a scalar; it is
// appended to the forward graph with ordinary ONNX ops, so the gradient engine differentiates it like the rest
// of the model. Formulas, defaults and the torch function each loss matches: docs/losses.md.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "graph/ir.h"

namespace onnxtrain {

struct LossSpec {
  // square (alias mse), absolute, elastic, huber, neg_log, cross_entropy, nll, bce_with_logits.
  std::string kind = "mse";
  std::string reduction = "mean";  // "mean" or "sum"
  bool half = false;               // square: 0.5 * (p - t)^2, the convention of scikit-learn's squared error
  // Adds a graph input of one weight per sample (shape [N], the prediction's first axis) that scales each
  // sample's loss; the mean still divides by the unweighted count (torch's `weight` convention for BCE).
  bool sample_weight = false;

  double l1 = 0.5, l2 = 0.5;  // elastic: l1 * |d| + l2 * d^2
  double delta = 1.0;         // huber: quadratic below delta, linear above

  // How the prediction is read. "" = the kind's default. neg_log: "probability" (default) or "logits";
  // cross_entropy: "logits" (the only choice, stated for symmetry).
  std::string input;
  // neg_log: probabilities are clipped to [eps, 1 - eps] (logits to the matching range). Unset: the
  // prediction dtype's machine epsilon for "probability" (scikit-learn's log_loss), no clipping for "logits".
  std::optional<double> eps;

  // cross_entropy / nll.
  std::string target_format = "indices";  // "indices" (int64, no class axis) or "probabilities" (cross_entropy)
  std::vector<double> class_weights;      // one per class; empty = all 1 (stored as a constant initializer)
  std::optional<int64_t> ignore_index = -100;  // torch's default; nullopt = no index is ignored
  double label_smoothing = 0.0;                // cross_entropy, in [0, 1]

  // bce_with_logits: weight of the positive term, one per class along the last axis (or a single value).
  std::vector<double> pos_weight;
};

struct LossGraph {
  std::string loss;           // scalar loss value
  std::string target;         // graph input added for the target
  std::string sample_weight;  // graph input added for per-sample weights; empty unless requested
};

// Appends the loss of `prediction` to g, and graph inputs "target" (and "sample_weight" when requested; fresh
// names if taken). The target has the prediction's type, except cross_entropy/nll class indices: int64 with
// the prediction's shape minus axis 1. Throws Error naming the key ("loss.delta: ...") for a bad spec.
// `opset` is the model's ai.onnx opset. From 16 on, class-index losses gather each target's log-probability
// (GatherElements, whose gradient is a ScatterElements with reduction 'add', opset 16); 0 (not known) or below
// 16 keeps a one-hot mask, which is valid at every opset but reads and writes [N, C] tensors in the forward pass.
LossGraph append_loss(Graph& g, const std::string& prediction, const LossSpec& spec, int64_t opset = 0);

// Every loss kind (aliases included), for error messages, tests and docs.
const std::vector<std::string>& loss_kinds();

}  // namespace onnxtrain
