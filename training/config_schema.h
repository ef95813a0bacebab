#pragma once
// Every TrainingConfig option, declared once (issue 28): its key, type, default, allowed values, help text and
// the ways in where it applies. The CLI's keys and `onnxtrain config`'s reference (cli/config.cpp), the Python
// spec classes' help and `onnxtrain._onnxtrain.config_schema()` (python/src/specs.cpp) and the checkpoint
// metadata (training/checkpoint.cpp) are generated from this table; tests check the Python keyword arguments,
// the stubs and docs/cli.md against it. Adding an option: one entry in config_schema.cpp, plus its behaviour.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "training/session.h"

namespace onnxtrain {

enum class OptionKind {
  Bool,
  Integer,          // int, int64_t or size_t field, within [min, max]
  Number,           // double within [min, max] (or (min, max] when open_min)
  OptionalNumber,   // std::optional<double>; null = unset
  OptionalInteger,  // std::optional<int64_t>; null = unset
  String,           // free text
  Choice,           // one of `choices`
  Strings,          // a string or a list of strings
  Numbers,          // a list of finite numbers
  Groups,           // optimizer.groups: a list of ParamGroup (each way in has its own reader)
};

// The ways in an option applies to, as bits of ConfigOption::ways.
enum OptionWay : unsigned {
  kWayCli = 1,         // a key of `onnxtrain train`'s YAML config
  kWayPython = 2,      // a field of Python's TrainingConfig (or of one of its spec objects)
  kWayCheckpoint = 4,  // stored in checkpoint metadata and restored on resume
};

// A typed reference to the option's field inside one TrainingConfig.
using OptionField = std::variant<bool*, int*, int64_t*, size_t*, double*, std::optional<double>*, std::optional<int64_t>*,
                                 std::string*, std::vector<double>*, std::vector<std::string>*, std::vector<ParamGroup>*>;

struct ConfigOption {
  std::string key;           // "optimizer.beta1": the CLI key, "<section>.<field>"
  OptionKind kind;
  std::string default_text;  // the default as YAML, as `onnxtrain config` prints it
  std::string help;
  unsigned ways;             // OptionWay bits
  OptionField (*field)(TrainingConfig&);
  std::vector<std::string> choices = {};  // Choice
  double min = 0, max = 0;   // Integer, Number, Optional*: the valid range (max = infinity: no upper bound)
  bool open_min = false;     // Number: min itself is not allowed
  std::string python = {};   // the attribute path on Python's TrainingConfig; "" = key
  std::string checkpoint = {};  // the checkpoint metadata key (after "onnxtrain."); "" = key

  const std::string& python_path() const { return python.empty() ? key : python; }
  const std::string& checkpoint_key() const { return checkpoint.empty() ? key : checkpoint; }
  bool applies_to(OptionWay w) const { return (ways & w) != 0; }
};

// Every option, in the order `onnxtrain config` lists them.
const std::vector<ConfigOption>& config_options();
// The option with this key, or nullptr.
const ConfigOption* find_config_option(const std::string& key);
// Kind names as config_schema() reports them to Python ("bool", "integer", ...).
std::string option_kind_name(OptionKind kind);

}  // namespace onnxtrain
