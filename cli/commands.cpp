#include "cli/commands.h"

#include <cstdio>
#include <functional>

#include "cli/config.h"
#include "cli/run.h"
#include "cli/setup.h"
#include "graph/error.h"
#include "graph/model_io.h"
#include "training/adapters.h"
#include "training/external_data.h"

namespace onnxtrain::cli {

namespace {

const std::map<std::string, const char*>& usages() {
  static const std::map<std::string, const char*> u = {
      {"", "usage: onnxtrain <command> [args]   (onnxtrain <command> --help for details)\n\n"
           "commands:\n"
           "  train CONFIG.yaml [--set key=value ...]    train or fine-tune a model from a config file\n"
           "  resume CHECKPOINT [--set key=value ...]    continue a run from one of its checkpoints\n"
           "  eval CONFIG.yaml [--model M] [--data F]    validation metrics of a model or checkpoint\n"
           "  export CHECKPOINT -o MODEL.onnx [--adapters]  the clean inference model of a checkpoint (LoRA: merged)\n"
           "  merge BASE ADAPTERS -o MODEL.onnx          fold a LoRA adapters file into its base model\n"
           "  info MODEL                                 inputs, outputs, weights, ops without a gradient rule\n"
           "  config                                     print the reference config (every key, its default)\n"
           "  ops                                        list every op with a CPU kernel or gradient rule (markdown)\n"
           "  gradient-graph MODEL -o OUT [--trainable a,b]  model + MSE loss + backward as standard ONNX\n"
           "  --version, --help\n\n"
           "exit codes: 0 ok, 1 failed while running, 2 usage or config error, 130 interrupted (checkpoint saved)\n"
           "docs: docs/cli.md\n"},
      {"train", "usage: onnxtrain train CONFIG.yaml [--set key=value ...]\n\n"
                "Trains the config's model on its data. Writes OUTPUT/model.onnx (inference model), OUTPUT/checkpoints/\n"
                "step-N.onnx (resumable) and OUTPUT/metrics.csv. --set overrides a config key (dotted path, YAML value),\n"
                "e.g. --set optimizer.learning_rate=0.1 --set train.epochs=5. Ctrl-C saves a checkpoint and exits 130.\n"
                "Every key: onnxtrain config, or docs/cli.md.\n"},
      {"resume", "usage: onnxtrain resume CHECKPOINT [--set key=value ...]\n\n"
                 "Continues the run a checkpoint was saved from: same data order, step count and learning-rate schedule.\n"
                 "The checkpoint carries the run's config; --set may change train.epochs, train.max_steps, checkpoint.*,\n"
                 "early_stopping.*, log.progress, threads, replicas and output.\n"},
      {"eval", "usage: onnxtrain eval CONFIG.yaml [--model MODEL_OR_CHECKPOINT] [--data FILE] [--set key=value ...]\n\n"
               "Prints train.metrics of the model (default: the config's model) on FILE (default: the config's\n"
               "validation data), one 'name value' line each.\n"},
      {"export", "usage: onnxtrain export CHECKPOINT -o MODEL.onnx [--adapters]\n\n"
                 "Writes the checkpoint's inference model: current weights, no training info, no optimizer state.\n"
                 "With LoRA adapters (docs/lora.md) they are merged into their weights, so MODEL.onnx is the base\n"
                 "architecture with new weights; --adapters writes the adapters alone instead (a small ONNX file\n"
                 "for onnxtrain merge, with the weights trained in full beside them, such as a new head).\n"},
      {"merge", "usage: onnxtrain merge BASE.onnx ADAPTERS.onnx -o MODEL.onnx\n\n"
                "Applies a LoRA adapters file (onnxtrain export --adapters) to the base model it was trained on and\n"
                "folds it into the weights: W + (A B) * alpha / rank. MODEL.onnx is a plain ONNX model.\n"},
      {"info", "usage: onnxtrain info MODEL\n\n"
               "Inputs, outputs, floating-point initializers (trainable candidates) with sizes, and the ops without a\n"
               "gradient rule or CPU kernel, so you know before training whether the model can be trained.\n\n"
               "Exit status: 0 trainable, 3 not trainable (ops without a CPU kernel), 4 partly trainable (ops without a\n"
               "gradient rule on a weight's path: freeze the weights before them), 2 not a valid model.\n"},
      {"config", "usage: onnxtrain config\n\nPrints the reference config: every key with its default and meaning.\n"},
      {"ops", "usage: onnxtrain ops\n\nLists every op with a CPU kernel or a gradient rule, as markdown (docs/ops.md).\n"},
      {"gradient-graph", "usage: onnxtrain gradient-graph MODEL -o OUT [--trainable a,b,...]\n\n"
                         "Writes MODEL + MSE loss + backward as a standard ONNX model: inputs are MODEL's plus 'target',\n"
                         "outputs are 'loss' and '<weight>_grad' for each trainable weight.\n"},
  };
  return u;
}

// Config errors exit 2; errors found while running exit 1 and are located in the config when they name a key.
int run_guarded(const std::string& cmd, const RunConfig* cfg, const std::function<int()>& f) {
  try {
    return f();
  } catch (const Error& e) {
    const std::string message = "onnxtrain " + cmd + ": " + (cfg ? cfg->locate(e.what()) : std::string(e.what()));
    // The other ranks may be waiting in a collective for this one: end the job now rather than at their timeout.
    if (Communicator* job = world_if_made(); job && job->size() > 1 && !job->broken()) job->abort(kExitFailure, message);
    std::fprintf(stderr, "%s\n", message.c_str());
    return kExitFailure;
  }
}

bool load_config_or_report(const std::string& cmd, const std::function<void()>& f) {
  try {
    f();
    return true;
  } catch (const Error& e) {
    std::fprintf(stderr, "onnxtrain %s: %s\n", cmd.c_str(), e.what());
    return false;
  }
}

// Only keys that leave the steps as they were may change, or the resumed run would not continue the original.
bool changeable_when_resuming(const std::vector<std::string>& sets) {
  static const std::vector<std::string> changeable = {"train.epochs", "train.max_steps", "train.max_skipped_steps", "checkpoint.every", "checkpoint.keep_last",
                                                      "early_stopping.patience", "early_stopping.min_delta", "log.progress",
                                                      "threads", "replicas", "output", "device",
                                                      // how the ranks reduce, not what: the same steps
                                                      "distributed.overlap", "distributed.bucket_bytes"};
  for (const std::string& kv : sets) {
    const std::string key = kv.substr(0, kv.find('='));
    if (std::find(changeable.begin(), changeable.end(), key) == changeable.end()) {
      std::string all;
      for (const std::string& c : changeable) all += (all.empty() ? "" : ", ") + c;
      std::fprintf(stderr, "onnxtrain resume: --set %s: cannot change when resuming (the run would not continue the same way); "
                           "changeable: %s\n", key.c_str(), all.c_str());
      return false;
    }
  }
  return true;
}

// The run config a checkpoint carries (the YAML after the original --set overrides) with these `sets`.
RunConfig checkpoint_config(const Model& ckpt, const std::string& path, const std::vector<std::string>& sets) {
  const std::string* text = metadata_value(ckpt, kConfigKey);
  const std::string* source = metadata_value(ckpt, kConfigPathKey);
  if (!text || !source) fail(path, "has no run config ('" + std::string(kConfigKey) + "'): not written by onnxtrain train");
  return parse_config(*text, *source, sets);
}

}  // namespace

const char* usage_of(const std::string& command) {
  auto it = usages().find(command);
  return it == usages().end() ? nullptr : it->second;
}

Args parse_args(const std::vector<std::string>& argv, const std::vector<std::string>& valued,
                const std::vector<std::string>& flags) {
  Args a;
  auto in = [](const std::vector<std::string>& v, const std::string& s) { return std::find(v.begin(), v.end(), s) != v.end(); };
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& s = argv[i];
    if (s == "-h" || s == "--help") a.help = true;
    else if (s == "--set" || in(valued, s)) {
      if (i + 1 >= argv.size()) throw UsageError(s + " needs a value");
      (s == "--set" ? (a.sets.push_back(argv[++i]), void()) : (a.options[s] = argv[++i], void()));
    } else if (s.rfind("--set=", 0) == 0) a.sets.push_back(s.substr(6));
    else if (in(flags, s)) a.options[s] = "";
    else if (s.size() > 1 && s[0] == '-') throw UsageError("unknown option '" + s + "'");
    else a.positional.push_back(s);
  }
  return a;
}

