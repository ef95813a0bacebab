#pragma once
// Optimizer subgraphs: read each weight, its gradient and its state, and produce the new values. The
// executor writes them back in place through the returned update bindings. docs/optimizers.md has every
// update rule, its options and the names of its state.
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "graph/ir.h"

namespace onnxtrain {

// Overrides for the weights it matches. The first group that matches a weight wins; unmatched weights use
// the spec's defaults. A group that matches no trainable weight is an error (it is almost always a typo).
struct ParamGroup {
  std::vector<std::string> match;  // weight names or glob patterns: '*' any run of characters, '?' one
  std::optional<double> learning_rate;
  std::optional<double> weight_decay;
};

struct OptimizerSpec {
  std::string kind = "sgd";  // "sgd", "adam", "adamw", "adagrad"
  double learning_rate = 0.01;
  // L2 added to the gradient (sgd, adam, adagrad) or decoupled (adamw). Unset: 0, or 0.01 for adamw (torch).
  std::optional<double> weight_decay;

  // sgd
  double momentum = 0;
  double dampening = 0;  // torch convention only
  bool nesterov = false;
  std::string convention = "torch";  // "torch" or "onnx" (ai.onnx.preview.training Momentum)
  double beta = 1;                   // onnx convention: the gradient's coefficient after the first step

  // adam, adamw
  double beta1 = 0.9, beta2 = 0.999;
  bool amsgrad = false;
  // adam, adamw, adagrad. Unset: 1e-8 (adam, adamw), 1e-10 (adagrad), as torch.
  std::optional<double> eps;

  // adagrad
  double lr_decay = 0;
  double initial_accumulator_value = 0;

  // Global-norm clipping of the gradients before the update (torch.nn.utils.clip_grad_norm_); 0 = off.
  double max_grad_norm = 0;
  // Gradient accumulation: the update uses the mean of this many micro-batch gradients.
  int gradient_accumulation = 1;

  std::vector<ParamGroup> groups;
};

// Which graph append_optimizer builds. With gradient_accumulation > 1 a session runs AccumulateOnly for
// N-1 micro-batches and Update for the N-th.
enum class OptimizerPhase { Update, AccumulateOnly };

struct OptimizerGraph {
  // float64 scalar variables, current learning rates: "optim.lr" for the defaults, then "optim.lr.<i>" for
  // groups[i]. Schedules write them between steps.
  std::string learning_rate;
  std::vector<std::string> group_learning_rates;
  std::string step;  // int64 scalar variable "optim.step": updates applied so far
  // Every state initializer the optimizer added (learning rates and step included): the caller registers
  // them as executor variables so they are never constant-folded.
  std::vector<std::string> state;
  std::vector<std::pair<std::string, std::string>> updates;  // (new value, state to overwrite)
  std::map<std::string, int> group_of;                        // weight -> index into groups, -1 = defaults
};

// grads maps each trainable weight to its gradient value. Throws Error naming the key on a bad spec.
// State names: "<weight>.momentum_buffer" (sgd), "<weight>.exp_avg", "<weight>.exp_avg_sq",
// "<weight>.max_exp_avg_sq" (adam, adamw), "<weight>.sum" (adagrad), "<weight>.grad_accum" (accumulation),
// "optim.step", "optim.lr", "optim.lr.<i>". A name already used by the model is an error.
// With gradient accumulation, `accumulated` (when given) sees the update phase's sums of the micro-batch gradients
// (weight -> value, buffer plus this micro-batch) before they are averaged, and may rename them: data-parallel
// training reduces them there, once per update, instead of every micro-batch (docs/distributed.md).
using AccumulatedHook = std::function<void(Graph& g, std::map<std::string, std::string>& sums)>;
OptimizerGraph append_optimizer(Graph& g, const std::map<std::string, std::string>& grads, const OptimizerSpec& spec,
                                OptimizerPhase phase = OptimizerPhase::Update, const AccumulatedHook& accumulated = {});

// Checks the spec (and the groups against these weights) without building anything.
void validate_optimizer(const OptimizerSpec& spec, const std::vector<std::string>& weights);

// Glob match used by parameter groups ('*', '?'; no character classes).
bool glob_match(const std::string& pattern, const std::string& name);

const std::vector<std::string>& optimizer_kinds();

// The domain of the per-weight update ops append_optimizer emits (formulas/optimizer_updates.h names them:
// onnxtrain.AdamUpdate, SgdUpdate, AdagradUpdate and their variants; docs/optimizers.md). The gradient ops' domain
// too.
inline constexpr const char* kOptimizerDomain = "onnxtrain";

// The update ops' model-local functions, whose standard-ONNX bodies (opset 13 and later, no constants, so one body
// serves every float type) are the formulas of formulas/optimizer_updates.h on graph values: checkpoints carry the
// ones their training step uses, so other runtimes can run it (docs/optimizers.md).
std::vector<Function> optimizer_update_functions();

}  // namespace onnxtrain
