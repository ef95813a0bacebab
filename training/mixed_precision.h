#pragma once
// Mixed precision (docs/trainer.md "Mixed precision"): the compute-heavy ops see their float32 inputs and
// outputs rounded to float16 or bfloat16, the weights stay float32 (master weights), and a dynamic loss scale
// keeps small gradients from flushing to zero in half precision. Overflowed steps are skipped and counted.
#include <cstdint>
#include <map>
#include <utility>
#include <string>
#include <vector>

#include "graph/ir.h"

namespace onnxtrain {

struct MixedPrecisionSpec {
  std::string dtype = "none";  // none | float16 | bfloat16
  // torch.amp.GradScaler's defaults and update rule.
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  bool active() const { return dtype != "none"; }
};

// Errors name the key ("mixed_precision.growth_factor") and what was expected.
void validate_mixed_precision(const MixedPrecisionSpec& spec);
DType half_dtype(const MixedPrecisionSpec& spec);

// The ops whose float32 inputs and outputs the pass rounds to half precision.
const std::vector<std::string>& mixed_precision_ops();

// MatMul and Gemm then compute in `half` (their float32 inputs Cast to half, their half output Cast back to
// float32; the kernels accumulate in float32). Conv and ConvTranspose have float32 kernels only: their inputs
// and outputs are rounded through `half` and back, so they compute on half-precision values in float32. Their
// gradients flow back through the Casts the same way. Everything else (loss, softmax, normalisation, optimizer) stays float32. Returns the number of
// ops rewritten. Applying it to a graph that already has the rewrite changes nothing.
int apply_mixed_precision(Graph& g, DType half);
// Undoes apply_mixed_precision (a checkpoint stores the rewritten model; the session rebuilds it from the
// original).
void strip_mixed_precision(Graph& g);

// The dynamic loss scale, as state tensors of the training step (so checkpoints keep them and the GPU never
// syncs with the host for them): float32 scale and its reciprocal, int64 finite steps since the last change of
// the scale, int64 count of skipped (overflowed) steps.
inline constexpr const char* kLossScale = "mixed_precision.loss_scale";
inline constexpr const char* kInvLossScale = "mixed_precision.inv_loss_scale";
inline constexpr const char* kGrowthTracker = "mixed_precision.growth_tracker";
inline constexpr const char* kOverflowSteps = "mixed_precision.overflow_steps";
std::vector<std::string> loss_scale_state_names();
// Adds the four state tensors to g at their initial values.
void add_loss_scale_state(Graph& g, const MixedPrecisionSpec& spec);
// Replaces each gradient by gradient * inv_loss_scale (the backward ran from a seed of loss_scale).
void unscale_gradients(Graph& g, std::map<std::string, std::string>& grads);
// The step's guard and torch.amp.GradScaler's update, in the graph: found = the loss or any gradient is NaN or
// Inf; every (new value, state) update keeps the old state when found; the scale backs off when found, grows
// after growth_interval finite steps in a row; the four loss-scale updates are appended to `updates`.
void guard_updates_with_loss_scale(Graph& g, const std::string& loss, const std::vector<std::string>& grads,
                                   std::vector<std::pair<std::string, std::string>>& updates,
                                   const MixedPrecisionSpec& spec);

}  // namespace onnxtrain
