#include "training/checkpoint_format.h"

#include <variant>

#include "training/config_schema.h"

namespace onnxtrain {

namespace checkpoint_format {

namespace {

// One table (training/config_schema.h) drives both directions, so the writer and the reader cannot drift
// apart. The visitor sees (metadata key, field&) for every option the schema stores in checkpoints.
template <class V, class T> void visit_field(V& v, const std::string& key, T& field) { v(key, field); }

// optimizer.groups: the group count, then each group's fields under "optimizer.group.<i>.".
template <class V> void visit_field(V& v, const std::string& key, std::vector<ParamGroup>& groups) {
  int64_t ngroups = static_cast<int64_t>(groups.size());
  v(key, ngroups);
  if (ngroups < 0 || ngroups > 100000) v.bad(key, "expected a group count in [0, 100000]");
  groups.resize(static_cast<size_t>(ngroups));
  for (size_t i = 0; i < groups.size(); ++i) {
    const std::string k = "optimizer.group." + std::to_string(i) + ".";
    v(k + "match", groups[i].match);
    v(k + "learning_rate", groups[i].learning_rate);
    v(k + "weight_decay", groups[i].weight_decay);
  }
}

template <class V> void visit_config(TrainingConfig& c, V& v) {
  for (const ConfigOption& o : config_options())
    if (o.applies_to(kWayCheckpoint))
      std::visit([&](auto* field) { visit_field(v, o.checkpoint_key(), *field); }, o.field(c));
}

}  // namespace

std::string num(double x) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, x);
  return std::string(buf, r.ptr);
}

bool is_ours(const std::string& key) { return key.rfind(kCheckpointKeyPrefix, 0) == 0; }

std::map<std::string, std::string> metadata_map(const Metadata& metadata, const std::string& source) {
  std::map<std::string, std::string> in;
  for (const auto& [k, v] : metadata)
    if (!in.emplace(k, v).second) fail(source, "metadata key '" + k + "' is given twice");
  return in;
}

TrainingConfig read_config(Reader& r) {
  TrainingConfig c;
  visit_config(c, r);
  return c;
}

}  // namespace checkpoint_format

using namespace checkpoint_format;

Metadata config_to_metadata(const TrainingConfig& config) {
  TrainingConfig c = config;
  Writer w;
  visit_config(c, w);
  return std::move(w.out);
}

TrainingConfig config_from_metadata(const Metadata& metadata, const std::string& source) {
  const std::map<std::string, std::string> in = metadata_map(metadata, source);
  Reader r{in, source};
  return read_config(r);
}

}  // namespace onnxtrain
