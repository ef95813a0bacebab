#include "cli/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <set>
#include <sstream>

#include "executor/device.h"
#include "graph/error.h"
#include "training/trainer.h"

namespace onnxtrain::cli {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

std::string join(const std::vector<std::string>& v, const std::string& sep = ", ") {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

// One key being parsed: its node, its location and typed readers that fail with the key, the location, what
// was expected and what was found.
struct Ctx {
  const YAML::Node& node;
  std::string key, where;

  std::string found() const {
    if (node.IsScalar()) return "'" + node.Scalar() + "'";
    if (node.IsSequence()) return "a list";
    if (node.IsMap()) return "a mapping";
    return "nothing (null)";
  }
  [[noreturn]] void bad(const std::string& expected) const {
    fail(where, key + ": expected " + expected + ", got " + found());
  }
  std::string str() const {
    if (!node.IsScalar()) bad("a string");
    return node.Scalar();
  }
  double num(double lo, double hi, bool open_low = false) const {
    std::string range = open_low ? "a number > " + fmt(lo) : "a number >= " + fmt(lo);
    if (hi < kInf) range += " and <= " + fmt(hi);
    double v;
    if (!node.IsScalar() || !YAML::convert<double>::decode(node, v) || !std::isfinite(v)) bad(range);
    if (v < lo || (open_low && v == lo) || v > hi) bad(range);
    return v;
  }
  int64_t integer(int64_t lo, int64_t hi = std::numeric_limits<int64_t>::max()) const {
    std::string range = "an integer >= " + std::to_string(lo);
    if (hi < std::numeric_limits<int64_t>::max()) range += " and <= " + std::to_string(hi);
    int64_t v;
    if (!node.IsScalar() || !YAML::convert<int64_t>::decode(node, v)) bad(range);
    if (v < lo || v > hi) bad(range);
    return v;
  }
  bool boolean() const {
    bool v;
    if (!node.IsScalar() || !YAML::convert<bool>::decode(node, v)) bad("true or false");
    return v;
  }
  std::string choice(const std::vector<std::string>& valid) const {
    const std::string v = node.IsScalar() ? node.Scalar() : "";
    if (std::find(valid.begin(), valid.end(), v) != valid.end()) return v;
    std::string hint = did_you_mean(v, valid);
    fail(where, key + ": expected one of: " + join(valid) + "; got " + found() +
                    (hint.empty() ? "" : " (did you mean '" + hint + "'?)"));
  }
  // A scalar or a list of scalars.
  std::vector<std::string> strings() const {
    if (node.IsNull()) return {};
    if (node.IsScalar()) return {node.Scalar()};
    if (!node.IsSequence()) bad("a string or a list of strings");
    std::vector<std::string> r;
    for (const auto& n : node) {
      if (!n.IsScalar()) bad("a string or a list of strings");
      r.push_back(n.Scalar());
    }
    return r;
  }
  std::vector<double> numbers() const {
    if (node.IsNull()) return {};
    if (!node.IsSequence()) bad("a list of finite numbers");
    std::vector<double> r;
    for (const auto& n : node) {
      double v;
      if (!n.IsScalar() || !YAML::convert<double>::decode(n, v) || !std::isfinite(v)) bad("a list of finite numbers");
      r.push_back(v);
    }
    return r;
  }
  std::optional<double> opt_num(double lo, double hi, bool open_low = false) const {
    if (node.IsNull()) return std::nullopt;
    return num(lo, hi, open_low);
  }
  static std::string fmt(double v) {
    std::ostringstream s;
    s << v;
    return s.str();
  }
};

// A mapping key as a name. YAML also allows lists and mappings as keys; no config has them.
std::string key_name(const YAML::Node& k, const std::string& parent, const std::string& where) {
  if (k.IsScalar() || k.IsNull()) return k.as<std::string>();
  fail(where, (parent.empty() ? "" : parent + ": ") + "expected a key name, got " + Ctx{k, parent, where}.found());
}

struct Key {
  std::string path;  // "optimizer.learning_rate"
  std::string def;   // the default, as YAML, for the reference config
  std::string help;
  std::function<void(const Ctx&, RunConfig&)> parse;
};

// Every key. The order is the reference config's order.
const std::vector<Key>& keys() {
  static const std::vector<Key> k = {
      {"model", "null", "the ONNX model to train (required)", [](const Ctx& c, RunConfig& r) { r.model = c.str(); }},
      {"output", "runs/<config file name>", "folder for model.onnx, checkpoints/ and the metrics file",
       [](const Ctx& c, RunConfig& r) { r.output = c.str(); }},
      {"device", "cpu", "cpu, cuda or cuda:N (checked now: a missing CUDA fails here, saying what is missing); unset: $ONNXTRAIN_DEVICE, else cpu",
       [](const Ctx& c, RunConfig& r) {
         r.device = c.str();
         try {
           parse_device(r.device);
         } catch (const Error& e) {
           fail(c.where, e.what());  // "device 'gpu': expected ..." already names the key and the value
         }
       }},
      {"threads", "0", "CPU threads (OpenMP); 0 = OMP_NUM_THREADS or all cores",
       [](const Ctx& c, RunConfig& r) { r.threads = c.integer(0, 4096); }},
      {"replicas", "1", "one-thread replicas that each train on a part of every batch (docs/replicas.md); 1 = one session on `threads`",
       [](const Ctx& c, RunConfig& r) { r.replicas = c.integer(1, 64); }},
      {"trainable", "[]", "weights to train: names or glob patterns (* ?); [] = every float initializer",
       [](const Ctx& c, RunConfig& r) { r.trainable = c.strings(); }},
      {"frozen", "[]", "weights (names or globs) removed from trainable", [](const Ctx& c, RunConfig& r) { r.frozen = c.strings(); }},
      {"prediction", "\"\"", "the model output the loss reads; \"\" = the first output",
       [](const Ctx& c, RunConfig& r) { r.training.prediction = c.str(); }},

      {"data.train", "null", "training data: a .npz, .csv or .npy file, or a list of files whose arrays are merged (required)",
       [](const Ctx& c, RunConfig& r) { r.data.train = c.strings(); }},
      {"data.validation", "null", "validation data, same forms; null = data.validation_split of the training rows",
       [](const Ctx& c, RunConfig& r) { r.data.validation = c.strings(); }},
      {"data.validation_split", "0.0", "fraction of training rows held out for validation (seeded by data.seed); 0 = none",
       [](const Ctx& c, RunConfig& r) { r.data.validation_split = c.num(0, 1); }},
      {"data.inputs", "{}", "model input -> array name (.npy stem, .npz key) or list of CSV columns; {} = arrays named like the inputs",
       [](const Ctx& c, RunConfig& r) {
         if (c.node.IsNull()) return;
         if (!c.node.IsMap()) c.bad("a mapping from model input to array or columns");
         for (const auto& kv : c.node) {
           const std::string input = key_name(kv.first, c.key, c.where);
           r.data.inputs[input] = Ctx{kv.second, c.key + "." + input, c.where}.strings();
         }
       }},
      {"data.target", "y", "the loss target: an array name or list of CSV columns", [](const Ctx& c, RunConfig& r) {
         r.data.target = c.strings();
         if (r.data.target.empty()) c.bad("an array name or a list of columns");
       }},
      {"data.shuffle", "true", "shuffle the training rows every epoch", [](const Ctx& c, RunConfig& r) { r.data.shuffle = c.boolean(); }},
      {"data.seed", "0", "seed of the shuffle and of the validation split (same seed, same order)",
       [](const Ctx& c, RunConfig& r) { r.data.seed = static_cast<uint64_t>(c.integer(0)); }},
      {"data.drop_last", "false", "drop the last, smaller batch of each epoch", [](const Ctx& c, RunConfig& r) { r.data.drop_last = c.boolean(); }},
      {"data.csv_delimiter", "\",\"", "CSV field separator (one character)", [](const Ctx& c, RunConfig& r) {
         r.data.csv_delimiter = c.str();
         if (r.data.csv_delimiter.size() != 1) c.bad("one character");
       }},
      {"data.csv_header", "true", "the first CSV line names the columns (false: columns are \"0\", \"1\", ...)",
       [](const Ctx& c, RunConfig& r) { r.data.csv_header = c.boolean(); }},

      {"loss.kind", "mse", "one of: " + join(loss_kinds()), [](const Ctx& c, RunConfig& r) { r.training.loss.kind = c.choice(loss_kinds()); }},
      {"loss.reduction", "mean", "mean or sum", [](const Ctx& c, RunConfig& r) { r.training.loss.reduction = c.choice({"mean", "sum"}); }},
      {"loss.half", "false", "square: 0.5 * (p - t)^2", [](const Ctx& c, RunConfig& r) { r.training.loss.half = c.boolean(); }},
      {"loss.l1", "0.5", "elastic: weight of |d|", [](const Ctx& c, RunConfig& r) { r.training.loss.l1 = c.num(0, kInf); }},
      {"loss.l2", "0.5", "elastic: weight of d^2", [](const Ctx& c, RunConfig& r) { r.training.loss.l2 = c.num(0, kInf); }},
      {"loss.delta", "1.0", "huber: quadratic below delta", [](const Ctx& c, RunConfig& r) { r.training.loss.delta = c.num(0, kInf, true); }},
      {"loss.input", "\"\"", "neg_log: probability or logits; \"\" = the kind's default",
       [](const Ctx& c, RunConfig& r) { r.training.loss.input = c.choice({"", "probability", "logits"}); }},
      {"loss.eps", "null", "neg_log: probability clipping; null = machine epsilon", [](const Ctx& c, RunConfig& r) { r.training.loss.eps = c.opt_num(0, 0.5); }},
      {"loss.target_format", "indices", "cross_entropy/nll: indices (int class ids) or probabilities",
       [](const Ctx& c, RunConfig& r) { r.training.loss.target_format = c.choice({"indices", "probabilities"}); }},
      {"loss.class_weights", "[]", "cross_entropy/nll: one weight per class", [](const Ctx& c, RunConfig& r) { r.training.loss.class_weights = c.numbers(); }},
      {"loss.ignore_index", "-100", "cross_entropy/nll: target value that is ignored; null = none", [](const Ctx& c, RunConfig& r) {
         if (c.node.IsNull()) r.training.loss.ignore_index.reset();
         else r.training.loss.ignore_index = c.integer(std::numeric_limits<int64_t>::min());
       }},
      {"loss.label_smoothing", "0.0", "cross_entropy: in [0, 1]", [](const Ctx& c, RunConfig& r) { r.training.loss.label_smoothing = c.num(0, 1); }},
      {"loss.pos_weight", "[]", "bce_with_logits: weight of positives, per class", [](const Ctx& c, RunConfig& r) { r.training.loss.pos_weight = c.numbers(); }},
      {"penalty.l1", "0.0", "L1 penalty on the trainable weights, added to the loss", [](const Ctx& c, RunConfig& r) { r.training.penalty.l1 = c.num(0, kInf); }},
      {"penalty.l2", "0.0", "L2 penalty", [](const Ctx& c, RunConfig& r) { r.training.penalty.l2 = c.num(0, kInf); }},

      {"optimizer.kind", "sgd", "one of: " + join(optimizer_kinds()), [](const Ctx& c, RunConfig& r) { r.training.optimizer.kind = c.choice(optimizer_kinds()); }},
      {"optimizer.learning_rate", "0.01", "base learning rate (> 0)", [](const Ctx& c, RunConfig& r) { r.training.optimizer.learning_rate = c.num(0, kInf, true); }},
      {"optimizer.weight_decay", "null", "null = 0 (0.01 for adamw)", [](const Ctx& c, RunConfig& r) { r.training.optimizer.weight_decay = c.opt_num(0, kInf); }},
      {"optimizer.momentum", "0.0", "sgd", [](const Ctx& c, RunConfig& r) { r.training.optimizer.momentum = c.num(0, 1); }},
      {"optimizer.dampening", "0.0", "sgd (torch convention)", [](const Ctx& c, RunConfig& r) { r.training.optimizer.dampening = c.num(0, 1); }},
      {"optimizer.nesterov", "false", "sgd", [](const Ctx& c, RunConfig& r) { r.training.optimizer.nesterov = c.boolean(); }},
      {"optimizer.convention", "torch", "sgd: torch or onnx", [](const Ctx& c, RunConfig& r) { r.training.optimizer.convention = c.choice({"torch", "onnx"}); }},
      {"optimizer.beta", "1.0", "sgd, onnx convention", [](const Ctx& c, RunConfig& r) { r.training.optimizer.beta = c.num(0, kInf); }},
      {"optimizer.beta1", "0.9", "adam, adamw", [](const Ctx& c, RunConfig& r) { r.training.optimizer.beta1 = c.num(0, 1); }},
      {"optimizer.beta2", "0.999", "adam, adamw", [](const Ctx& c, RunConfig& r) { r.training.optimizer.beta2 = c.num(0, 1); }},
      {"optimizer.amsgrad", "false", "adam, adamw", [](const Ctx& c, RunConfig& r) { r.training.optimizer.amsgrad = c.boolean(); }},
      {"optimizer.eps", "null", "adam, adamw, adagrad; null = 1e-8 (1e-10 adagrad)", [](const Ctx& c, RunConfig& r) { r.training.optimizer.eps = c.opt_num(0, 1, true); }},
      {"optimizer.lr_decay", "0.0", "adagrad", [](const Ctx& c, RunConfig& r) { r.training.optimizer.lr_decay = c.num(0, kInf); }},
      {"optimizer.initial_accumulator_value", "0.0", "adagrad", [](const Ctx& c, RunConfig& r) { r.training.optimizer.initial_accumulator_value = c.num(0, kInf); }},
      {"optimizer.max_grad_norm", "0.0", "gradient clipping by global norm; 0 = off", [](const Ctx& c, RunConfig& r) { r.training.optimizer.max_grad_norm = c.num(0, kInf); }},
      {"optimizer.gradient_accumulation", "1", "micro-batches per update", [](const Ctx& c, RunConfig& r) { r.training.optimizer.gradient_accumulation = static_cast<int>(c.integer(1, 1 << 20)); }},
      {"optimizer.groups", "[]", "parameter groups: [{match: [globs], learning_rate: x, weight_decay: y}, ...]", [](const Ctx& c, RunConfig& r) {
         if (c.node.IsNull()) return;
         if (!c.node.IsSequence()) c.bad("a list of {match, learning_rate, weight_decay} mappings");
         for (size_t i = 0; i < c.node.size(); ++i) {
           const YAML::Node& g = c.node[i];
           const std::string key = c.key + "[" + std::to_string(i) + "]";
           if (!g.IsMap()) Ctx{g, key, c.where}.bad("a mapping with match, learning_rate, weight_decay");
           ParamGroup pg;
           for (const auto& kv : g) {
             const std::string k = key_name(kv.first, key, c.where);
             Ctx item{kv.second, key + "." + k, c.where};
             if (k == "match") pg.match = item.strings();
             else if (k == "learning_rate") pg.learning_rate = item.num(0, kInf, true);
             else if (k == "weight_decay") pg.weight_decay = item.num(0, kInf);
             else {
               std::string hint = did_you_mean(k, {"match", "learning_rate", "weight_decay"});
               fail(c.where, key + ": unknown key '" + k + "'; valid keys: match, learning_rate, weight_decay" +
                                 (hint.empty() ? "" : " (did you mean '" + hint + "'?)"));
             }
           }
           if (pg.match.empty()) Ctx{g, key + ".match", c.where}.bad("a non-empty list of weight names or globs");
           r.training.optimizer.groups.push_back(pg);
         }
       }},

      {"schedule.kind", "constant", "one of: " + join(schedule_kinds()), [](const Ctx& c, RunConfig& r) { r.training.schedule.kind = c.choice(schedule_kinds()); }},
      {"schedule.step_size", "0", "step: decay every step_size optimizer steps", [](const Ctx& c, RunConfig& r) { r.training.schedule.step_size = c.integer(0); }},
      {"schedule.gamma", "0.1", "step, exponential: decay factor", [](const Ctx& c, RunConfig& r) { r.training.schedule.gamma = c.num(0, kInf, true); }},
      {"schedule.total_steps", "0", "cosine, linear: steps including warm-up; 0 = the run's planned optimizer steps", [](const Ctx& c, RunConfig& r) { r.training.schedule.total_steps = c.integer(0); }},
      {"schedule.warmup_steps", "0", "cosine, linear: linear warm-up steps", [](const Ctx& c, RunConfig& r) { r.training.schedule.warmup_steps = c.integer(0); }},
      {"schedule.min_lr", "0.0", "cosine: final learning rate", [](const Ctx& c, RunConfig& r) { r.training.schedule.min_lr = c.num(0, kInf); }},
      {"schedule.power_t", "0.5", "invscaling exponent", [](const Ctx& c, RunConfig& r) { r.training.schedule.power_t = c.num(0, kInf); }},
      {"schedule.tol", "0.0001", "adaptive: improvement threshold", [](const Ctx& c, RunConfig& r) { r.training.schedule.tol = c.num(0, kInf); }},
      {"schedule.n_iter_no_change", "10", "adaptive: patience in epochs", [](const Ctx& c, RunConfig& r) { r.training.schedule.n_iter_no_change = c.integer(1); }},

      {"mixed_precision.dtype", "none", "none, float16 or bfloat16: MatMul/Gemm/Conv inputs and outputs are rounded to it, weights stay float32",
       [](const Ctx& c, RunConfig& r) { r.training.mixed_precision.dtype = c.choice({"none", "float16", "bfloat16"}); }},
      {"mixed_precision.init_scale", "65536.0", "initial loss scale", [](const Ctx& c, RunConfig& r) { r.training.mixed_precision.init_scale = c.num(0, kInf, true); }},
      {"mixed_precision.growth_factor", "2.0", "the scale grows by this after growth_interval finite steps", [](const Ctx& c, RunConfig& r) { r.training.mixed_precision.growth_factor = c.num(1, kInf); }},
      {"mixed_precision.backoff_factor", "0.5", "the scale shrinks by this on an overflowed (skipped) step", [](const Ctx& c, RunConfig& r) { r.training.mixed_precision.backoff_factor = c.num(0, 1, true); }},
      {"mixed_precision.growth_interval", "2000", "finite steps in a row before the scale grows", [](const Ctx& c, RunConfig& r) { r.training.mixed_precision.growth_interval = c.integer(1); }},

      {"adapter.kind", "none", "none, or lora: train low-rank adapters beside the targeted weights, which stay frozen (docs/lora.md)",
       [](const Ctx& c, RunConfig& r) { r.training.adapter.kind = c.choice({"none", "lora"}); }},
      {"adapter.rank", "8", "lora: rank of each adapter", [](const Ctx& c, RunConfig& r) { r.training.adapter.rank = c.integer(1, 1 << 20); }},
      {"adapter.alpha", "16.0", "lora: the adapter's update is scaled by alpha / rank", [](const Ctx& c, RunConfig& r) { r.training.adapter.alpha = c.num(0, kInf, true); }},
      {"adapter.dropout", "0.0", "lora: dropout on the adapter branch's input (only 0 is supported yet)",
       [](const Ctx& c, RunConfig& r) { r.training.adapter.dropout = c.num(0, 1); }},
      {"adapter.target", "[all-linear]", "lora: initializer names or globs of the weights to adapt (MatMul/Gemm/Conv); all-linear = every MatMul/Gemm weight",
       [](const Ctx& c, RunConfig& r) { r.training.adapter.target = c.strings(); }},
      {"adapter.seed", "0", "lora: seed of the adapters' Kaiming-uniform initialisation", [](const Ctx& c, RunConfig& r) { r.training.adapter.seed = c.integer(0); }},

      {"memory.recompute", "none", "none; auto (keep segment boundaries, recompute the rest in the backward pass); or forward node names/globs to recompute (docs/memory.md)",
       [](const Ctx& c, RunConfig& r) { r.training.memory.recompute = c.strings(); }},

      {"distributed.overlap", "true", "mpirun: start each gradient bucket's allreduce as soon as the backward pass has produced it and wait where the optimizer reads it; false = one blocking allreduce per bucket after the backward pass (docs/distributed.md)",
       [](const Ctx& c, RunConfig& r) { r.training.parallel.overlap = c.boolean(); }},
      {"distributed.bucket_bytes", "1048576", "mpirun: largest allreduce message, in bytes of float32 gradients; buckets fill in the order the backward pass produces the gradients",
       [](const Ctx& c, RunConfig& r) { r.training.parallel.bucket_bytes = static_cast<size_t>(c.integer(1)); }},
      {"distributed.compression", "none", "mpirun: none, bfloat16 or float16: gradients travel as 16-bit floats (half the bytes; lossy, summed in float32)",
       [](const Ctx& c, RunConfig& r) { r.training.parallel.compression = c.choice({"none", "bfloat16", "float16"}); }},
      {"distributed.reduce_every_micro_batch", "true", "mpirun with optimizer.gradient_accumulation k > 1: false keeps micro-batches local and reduces their sum once per update (k times fewer messages)",
       [](const Ctx& c, RunConfig& r) { r.training.parallel.reduce_every_micro_batch = c.boolean(); }},

      {"train.on_non_finite", "raise", "a NaN/Inf loss or gradient: raise (stop, naming step and tensor) or skip (not applied; warned, counted in the summary)",
       [](const Ctx& c, RunConfig& r) { r.training.on_non_finite = c.choice({"raise", "skip"}); }},
      {"train.check_every_value", "false", "debugging: check every intermediate value so the error names the first non-finite tensor",
       [](const Ctx& c, RunConfig& r) { r.training.check_every_value = c.boolean(); }},
      {"train.profile", "false", "after training, print where train_step's time went, per step of its plan (docs/performance.md)",
       [](const Ctx& c, RunConfig& r) { r.training.profile = c.boolean(); }},
      {"train.max_skipped_steps", "0", "with on_non_finite skip: fail (exit 1) once more steps than this were skipped; 0 = no limit",
       [](const Ctx& c, RunConfig& r) { r.max_skipped_steps = c.integer(0); }},
      {"train.epochs", "1", "passes over the training data", [](const Ctx& c, RunConfig& r) { r.epochs = c.integer(1); }},
      {"train.max_steps", "0", "stop after this many optimizer steps; 0 = no limit", [](const Ctx& c, RunConfig& r) { r.max_steps = c.integer(0); }},
      {"train.batch_size", "32", "rows per batch (per rank under mpirun: a step trains on batch_size x ranks rows)", [](const Ctx& c, RunConfig& r) { r.batch_size = c.integer(1); }},
      {"train.eval_batch_size", "0", "rows per validation batch; 0 = train.batch_size", [](const Ctx& c, RunConfig& r) { r.eval_batch_size = c.integer(0); }},
      {"train.metrics", "[loss]", "validation metrics: " + join(metric_kinds()), [](const Ctx& c, RunConfig& r) {
         r.metrics.clear();
         for (const std::string& m : c.strings()) r.metrics.push_back(Ctx{YAML::Node(m), c.key, c.where}.choice(metric_kinds()));
       }},
      {"early_stopping.patience", "0", "stop after this many epochs without improvement; 0 = off", [](const Ctx& c, RunConfig& r) { r.patience = c.integer(0); }},
      {"early_stopping.metric", "val_loss", "train_loss or val_<metric>", [](const Ctx& c, RunConfig& r) { r.early_metric = c.str(); }},
      {"early_stopping.min_delta", "0.0", "smallest change that counts as an improvement", [](const Ctx& c, RunConfig& r) { r.min_delta = c.num(0, kInf); }},
      {"early_stopping.mode", "auto", "min, max, or auto (max for accuracy and r2)", [](const Ctx& c, RunConfig& r) { r.early_mode = c.choice({"auto", "min", "max"}); }},
      {"checkpoint.every", "0", "save a checkpoint every N optimizer steps (0: only at the end and on Ctrl-C)", [](const Ctx& c, RunConfig& r) { r.checkpoint_every = c.integer(0); }},
      {"checkpoint.keep_last", "3", "keep the newest K step checkpoints; 0 = all", [](const Ctx& c, RunConfig& r) { r.keep_last = c.integer(0, 1 << 20); }},
      {"log.file", "metrics.csv", "metrics file in the output folder (.csv, or .jsonl for JSON lines)", [](const Ctx& c, RunConfig& r) { r.log_file = c.str(); }},
      {"log.format", "auto", "auto (from the extension), csv or jsonl", [](const Ctx& c, RunConfig& r) { r.log_format = c.choice({"auto", "csv", "jsonl"}); }},
      {"log.every", "1", "write a step row every N batches (epoch rows always)", [](const Ctx& c, RunConfig& r) { r.log_every = c.integer(1); }},
      {"log.progress", "auto", "auto (a bar on a terminal, lines otherwise), bar, lines or none", [](const Ctx& c, RunConfig& r) { r.progress = c.choice({"auto", "bar", "lines", "none"}); }},
  };
  return k;
}

const Key* find_key(const std::string& path) {
  for (const Key& k : keys())
    if (k.path == path) return &k;
  return nullptr;
}

bool is_section(const std::string& path) {
  for (const Key& k : keys())
    if (k.path.rfind(path + ".", 0) == 0) return true;
  return false;
}

// The names valid directly under a section ("" = top level).
std::vector<std::string> children(const std::string& section) {
  std::vector<std::string> r;
  const std::string prefix = section.empty() ? "" : section + ".";
  for (const Key& k : keys()) {
    if (k.path.rfind(prefix, 0) != 0) continue;
    std::string rest = k.path.substr(prefix.size());
    rest = rest.substr(0, rest.find('.'));
    if (std::find(r.begin(), r.end(), rest) == r.end()) r.push_back(rest);
  }
  return r;
}

struct Parser {
  std::string source;
  std::set<std::string> from_set;
  RunConfig& cfg;

  std::string where(const std::string& key, const YAML::Mark& m) const {
    if (from_set.count(key)) return "--set " + key;
    return m.is_null() ? source : source + ":" + std::to_string(m.line + 1);
  }

  void walk(const YAML::Node& map, const std::string& section) {
    for (auto it = map.begin(); it != map.end(); ++it) {
      const std::string name = key_name(it->first, section, where(section, it->first.Mark()));
      const std::string key = section.empty() ? name : section + "." + name;
      const std::string loc = where(key, it->first.Mark());
      if (const Key* k = find_key(key)) {
        k->parse(Ctx{it->second, key, loc}, cfg);
        cfg.locations[key] = loc;
      } else if (is_section(key)) {
        if (it->second.IsNull()) continue;
        if (!it->second.IsMap()) fail(loc, key + ": expected a mapping of: " + join(children(key)));
        walk(it->second, key);
      } else {
        std::vector<std::string> siblings = children(section);
        std::string hint = did_you_mean(name, siblings);
        if (hint.empty()) {  // a key put in the wrong section
          for (const Key& k : keys())
            if (k.path.substr(k.path.rfind('.') + 1) == name) hint = k.path;
        } else if (!section.empty()) {
          hint = section + "." + hint;
        }
        fail(loc, "unknown key '" + key + "'" + (hint.empty() ? "" : " (did you mean '" + hint + "'?)") +
                      "; valid keys" + (section.empty() ? "" : " under '" + section + "'") + ": " + join(siblings));
      }
    }
  }
};

void apply_override(YAML::Node& root, const std::string& kv) {
  const size_t eq = kv.find('=');
  if (eq == std::string::npos || eq == 0) fail("--set " + kv, "expected key=value, e.g. --set optimizer.learning_rate=0.1");
  const std::string key = kv.substr(0, eq), value = kv.substr(eq + 1);
  YAML::Node cur = root;
  size_t start = 0;
  while (true) {
    const size_t dot = key.find('.', start);
    const std::string part = key.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (part.empty()) fail("--set " + key, "empty key component");
    if (dot == std::string::npos) {
      try {
        cur[part] = YAML::Load(value);
      } catch (const YAML::Exception& e) {
        fail("--set " + key, "the value is not valid YAML: " + e.msg);
      }
      return;
    }
    YAML::Node next = cur[part];
    if (!next.IsMap()) {
      cur[part] = YAML::Node(YAML::NodeType::Map);
      next = cur[part];
    }
    cur.reset(next);
    start = dot + 1;
  }
}

}  // namespace

std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = std::max<size_t>(2, word.size() / 3) + 1;
  for (const std::string& c : candidates) {
    // Levenshtein distance, one row at a time.
    std::vector<size_t> row(c.size() + 1);
    for (size_t j = 0; j <= c.size(); ++j) row[j] = j;
    for (size_t i = 1; i <= word.size(); ++i) {
      size_t diag = row[0];
      row[0] = i;
      for (size_t j = 1; j <= c.size(); ++j) {
        const size_t up = row[j];
        row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (word[i - 1] == c[j - 1] ? 0 : 1)});
        diag = up;
      }
    }
    if (row[c.size()] < best_d) best_d = row[c.size()], best = c;
  }
  return best;
}

