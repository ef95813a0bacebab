#pragma once
// The checkpoint's metadata format (docs/checkpoint.md, "Metadata"): every value we store is text under an
// "onnxtrain." key. Writer and Reader are its two directions, driven by the same visitors (the configuration's
// fields through training/config_schema.h, the session's counters, the schedule's state), so the written and
// the read form cannot drift apart. Internal to training/: checkpoint.cpp and checkpoint_format.cpp use it.
#include <charconv>
#include <climits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "graph/error.h"
#include "training/checkpoint.h"

namespace onnxtrain::checkpoint_format {

// Shortest text that reads back to the same double (std::to_chars round-trips exactly).
std::string num(double x);

struct Writer {
  Metadata out;
  void put(const std::string& k, std::string v) { out.emplace_back(kCheckpointKeyPrefix + k, std::move(v)); }
  void operator()(const std::string& k, std::string& x) { put(k, x); }
  void operator()(const std::string& k, double& x) { put(k, num(x)); }
  void operator()(const std::string& k, int64_t& x) { put(k, std::to_string(x)); }
  void operator()(const std::string& k, int& x) { put(k, std::to_string(x)); }
  void operator()(const std::string& k, size_t& x) { put(k, std::to_string(x)); }
  void operator()(const std::string& k, bool& x) { put(k, x ? "true" : "false"); }
  // Unset optionals are written as "" so the reader restores "unset", not the default.
  void operator()(const std::string& k, std::optional<double>& x) { put(k, x ? num(*x) : ""); }
  void operator()(const std::string& k, std::optional<int64_t>& x) { put(k, x ? std::to_string(*x) : ""); }
  void operator()(const std::string& k, std::vector<double>& x) {
    std::string s;
    for (size_t i = 0; i < x.size(); ++i) s += (i ? "," : "") + num(x[i]);
    put(k, s);
  }
  // Names (weights, glob patterns) may hold commas; a newline cannot appear in an ONNX value name we accept.
  void operator()(const std::string& k, std::vector<std::string>& x) {
    std::string s;
    for (size_t i = 0; i < x.size(); ++i) s += (i ? "\n" : "") + x[i];
    put(k, s);
  }
  [[noreturn]] void bad(const std::string& k, const std::string& why) { fail("checkpoint key '" + k + "'", why); }
};

struct Reader {
  const std::map<std::string, std::string>& in;
  std::string source;
  [[noreturn]] void bad(const std::string& k, const std::string& why) {
    fail(source, "metadata key '" + std::string(kCheckpointKeyPrefix) + k + "': " + why);
  }
  const std::string* get(const std::string& k) {
    auto it = in.find(kCheckpointKeyPrefix + k);
    return it == in.end() ? nullptr : &it->second;
  }
  double to_double(const std::string& k, const std::string& s) {
    double x = 0;
    auto r = std::from_chars(s.data(), s.data() + s.size(), x);
    if (r.ec != std::errc() || r.ptr != s.data() + s.size()) bad(k, "expected a number, got '" + s + "'");
    return x;
  }
  int64_t to_int(const std::string& k, const std::string& s) {
    int64_t x = 0;
    auto r = std::from_chars(s.data(), s.data() + s.size(), x);
    if (r.ec != std::errc() || r.ptr != s.data() + s.size()) bad(k, "expected an integer, got '" + s + "'");
    return x;
  }
  void operator()(const std::string& k, std::string& x) {
    if (auto* s = get(k)) x = *s;
  }
  void operator()(const std::string& k, double& x) {
    if (auto* s = get(k)) x = to_double(k, *s);
  }
  void operator()(const std::string& k, int64_t& x) {
    if (auto* s = get(k)) x = to_int(k, *s);
  }
  void operator()(const std::string& k, int& x) {
    if (auto* s = get(k)) {
      int64_t v = to_int(k, *s);
      if (v < INT32_MIN || v > INT32_MAX) bad(k, "value " + *s + " is out of range");
      x = static_cast<int>(v);
    }
  }
  void operator()(const std::string& k, size_t& x) {
    if (auto* s = get(k)) {
      int64_t v = to_int(k, *s);
      if (v < 0) bad(k, "value " + *s + " is out of range");
      x = static_cast<size_t>(v);
    }
  }
  void operator()(const std::string& k, bool& x) {
    if (auto* s = get(k)) {
      if (*s != "true" && *s != "false") bad(k, "expected true or false, got '" + *s + "'");
      x = *s == "true";
    }
  }
  void operator()(const std::string& k, std::optional<double>& x) {
    if (auto* s = get(k)) x = s->empty() ? std::nullopt : std::optional<double>(to_double(k, *s));
  }
  void operator()(const std::string& k, std::optional<int64_t>& x) {
    if (auto* s = get(k)) x = s->empty() ? std::nullopt : std::optional<int64_t>(to_int(k, *s));
  }
  template <class T, class F> void split(const std::string& k, std::vector<T>& x, char sep, F conv) {
    const std::string* s = get(k);
    if (!s) return;
    x.clear();
    if (s->empty()) return;
    size_t start = 0;
    while (true) {
      size_t end = s->find(sep, start);
      x.push_back(conv(s->substr(start, end == std::string::npos ? std::string::npos : end - start)));
      if (end == std::string::npos) break;
      start = end + 1;
    }
  }
  void operator()(const std::string& k, std::vector<double>& x) {
    split(k, x, ',', [&](const std::string& p) { return to_double(k, p); });
  }
  void operator()(const std::string& k, std::vector<std::string>& x) {
    split(k, x, '\n', [](const std::string& p) { return p; });
  }
};

// Our keys start with kCheckpointKeyPrefix; the rest of a model's metadata belongs to its author.
bool is_ours(const std::string& key);

// A model's metadata as a map; every reader of our keys goes through this, so a key given twice is an
// error everywhere rather than a silent pick of one of them.
std::map<std::string, std::string> metadata_map(const Metadata& metadata, const std::string& source);

// The configuration stored under the reader's keys; absent keys keep their defaults.
TrainingConfig read_config(Reader& r);

}  // namespace onnxtrain::checkpoint_format
