#pragma once
// Elastic weight penalty as a loss term, so the gradient engine differentiates it with the rest of the loss
// (rather than being folded into an optimizer's update rule).
#include <string>
#include <vector>

#include "graph/ir.h"

namespace onnxtrain {

struct PenaltySpec {
  double l1 = 0, l2 = 0;  // non-negative coefficients
};

// Appends  loss + l1 * sum_w sum|w| + l2 * sum_w sum(w^2)  over every listed weight and returns the new scalar
// value's name (always a fresh value, even when both coefficients are 0). No 1/2 on the l2 term: torch's
// weight_decay = wd corresponds to l2 = wd / 2. The l1 term's gradient at w == 0 is 0 (sign(0)).
// Throws Error naming the key ("penalty.l1", "penalty.weights") for negative coefficients or unknown weights.
std::string append_penalty(Graph& g, const std::string& loss, const std::vector<std::string>& weights,
                           const PenaltySpec& p);

}  // namespace onnxtrain