std::filesystem::path RunConfig::resolve(const std::string& p) const {
  std::filesystem::path path(p);
  if (path.is_absolute()) return path;
  return (source.has_parent_path() ? source.parent_path() : std::filesystem::path(".")) / path;
}

std::string RunConfig::locate(const std::string& message) const {
  // Library errors start with the key they are about ("optimizer.learning_rate: ..." or "schedule.kind: ...").
  const size_t colon = message.find(':');
  if (colon == std::string::npos) return message;
  std::string key = message.substr(0, colon);
  while (!key.empty()) {
    if (auto it = locations.find(key); it != locations.end()) return it->second + ": " + message;
    const size_t dot = key.rfind('.');
    if (dot == std::string::npos) break;
    key.resize(dot);
    // A key left at its default: point at its section, where a sibling was set.
    for (const auto& [k, loc] : locations)
      if (k.rfind(key + ".", 0) == 0) return loc + ": " + message;
  }
  return message;
}

// YAML is UTF-8. yaml-cpp reads other bytes but writes them back escaped differently, so a config holding them
// would not reproduce itself from the copy a checkpoint stores (found by fuzz_config): refuse it up front.
void require_utf8(const std::string& s, const std::string& where) {
  size_t line = 1;
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    bool ok = len != 0 && i + len <= s.size() && !(len == 2 && c < 0xC2);
    for (size_t k = 1; ok && k < len; ++k) ok = (static_cast<unsigned char>(s[i + k]) & 0xC0) == 0x80;
    if (!ok)
      fail(where + (where.rfind("--set", 0) == 0 ? "" : ":" + std::to_string(line)),
           "not valid UTF-8 (byte " + std::to_string(c) + " at offset " + std::to_string(i) + "); YAML text must be UTF-8");
    if (c == '\n') ++line;
    i += len;
  }
}