int cmd_train(const std::vector<std::string>& argv) {
  Args a = parse_args(argv, {});
  if (a.help) return std::printf("%s", usage_of("train")), 0;
  if (a.positional.size() != 1) throw UsageError("expected one config file");
  RunConfig cfg;
  if (!load_config_or_report("train", [&] { cfg = load_config(a.positional[0], a.sets); })) return kExitUsage;
  return run_guarded("train", &cfg, [&] {
    RunData data = load_run_data(cfg);
    std::unique_ptr<Session> session = build_session(cfg, data);
    TrainResult result = run(cfg, *session, data);
    return report(cfg, *session, result);
  });
}

int cmd_resume(const std::vector<std::string>& argv) {
  Args a = parse_args(argv, {});
  if (a.help) return std::printf("%s", usage_of("resume")), 0;
  if (a.positional.size() != 1) throw UsageError("expected one checkpoint file");
  if (!changeable_when_resuming(a.sets)) return kExitUsage;
  const std::string path = a.positional[0];
  Model ckpt;
  RunConfig cfg;
  bool ok = load_config_or_report("resume", [&] {
    ckpt = load_model(path);
    cfg = checkpoint_config(ckpt, path, a.sets);
  });
  if (!ok) return kExitUsage;
  return run_guarded("resume", &cfg, [&] {
    RunData data = load_run_data(cfg);
    // The global batch stays the checkpoint's, whatever the number of ranks now (docs/distributed.md).
    cfg.batch_size = resumed_batch_size(ckpt, world()->size(), path);
    std::unique_ptr<Session> session = restore_session(cfg, ckpt, path);
    TrainResult result = run(cfg, *session, data, Resume{ckpt, path});
    return report(cfg, *session, result);
  });
}

