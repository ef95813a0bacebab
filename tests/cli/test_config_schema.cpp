// The option schema (training/config_schema.h) against the ways in generated from it: every option that applies
// to the CLI is a key whose value lands in its field and whose printed default is TrainingConfig's default;
// every option that applies to checkpoints round-trips through checkpoint metadata, under its stored key.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <sstream>
#include <type_traits>
#include <variant>

#include "cli/config.h"
#include "training/checkpoint.h"
#include "training/config_schema.h"

namespace onnxtrain {
namespace {

const std::string kBase = "model: m.onnx\ndata:\n  train: t.npz\n";

// A value other than the default for an option: as YAML, and written into a config's field directly.
struct Sample {
  std::string yaml;
  OptionField value;  // points into `holder`
  TrainingConfig holder;
};

std::string text_of(double v) {
  std::ostringstream s;
  s.precision(17);
  s << v;
  return s.str();
}

std::string unquoted(const std::string& s) { return s.size() >= 2 && s.front() == '"' ? s.substr(1, s.size() - 2) : s; }

// Fills the option's field of s.holder with a non-default value and s.yaml with the same value as YAML.
void make_sample(const ConfigOption& o, Sample& s) {
  s.value = o.field(s.holder);
  std::visit(
      [&](auto* f) {
        using T = std::remove_pointer_t<decltype(f)>;
        const double mid = std::isinf(o.max) ? o.min + 2.5 : o.min + (o.max - o.min) * 0.375;
        if constexpr (std::is_same_v<T, bool>) {
          *f = o.default_text != "true";
          s.yaml = *f ? "true" : "false";
        } else if constexpr (std::is_integral_v<T>) {
          *f = static_cast<T>(o.min + 3);
          s.yaml = std::to_string(*f);
        } else if constexpr (std::is_same_v<T, double> || std::is_same_v<T, std::optional<double>>) {
          *f = mid;
          s.yaml = text_of(mid);
        } else if constexpr (std::is_same_v<T, std::optional<int64_t>>) {
          *f = 7;
          s.yaml = "7";
        } else if constexpr (std::is_same_v<T, std::string>) {
          *f = "out_1";
          for (const std::string& c : o.choices)
            if (c != unquoted(o.default_text)) *f = c;
          s.yaml = "\"" + *f + "\"";
        } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
          *f = {"a,b", "c"};
          s.yaml = "[\"a,b\", c]";
        } else if constexpr (std::is_same_v<T, std::vector<double>>) {
          *f = {1.5, -2};
          s.yaml = "[1.5, -2]";
        } else if constexpr (std::is_same_v<T, std::vector<ParamGroup>>) {
          ParamGroup g;
          g.match = {"w*", "b"};
          g.learning_rate = 0.5;
          *f = {g};
          s.yaml = "[{match: [\"w*\", b], learning_rate: 0.5}]";
        } else {
          static_assert(sizeof(T) == 0, "a field type without a sample");
        }
      },
      s.value);
}

bool same_field(const OptionField& a, const OptionField& b) {
  return std::visit(
      [&](auto* x) {
        using P = decltype(x);
        auto* y = std::get<P>(b);
        using T = std::remove_pointer_t<P>;
        if constexpr (std::is_same_v<T, std::vector<ParamGroup>>) {
          if (x->size() != y->size()) return false;
          for (size_t i = 0; i < x->size(); ++i)
            if ((*x)[i].match != (*y)[i].match || (*x)[i].learning_rate != (*y)[i].learning_rate ||
                (*x)[i].weight_decay != (*y)[i].weight_decay)
              return false;
          return true;
        } else {
          return *x == *y;
        }
      },
      a);
}

TEST(ConfigSchema, KeysAreUniqueAndWellFormed) {
  std::set<std::string> keys, python, checkpoint;
  for (const ConfigOption& o : config_options()) {
    SCOPED_TRACE(o.key);
    EXPECT_TRUE(keys.insert(o.key).second) << "key given twice";
    if (o.applies_to(kWayPython)) {
      EXPECT_TRUE(python.insert(o.python_path()).second);
    }
    if (o.applies_to(kWayCheckpoint)) {
      EXPECT_TRUE(checkpoint.insert(o.checkpoint_key()).second);
    }
    EXPECT_FALSE(o.help.empty());
    EXPECT_NE(o.ways, 0u);
    EXPECT_EQ(find_config_option(o.key), &o);
    if (o.kind == OptionKind::Choice) {
      EXPECT_FALSE(o.choices.empty());
    }
  }
  // The stored spelling of the numerical guard predates the CLI's train: section; old checkpoints use it.
  EXPECT_EQ(find_config_option("train.on_non_finite")->checkpoint_key(), "numerics.on_non_finite");
}

TEST(ConfigSchema, EveryCliOptionIsAKeyThatSetsItsField) {
  const std::string reference = cli::reference_config();
  for (const ConfigOption& o : config_options()) {
    if (!o.applies_to(kWayCli)) continue;
    SCOPED_TRACE(o.key);
    const std::string name = o.key.substr(o.key.rfind('.') + 1);
    EXPECT_NE(reference.find(name + ": " + o.default_text + "  # " + o.help + "\n"), std::string::npos);
    Sample s;
    make_sample(o, s);
    cli::RunConfig c = cli::parse_config(kBase, "run.yaml", {o.key + "=" + s.yaml});
    EXPECT_TRUE(same_field(o.field(c.training), s.value)) << "--set " << o.key << "=" << s.yaml;
  }
}

TEST(ConfigSchema, PrintedDefaultsAreTrainingConfigDefaults) {
  // Printed differently from the empty list they stand for (the same meaning, docs/lora.md, docs/memory.md).
  const std::set<std::string> spelled_out = {"adapter.target", "memory.recompute"};
  for (const ConfigOption& o : config_options()) {
    if (!o.applies_to(kWayCli) || spelled_out.count(o.key)) continue;
    SCOPED_TRACE(o.key);
    cli::RunConfig c = cli::parse_config(kBase, "run.yaml", {o.key + "=" + o.default_text});
    TrainingConfig defaults;
    EXPECT_TRUE(same_field(o.field(c.training), o.field(defaults)));
  }
}

TEST(ConfigSchema, EveryCheckpointOptionRoundTripsThroughMetadata) {
  const Metadata defaults = config_to_metadata(TrainingConfig{});
  for (const ConfigOption& o : config_options()) {
    if (!o.applies_to(kWayCheckpoint)) continue;
    SCOPED_TRACE(o.key);
    Sample s;
    make_sample(o, s);
    const Metadata written = config_to_metadata(s.holder);
    EXPECT_NE(written, defaults) << "the option is not stored";
    bool found = false;
    for (const auto& [k, v] : written) found = found || k == std::string(kCheckpointKeyPrefix) + o.checkpoint_key();
    EXPECT_TRUE(found) << "no metadata key onnxtrain." << o.checkpoint_key();
    TrainingConfig back = config_from_metadata(written, "test");
    EXPECT_TRUE(same_field(o.field(back), s.value));
  }
}

TEST(ConfigSchema, OptionsMissingFromOldCheckpointsKeepTheirDefaults) {
  // A checkpoint written before an option existed lacks its key: reading it gives the default.
  Sample s;
  make_sample(*find_config_option("adapter.seed"), s);
  Metadata old;
  for (const auto& kv : config_to_metadata(s.holder))
    if (kv.first != std::string(kCheckpointKeyPrefix) + "adapter.seed") old.push_back(kv);
  EXPECT_EQ(config_from_metadata(old, "old").adapter.seed, TrainingConfig{}.adapter.seed);
}

}  // namespace
}  // namespace onnxtrain