RunConfig parse_config(const std::string& text, const std::filesystem::path& source,
                       const std::vector<std::string>& overrides) {
  require_utf8(text, source.string());
  for (const std::string& kv : overrides) require_utf8(kv, "--set " + kv.substr(0, kv.find('=')));
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    fail(source.string() + ":" + std::to_string(e.mark.line + 1), "not valid YAML: " + e.msg);
  }
  if (root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  if (!root.IsMap()) fail(source.string(), "expected a mapping of keys (model:, data:, optimizer:, ...) at the top");
  RunConfig cfg;
  cfg.source = source;
  Parser p{source.string(), {}, cfg};
  for (const std::string& kv : overrides) {
    apply_override(root, kv);
    p.from_set.insert(kv.substr(0, kv.find('=')));
  }
  p.walk(root, "");
  if (cfg.model.empty()) fail(source.string(), "model: required key missing (the ONNX model to train)");
  if (cfg.data.train.empty()) fail(source.string(), "data.train: required key missing (the training data file)");
  if (cfg.output.empty()) cfg.output = "runs/" + source.stem().string();
  cfg.training.device = cfg.device;
  if (cfg.patience > 0 && cfg.early_metric != "train_loss") {
    std::vector<std::string> valid = {"train_loss"};
    for (const std::string& m : cfg.metrics) valid.push_back("val_" + m);
    if (std::find(valid.begin(), valid.end(), cfg.early_metric) == valid.end()) {
      std::string hint = did_you_mean(cfg.early_metric, valid);
      fail(cfg.locations.count("early_stopping.metric") ? cfg.locations["early_stopping.metric"] : source.string(),
           "early_stopping.metric: expected one of: " + join(valid) + " (train.metrics decides the val_ ones); got '" +
               cfg.early_metric + "'" + (hint.empty() ? "" : " (did you mean '" + hint + "'?)"));
    }
  }
  YAML::Emitter out;
  out << root;
  cfg.text = out.c_str();
  return cfg;
}

RunConfig load_config(const std::filesystem::path& path, const std::vector<std::string>& overrides) {
  std::ifstream f(path);
  if (!f) fail(path.string(), "cannot open the config file");
  std::stringstream s;
  s << f.rdbuf();
  return parse_config(s.str(), path, overrides);
}

std::string reference_config() {
  std::string out = "# onnxtrain run configuration: every key with its default.\n";
  std::string section;
  for (const Key& k : keys()) {
    const size_t dot = k.path.find('.');
    const std::string sec = dot == std::string::npos ? "" : k.path.substr(0, dot);
    if (sec != section && !sec.empty()) out += sec + ":\n";
    section = sec;
    const std::string name = sec.empty() ? k.path : "  " + k.path.substr(dot + 1);
    out += name + ": " + k.def + "  # " + k.help + "\n";
  }
  return out;
}

}  // namespace onnxtrain::cli