int cmd_eval(const std::vector<std::string>& argv) {
  Args a = parse_args(argv, {"--model", "--data"});
  if (a.help) return std::printf("%s", usage_of("eval")), 0;
  if (a.positional.size() != 1) throw UsageError("expected one config file");
  RunConfig cfg;
  if (!load_config_or_report("eval", [&] { cfg = load_config(a.positional[0], a.sets); })) return kExitUsage;
  return run_guarded("eval", &cfg, [&] {
    Dataset rows;
    if (a.options.count("--data")) {
      rows = read_data_file(a.options["--data"], {cfg.data.csv_delimiter.at(0), cfg.data.csv_header});
    } else {
      RunData d = load_run_data(cfg);
      if (d.validation.empty())
        fail(cfg.source.string(), "no evaluation data: pass --data FILE, or set data.validation or data.validation_split");
      rows = std::move(d.validation);
    }
    const std::string model_path = a.options.count("--model") ? a.options["--model"] : cfg.resolve(cfg.model).string();
    TrainingSession s = evaluation_session(cfg, model_path);
    DataLoader dl(make_feeds(cfg, s, rows, "evaluation"), cfg.eval_batch_size > 0 ? cfg.eval_batch_size : cfg.batch_size);
    Evaluator ev(s, cfg.training.prediction, cfg.training.loss.kind);
    for (const auto& [k, v] : ev.evaluate(s, dl, cfg.metrics)) std::printf("%s %.6g\n", k.c_str(), v);
    return 0;
  });
}

int cmd_export(const std::vector<std::string>& argv) {
  Args a = parse_args(argv, {"-o", "--output"}, {"--adapters"});
  if (a.help) return std::printf("%s", usage_of("export")), 0;
  if (a.options.count("--output")) a.options["-o"] = a.options["--output"];
  if (a.positional.size() != 1 || !a.options.count("-o")) throw UsageError("expected CHECKPOINT -o MODEL.onnx");
  return run_guarded("export", nullptr, [&] {
    const std::string& ckpt = a.positional[0];
    TrainingSession s = TrainingSession::from_checkpoint(ckpt);
    const bool lora = !find_lora(s.export_shell().graph).empty();
    if (!lora && !a.options.count("--adapters")) {
      // Streamed from the session (external data past 2 GB): no copy of the weights (docs/checkpoint.md).
      s.export_inference(std::filesystem::path(a.options["-o"]));
      std::printf("wrote %s\n", a.options["-o"].c_str());
      return 0;
    }
    Model m = s.export_inference();
    if (a.options.count("--adapters")) {
      if (!lora) fail(ckpt, "--adapters: the checkpoint has no LoRA adapters (adapter.kind is none)");
      std::vector<std::string> also;  // weights trained in full beside the adapters (a new head)
      for (const std::string& w : s.trainable())
        if (!w.ends_with(".lora_A") && !w.ends_with(".lora_B")) also.push_back(w);
      m = extract_lora(m, s.config().adapter, also);
    } else if (lora) {
      merge_lora(m);
    }
    save_model_large(m, a.options["-o"]);  // external data past 2 GB
    std::printf("wrote %s\n", a.options["-o"].c_str());
    return 0;
  });
}

int cmd_merge(const std::vector<std::string>& argv) {
  Args a = parse_args(argv, {"-o", "--output"});
  if (a.help) return std::printf("%s", usage_of("merge")), 0;
  if (a.options.count("--output")) a.options["-o"] = a.options["--output"];
  if (a.positional.size() != 2 || !a.options.count("-o")) throw UsageError("expected BASE ADAPTERS -o MODEL.onnx");
  return run_guarded("merge", nullptr, [&] {
    Model m = apply_lora_file(load_model(a.positional[0]), load_model(a.positional[1]), a.positional[1]);
    const int n = merge_lora(m);
    save_model(m, a.options["-o"]);
    std::printf("merged %d adapted weights; wrote %s\n", n, a.options["-o"].c_str());
    return 0;
  });
}

int cmd_config(const std::vector<std::string>& argv) {
  Args a = parse_args(argv, {});
  if (a.help) return std::printf("%s", usage_of("config")), 0;
  if (!a.positional.empty()) throw UsageError("config takes no arguments");
  std::printf("%s", reference_config().c_str());
  return 0;
}

}  // namespace onnxtrain::cli
