#include "training/checksums.h"

#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <span>
#include <sstream>

#include "graph/error.h"

namespace onnxtrain {

namespace {

uint32_t crc(uint32_t c, const void* data, size_t n) {
  // zlib's crc32 takes a uInt length; feed large tensors in pieces.
  const auto* p = static_cast<const Bytef*>(data);
  while (n > 0) {
    const uInt k = static_cast<uInt>(std::min<size_t>(n, 1u << 30));
    c = static_cast<uint32_t>(crc32(c, p, k));
    p += k;
    n -= k;
  }
  return c;
}

// The bytes a checksum covers: the tensor's own, or for a hollow one those `bytes` finds under its name. The
// checksum is the same either way, so a file saved from a session's store verifies like any other.
std::span<const std::byte> data_of(const std::string& name, const TensorData& t, const TensorBytes& bytes) {
  if (!is_hollow(t)) return t.bytes;
  if (!bytes) fail("tensor '" + name + "'", "holds no bytes and none were given to checksum it");
  const std::span<const std::byte> b = bytes(name);
  if (b.size() != static_cast<size_t>(t.numel()) * dtype_size(t.dtype))
    fail("tensor '" + name + "'", "the bytes found for it (" + std::to_string(b.size()) + ") do not match its shape");
  return b;
}

uint32_t tensor_crc(const std::string& name, const TensorData& t, const TensorBytes& bytes) {
  uint32_t c = static_cast<uint32_t>(crc32(0L, Z_NULL, 0));
  const auto dtype = static_cast<int64_t>(t.dtype);
  c = crc(c, &dtype, sizeof dtype);
  for (int64_t d : t.dims) c = crc(c, &d, sizeof d);
  const std::span<const std::byte> b = data_of(name, t, bytes);
  return crc(c, b.data(), b.size());
}

// "<where>/<name>" -> checksum, for every tensor the checkpoint holds and for its metadata (key excepted).
std::map<std::string, uint32_t> checksums_of(const Model& m, const std::string& key, const TensorBytes& bytes) {
  std::map<std::string, uint32_t> out;
  auto add = [&](const std::string& where, const Graph& g) {
    for (const auto& [name, t] : g.initializers) out[where + name] = tensor_crc(name, t, bytes);
  };
  add("initializer/", m.graph);
  for (size_t i = 0; i < m.training_info.size(); ++i) {
    const std::string ti = "training_info[" + std::to_string(i) + "]";
    add(ti + ".algorithm/", m.training_info[i].algorithm);
    add(ti + ".initialization/", m.training_info[i].initialization);
  }
  uint32_t c = static_cast<uint32_t>(crc32(0L, Z_NULL, 0));
  for (const auto& [k, v] : m.metadata) {
    if (k == key) continue;
    const uint64_t sizes[2] = {k.size(), v.size()};  // so that ("ab", "c") and ("a", "bc") differ
    c = crc(crc(crc(c, sizes, sizeof sizes), k.data(), k.size()), v.data(), v.size());
  }
  out["metadata"] = c;
  return out;
}

std::string hex(uint32_t v) {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}

std::string describe(const std::string& entry) {
  if (entry == "metadata") return "the metadata (metadata_props)";
  const size_t slash = entry.find('/');
  const std::string where = entry.substr(0, slash), name = entry.substr(slash + 1);
  if (where == "initializer") return "tensor '" + name + "' (a weight or constant of the model)";
  return "tensor '" + name + "' (" + where + ", optimizer state or training constant)";
}

}  // namespace

std::string checksums_text(const Model& m, const std::string& key, const TensorBytes& bytes) {
  std::string value;
  for (const auto& [entry, c] : checksums_of(m, key, bytes)) value += hex(c) + " " + entry + "\n";
  return value;
}

void verify_checksums(const Model& m, const std::string& key, const std::string& source) {
  const std::string* stored_text = nullptr;
  for (const auto& [k, v] : m.metadata)
    if (k == key) stored_text = &v;
  if (!stored_text) return;
  std::map<std::string, std::string> stored;
  std::istringstream in(*stored_text);
  for (std::string line; std::getline(in, line);) {
    const size_t space = line.find(' ');
    if (space != 8) fail(source, "metadata '" + key + "' is malformed (line '" + line + "'): the file is corrupt");
    stored[line.substr(space + 1)] = line.substr(0, space);
  }
  const std::map<std::string, uint32_t> now = checksums_of(m, key, {});
  for (const auto& [entry, c] : now) {
    auto it = stored.find(entry);
    if (it == stored.end())
      fail(source, describe(entry) + " has no checksum in '" + key + "': the file was changed after it was saved");
    if (it->second != hex(c))
      fail(source, describe(entry) + " does not match its checksum (saved " + it->second + ", now " + hex(c) +
                       "): the file is corrupt; load an earlier checkpoint");
  }
  for (const auto& [entry, c] : stored)
    if (!now.count(entry)) fail(source, describe(entry) + " has a checksum but is missing: the file is corrupt");
}

}  // namespace onnxtrain
