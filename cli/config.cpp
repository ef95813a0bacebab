#include "cli/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <set>
#include <sstream>
#include <type_traits>
#include <variant>

#include "executor/device.h"
#include "graph/error.h"
#include "training/config_schema.h"
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

// optimizer.groups: a list of {match, learning_rate, weight_decay} mappings.
void parse_groups(const Ctx& c, std::vector<ParamGroup>& groups) {
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
    groups.push_back(pg);
  }
}

// The value of a schema option (training/config_schema.h), read by the option's field type and checked
// against its range or choices.
int64_t int_bound(double v) {
  return v >= 9.2e18 ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(v);
}
template <class T> void read_into(const ConfigOption& o, const Ctx& c, T& field) {
  if constexpr (std::is_same_v<T, bool>) field = c.boolean();
  else if constexpr (std::is_integral_v<T>) field = static_cast<T>(c.integer(int_bound(o.min), int_bound(o.max)));
  else if constexpr (std::is_same_v<T, double>) field = c.num(o.min, o.max, o.open_min);
  else if constexpr (std::is_same_v<T, std::optional<double>>) field = c.opt_num(o.min, o.max, o.open_min);
  else if constexpr (std::is_same_v<T, std::optional<int64_t>>) {
    if (c.node.IsNull()) field.reset();
    else field = c.integer(int_bound(o.min), int_bound(o.max));
  } else if constexpr (std::is_same_v<T, std::string>) field = o.kind == OptionKind::Choice ? c.choice(o.choices) : c.str();
  else if constexpr (std::is_same_v<T, std::vector<std::string>>) field = c.strings();
  else if constexpr (std::is_same_v<T, std::vector<double>>) field = c.numbers();
  else if constexpr (std::is_same_v<T, std::vector<ParamGroup>>) parse_groups(c, field);
  else static_assert(sizeof(T) == 0, "a field type config_schema.h allows but the CLI cannot read");
}

Key schema_key(const ConfigOption& o) {
  return {o.key, o.default_text, o.help, [&o](const Ctx& c, RunConfig& r) {
            std::visit([&](auto* field) { read_into(o, c, *field); }, o.field(r.training));
          }};
}

// Keys of the run only (not of TrainingConfig), before and after the schema's options.
std::vector<Key> run_keys_before() {
  return {
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

  };
}

std::vector<Key> run_keys_after() {
  return {
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
}

// Every key: the run's own and every schema option that applies to the CLI. Grouped by section in the order
// each section first appears, which is the reference config's order.
const std::vector<Key>& keys() {
  static const std::vector<Key> k = [] {
    std::vector<Key> all = run_keys_before();
    for (const ConfigOption& o : config_options())
      if (o.applies_to(kWayCli)) all.push_back(schema_key(o));
    for (Key& key : run_keys_after()) all.push_back(std::move(key));
    auto section_of = [](const Key& key) {
      const size_t dot = key.path.find('.');
      return dot == std::string::npos ? std::string() : key.path.substr(0, dot);
    };
    std::vector<std::string> sections;
    for (const Key& key : all)
      if (std::find(sections.begin(), sections.end(), section_of(key)) == sections.end()) sections.push_back(section_of(key));
    auto rank = [&](const Key& key) { return std::find(sections.begin(), sections.end(), section_of(key)) - sections.begin(); };
    std::stable_sort(all.begin(), all.end(), [&](const Key& a, const Key& b) { return rank(a) < rank(b); });
    return all;
  }();
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
