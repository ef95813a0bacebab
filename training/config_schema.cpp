#include "training/config_schema.h"

#include <limits>

namespace onnxtrain {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr unsigned kAll = kWayCli | kWayPython | kWayCheckpoint;

using Field = OptionField (*)(TrainingConfig&);

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// One constructor per kind, so each entry below reads as one line of the table.
ConfigOption flag(std::string key, std::string def, std::string help, unsigned ways, Field f) {
  return {std::move(key), OptionKind::Bool, std::move(def), std::move(help), ways, f};
}
ConfigOption integer(std::string key, std::string def, std::string help, unsigned ways, Field f, double min,
                     double max = kInf) {
  return {std::move(key), OptionKind::Integer, std::move(def), std::move(help), ways, f, {}, min, max};
}
ConfigOption number(std::string key, std::string def, std::string help, unsigned ways, Field f, double min,
                    double max = kInf, bool open_min = false) {
  return {std::move(key), OptionKind::Number, std::move(def), std::move(help), ways, f, {}, min, max, open_min};
}
ConfigOption optional_number(std::string key, std::string def, std::string help, unsigned ways, Field f, double min,
                             double max = kInf, bool open_min = false) {
  return {std::move(key), OptionKind::OptionalNumber, std::move(def), std::move(help), ways, f, {}, min, max, open_min};
}
ConfigOption choice(std::string key, std::string def, std::string help, unsigned ways, Field f,
                    std::vector<std::string> choices) {
  return {std::move(key), OptionKind::Choice, std::move(def), std::move(help), ways, f, std::move(choices)};
}
ConfigOption of_kind(OptionKind kind, std::string key, std::string def, std::string help, unsigned ways, Field f) {
  return {std::move(key), kind, std::move(def), std::move(help), ways, f};
}
// Names the option differently in Python and/or in checkpoint metadata.
ConfigOption spelled(ConfigOption o, std::string python, std::string checkpoint = {}) {
  o.python = std::move(python);
  o.checkpoint = std::move(checkpoint);
  return o;
}

std::vector<ConfigOption> make_options() {
  using K = OptionKind;
  using C = TrainingConfig;
  const int64_t kMinInt = std::numeric_limits<int64_t>::min();
  return {
      of_kind(K::Strings, "trainable", "[]", "initializer names to train; [] = every floating-point initializer",
              kWayPython | kWayCheckpoint, [](C& c) -> OptionField { return &c.trainable; }),
      of_kind(K::Strings, "inputs_requiring_grad", "[]", "model inputs whose gradients run_backward also returns",
              kWayPython | kWayCheckpoint, [](C& c) -> OptionField { return &c.inputs_requiring_grad; }),
      of_kind(K::String, "prediction", "\"\"", "the model output the loss reads; \"\" = the first output", kAll,
              [](C& c) -> OptionField { return &c.prediction; }),

      choice("loss.kind", "mse", "one of: " + join(loss_kinds()), kAll,
             [](C& c) -> OptionField { return &c.loss.kind; }, loss_kinds()),
      choice("loss.reduction", "mean", "mean or sum", kAll, [](C& c) -> OptionField { return &c.loss.reduction; },
             {"mean", "sum"}),
      flag("loss.half", "false", "square: 0.5 * (p - t)^2", kAll, [](C& c) -> OptionField { return &c.loss.half; }),
      flag("loss.sample_weight", "false", "add a 'sample_weight' input of shape [N] that weighs each row's loss",
           kWayPython | kWayCheckpoint, [](C& c) -> OptionField { return &c.loss.sample_weight; }),
      number("loss.l1", "0.5", "elastic: weight of |d|", kAll, [](C& c) -> OptionField { return &c.loss.l1; }, 0),
      number("loss.l2", "0.5", "elastic: weight of d^2", kAll, [](C& c) -> OptionField { return &c.loss.l2; }, 0),
      number("loss.delta", "1.0", "huber: quadratic below delta", kAll, [](C& c) -> OptionField { return &c.loss.delta; },
             0, kInf, true),
      choice("loss.input", "\"\"", "neg_log: probability or logits; \"\" = the kind's default", kAll,
             [](C& c) -> OptionField { return &c.loss.input; }, {"", "probability", "logits"}),
      optional_number("loss.eps", "null", "neg_log: probability clipping; null = machine epsilon", kAll,
                      [](C& c) -> OptionField { return &c.loss.eps; }, 0, 0.5),
      choice("loss.target_format", "indices", "cross_entropy/nll: indices (int class ids) or probabilities", kAll,
             [](C& c) -> OptionField { return &c.loss.target_format; }, {"indices", "probabilities"}),
      of_kind(K::Numbers, "loss.class_weights", "[]", "cross_entropy/nll: one weight per class", kAll,
              [](C& c) -> OptionField { return &c.loss.class_weights; }),
      ConfigOption{"loss.ignore_index", K::OptionalInteger, "-100", "cross_entropy/nll: target value that is ignored; null = none",
                   kAll, [](C& c) -> OptionField { return &c.loss.ignore_index; }, {}, static_cast<double>(kMinInt), kInf},
      number("loss.label_smoothing", "0.0", "cross_entropy: in [0, 1]", kAll,
             [](C& c) -> OptionField { return &c.loss.label_smoothing; }, 0, 1),
      of_kind(K::Numbers, "loss.pos_weight", "[]", "bce_with_logits: weight of positives, per class", kAll,
              [](C& c) -> OptionField { return &c.loss.pos_weight; }),
      number("penalty.l1", "0.0", "L1 penalty on the trainable weights, added to the loss", kAll,
             [](C& c) -> OptionField { return &c.penalty.l1; }, 0),
      number("penalty.l2", "0.0", "L2 penalty", kAll, [](C& c) -> OptionField { return &c.penalty.l2; }, 0),

      choice("optimizer.kind", "sgd", "one of: " + join(optimizer_kinds()), kAll,
             [](C& c) -> OptionField { return &c.optimizer.kind; }, optimizer_kinds()),
      number("optimizer.learning_rate", "0.01", "base learning rate (> 0)", kAll,
             [](C& c) -> OptionField { return &c.optimizer.learning_rate; }, 0, kInf, true),
      optional_number("optimizer.weight_decay", "null", "null = 0 (0.01 for adamw)", kAll,
                      [](C& c) -> OptionField { return &c.optimizer.weight_decay; }, 0),
      number("optimizer.momentum", "0.0", "sgd", kAll, [](C& c) -> OptionField { return &c.optimizer.momentum; }, 0, 1),
      number("optimizer.dampening", "0.0", "sgd (torch convention)", kAll,
             [](C& c) -> OptionField { return &c.optimizer.dampening; }, 0, 1),
      flag("optimizer.nesterov", "false", "sgd", kAll, [](C& c) -> OptionField { return &c.optimizer.nesterov; }),
      choice("optimizer.convention", "torch", "sgd: torch or onnx", kAll,
             [](C& c) -> OptionField { return &c.optimizer.convention; }, {"torch", "onnx"}),
      number("optimizer.beta", "1.0", "sgd, onnx convention", kAll, [](C& c) -> OptionField { return &c.optimizer.beta; }, 0),
      number("optimizer.beta1", "0.9", "adam, adamw", kAll, [](C& c) -> OptionField { return &c.optimizer.beta1; }, 0, 1),
      number("optimizer.beta2", "0.999", "adam, adamw", kAll, [](C& c) -> OptionField { return &c.optimizer.beta2; }, 0, 1),
      flag("optimizer.amsgrad", "false", "adam, adamw", kAll, [](C& c) -> OptionField { return &c.optimizer.amsgrad; }),
      optional_number("optimizer.eps", "null", "adam, adamw, adagrad; null = 1e-8 (1e-10 adagrad)", kAll,
                      [](C& c) -> OptionField { return &c.optimizer.eps; }, 0, 1, true),
      number("optimizer.lr_decay", "0.0", "adagrad", kAll, [](C& c) -> OptionField { return &c.optimizer.lr_decay; }, 0),
      number("optimizer.initial_accumulator_value", "0.0", "adagrad", kAll,
             [](C& c) -> OptionField { return &c.optimizer.initial_accumulator_value; }, 0),
      number("optimizer.max_grad_norm", "0.0", "gradient clipping by global norm; 0 = off", kAll,
             [](C& c) -> OptionField { return &c.optimizer.max_grad_norm; }, 0),
      integer("optimizer.gradient_accumulation", "1", "micro-batches per update", kAll,
              [](C& c) -> OptionField { return &c.optimizer.gradient_accumulation; }, 1, 1 << 20),
      of_kind(K::Groups, "optimizer.groups", "[]",
              "parameter groups: [{match: [globs], learning_rate: x, weight_decay: y}, ...]", kAll,
              [](C& c) -> OptionField { return &c.optimizer.groups; }),

      choice("schedule.kind", "constant", "one of: " + join(schedule_kinds()), kAll,
             [](C& c) -> OptionField { return &c.schedule.kind; }, schedule_kinds()),
      integer("schedule.step_size", "0", "step: decay every step_size optimizer steps", kAll,
              [](C& c) -> OptionField { return &c.schedule.step_size; }, 0),
      number("schedule.gamma", "0.1", "step, exponential: decay factor", kAll,
             [](C& c) -> OptionField { return &c.schedule.gamma; }, 0, kInf, true),
      integer("schedule.total_steps", "0", "cosine, linear: steps including warm-up; 0 = the run's planned optimizer steps",
              kAll, [](C& c) -> OptionField { return &c.schedule.total_steps; }, 0),
      integer("schedule.warmup_steps", "0", "cosine, linear: linear warm-up steps", kAll,
              [](C& c) -> OptionField { return &c.schedule.warmup_steps; }, 0),
      number("schedule.min_lr", "0.0", "cosine: final learning rate", kAll,
             [](C& c) -> OptionField { return &c.schedule.min_lr; }, 0),
      number("schedule.power_t", "0.5", "invscaling exponent", kAll, [](C& c) -> OptionField { return &c.schedule.power_t; }, 0),
      number("schedule.tol", "0.0001", "adaptive: improvement threshold", kAll,
             [](C& c) -> OptionField { return &c.schedule.tol; }, 0),
      integer("schedule.n_iter_no_change", "10", "adaptive: patience in epochs", kAll,
              [](C& c) -> OptionField { return &c.schedule.n_iter_no_change; }, 1),

      choice("mixed_precision.dtype", "none",
             "none, float16 or bfloat16: MatMul/Gemm/Conv inputs and outputs are rounded to it, weights stay float32", kAll,
             [](C& c) -> OptionField { return &c.mixed_precision.dtype; }, {"none", "float16", "bfloat16"}),
      number("mixed_precision.init_scale", "65536.0", "initial loss scale", kAll,
             [](C& c) -> OptionField { return &c.mixed_precision.init_scale; }, 0, kInf, true),
      number("mixed_precision.growth_factor", "2.0", "the scale grows by this after growth_interval finite steps", kAll,
             [](C& c) -> OptionField { return &c.mixed_precision.growth_factor; }, 1),
      number("mixed_precision.backoff_factor", "0.5", "the scale shrinks by this on an overflowed (skipped) step", kAll,
             [](C& c) -> OptionField { return &c.mixed_precision.backoff_factor; }, 0, 1, true),
      integer("mixed_precision.growth_interval", "2000", "finite steps in a row before the scale grows", kAll,
              [](C& c) -> OptionField { return &c.mixed_precision.growth_interval; }, 1),

      choice("adapter.kind", "none",
             "none, or lora: train low-rank adapters beside the targeted weights, which stay frozen (docs/lora.md)", kAll,
             [](C& c) -> OptionField { return &c.adapter.kind; }, {"none", "lora"}),
      integer("adapter.rank", "8", "lora: rank of each adapter", kAll, [](C& c) -> OptionField { return &c.adapter.rank; },
              1, 1 << 20),
      number("adapter.alpha", "16.0", "lora: the adapter's update is scaled by alpha / rank", kAll,
             [](C& c) -> OptionField { return &c.adapter.alpha; }, 0, kInf, true),
      number("adapter.dropout", "0.0", "lora: dropout on the adapter branch's input while training (0 = none)", kAll,
             [](C& c) -> OptionField { return &c.adapter.dropout; }, 0, 1),
      of_kind(K::Strings, "adapter.target", "[all-linear]",
              "lora: initializer names or globs of the weights to adapt (MatMul/Gemm/Conv); all-linear = every MatMul/Gemm weight",
              kAll, [](C& c) -> OptionField { return &c.adapter.target; }),
      integer("adapter.seed", "0", "lora: seed of the adapters' Kaiming-uniform initialisation", kAll,
              [](C& c) -> OptionField { return &c.adapter.seed; }, 0),

      of_kind(K::Strings, "memory.recompute", "none",
              "none; auto (keep segment boundaries, recompute the rest in the backward pass); or forward node "
              "names/globs to recompute (docs/memory.md)",
              kAll, [](C& c) -> OptionField { return &c.memory.recompute; }),

      // Not in checkpoints: a resumed run takes them from its caller (any number of ranks can resume).
      flag("distributed.overlap", "true",
           "mpirun: start each gradient bucket's allreduce as soon as the backward pass has produced it and wait where "
           "the optimizer reads it; false = one blocking allreduce per bucket after the backward pass (docs/distributed.md)",
           kWayCli | kWayPython, [](C& c) -> OptionField { return &c.parallel.overlap; }),
      integer("distributed.bucket_bytes", "1048576",
              "mpirun: largest allreduce message, in bytes of float32 gradients; buckets fill in the order the backward "
              "pass produces the gradients",
              kWayCli | kWayPython, [](C& c) -> OptionField { return &c.parallel.bucket_bytes; }, 1),
      choice("distributed.compression", "none",
             "mpirun: none, bfloat16 or float16: gradients travel as 16-bit floats (half the bytes; lossy, summed in float32)",
             kWayCli | kWayPython, [](C& c) -> OptionField { return &c.parallel.compression; },
             {"none", "bfloat16", "float16"}),
      flag("distributed.reduce_every_micro_batch", "true",
           "mpirun with optimizer.gradient_accumulation k > 1: false keeps micro-batches local and reduces their sum "
           "once per update (k times fewer messages)",
           kWayCli | kWayPython, [](C& c) -> OptionField { return &c.parallel.reduce_every_micro_batch; }),

      spelled(choice("train.on_non_finite", "raise",
                     "a NaN/Inf loss or gradient: raise (stop, naming step and tensor) or skip (not applied; warned, "
                     "counted in the summary)",
                     kAll, [](C& c) -> OptionField { return &c.on_non_finite; }, {"raise", "skip"}),
              "on_non_finite", "numerics.on_non_finite"),
      spelled(flag("train.check_every_value", "false",
                   "debugging: check every intermediate value so the error names the first non-finite tensor", kAll,
                   [](C& c) -> OptionField { return &c.check_every_value; }),
              "check_every_value", "numerics.check_every_value"),
      spelled(flag("train.profile", "false",
                   "after training, print where train_step's time went, per step of its plan (docs/performance.md)",
                   kWayCli | kWayPython, [](C& c) -> OptionField { return &c.profile; }),
              "profile"),
  };
}

// Built when the library loads rather than on first use: replica threads build their sessions at the same time,
// and the fast path of a function-local static's guard is invisible to ThreadSanitizer in this uninstrumented
// library, so test_threads_tsan reported the first concurrent reads as races. make_options reads only
// function-local statics of other files (loss_kinds() and the like), so the order of static initialisation
// does not matter.
const std::vector<ConfigOption> kOptions = make_options();

}  // namespace

const std::vector<ConfigOption>& config_options() { return kOptions; }

const ConfigOption* find_config_option(const std::string& key) {
  for (const ConfigOption& o : config_options())
    if (o.key == key) return &o;
  return nullptr;
}

std::string option_kind_name(OptionKind kind) {
  switch (kind) {
    case OptionKind::Bool: return "bool";
    case OptionKind::Integer: return "integer";
    case OptionKind::Number: return "number";
    case OptionKind::OptionalNumber: return "optional number";
    case OptionKind::OptionalInteger: return "optional integer";
    case OptionKind::String: return "string";
    case OptionKind::Choice: return "choice";
    case OptionKind::Strings: return "string list";
    case OptionKind::Numbers: return "number list";
    case OptionKind::Groups: return "parameter groups";
  }
  return "?";
}

}  // namespace onnxtrain
