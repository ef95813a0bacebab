#include "training/external_data.h"

#include <charconv>
#include <cstdlib>
#include <climits>
#include <map>
#include <random>
#include <span>
#include <vector>

#include "graph/error.h"
#include "graph/proto.h"
#include "training/checkpoint.h"
#include "training/checksums.h"

namespace onnxtrain {

namespace fs = std::filesystem;

namespace {

size_t nbytes(const TensorData& t) { return static_cast<size_t>(t.numel()) * dtype_size(t.dtype); }

// The bytes of initializer `name`: its own, or for a hollow one what `bytes` finds under its name.
std::span<const std::byte> data_of(const std::string& name, const TensorData& t, const TensorBytes& bytes,
                                   const fs::path& path) {
  if (!is_hollow(t)) return t.bytes;
  if (!bytes) fail(path.string(), "tensor '" + name + "' holds no bytes and no source for them was given");
  const std::span<const std::byte> b = bytes(name);
  if (b.size() != nbytes(t))
    fail(path.string(), "tensor '" + name + "': the bytes found for it (" + std::to_string(b.size()) +
                            ") do not match its shape (" + std::to_string(nbytes(t)) + ")");
  return b;
}

// A tensor written apart from the protobuf: its proto is a placeholder until the bytes are placed.
struct Moved {
  const std::string* name;
  const TensorData* tensor;
};

// A copy of g without the bytes of its large (or hollow) initializers: each becomes an empty placeholder of the
// same dtype, and is listed in `moved`. Every other field is copied as it is.
Graph shell_of(const Graph& g, size_t min_bytes, std::vector<Moved>& moved) {
  Graph out;
  out.name = g.name;
  out.nodes = g.nodes;
  out.inputs = g.inputs;
  out.outputs = g.outputs;
  out.value_info = g.value_info;
  for (const auto& [name, t] : g.initializers) {
    if (is_hollow(t) || (nbytes(t) >= min_bytes && nbytes(t) > 0)) {
      out.initializers.emplace(name, TensorData{t.dtype, {0}, {}});
      moved.push_back({&name, &t});
    } else {
      out.initializers.emplace(name, t);
    }
  }
  return out;
}

// Points each moved tensor's proto at its place in the data file (ONNX external data). Offsets are handed out
// in `moved`'s order, the order the data file is written in, 64-byte aligned (mmap-friendly).
void place_external(onnx::GraphProto* g, const std::vector<Moved>& moved, const std::string& location,
                    size_t& offset) {
  std::map<std::string, std::pair<const TensorData*, size_t>> by_name;
  for (const Moved& mv : moved) {
    by_name[*mv.name] = {mv.tensor, offset};
    offset = (offset + nbytes(*mv.tensor) + 63) / 64 * 64;
  }
  for (auto& t : *g->mutable_initializer()) {
    auto it = by_name.find(t.name());
    if (it == by_name.end()) continue;
    const auto [d, at] = it->second;
    t.clear_dims();
    for (int64_t x : d->dims) t.add_dims(x);
    t.clear_raw_data();
    t.set_data_location(onnx::TensorProto::EXTERNAL);
    auto add = [&](const char* k, const std::string& v) {
      auto* e = t.add_external_data();
      e->set_key(k);
      e->set_value(v);
    };
    add("location", location);
    add("offset", std::to_string(at));
    add("length", std::to_string(nbytes(*d)));
  }
}

// Small models: the moved tensors go back inline, from wherever their bytes are.
void place_inline(onnx::GraphProto* g, const std::vector<Moved>& moved, const TensorBytes& bytes,
                  const fs::path& path) {
  std::map<std::string, const TensorData*> by_name;
  for (const Moved& mv : moved) by_name[*mv.name] = mv.tensor;
  for (auto& t : *g->mutable_initializer()) {
    auto it = by_name.find(t.name());
    if (it == by_name.end()) continue;
    const TensorData& d = *it->second;
    t.clear_dims();
    for (int64_t x : d.dims) t.add_dims(x);
    const std::span<const std::byte> b = data_of(t.name(), d, bytes, path);
    t.set_raw_data(reinterpret_cast<const char*>(b.data()), b.size());
  }
}

// Once the new model is in place, data files of earlier saves ("<name>.<nonce>.data") are unreferenced.
void remove_stale_data_files(const fs::path& path, const std::string& keep) {
  fs::path dir = path.parent_path();
  if (dir.empty()) dir = ".";
  const std::string prefix = path.filename().string() + ".";
  std::error_code ec;
  std::vector<fs::path> stale;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n != keep && n.rfind(prefix, 0) == 0 && n.ends_with(".data")) stale.push_back(e.path());
  }
  for (const auto& p : stale) fs::remove(p, ec);
}

}  // namespace

size_t external_data_threshold() {
  const size_t dflt = (size_t(1) << 31) - (size_t(256) << 20);
  const char* env = std::getenv("ONNXTRAIN_EXTERNAL_DATA_BYTES");
  if (!env || !*env) return dflt;
  size_t v = 0;
  const char* end = env + std::char_traits<char>::length(env);
  auto r = std::from_chars(env, end, v);
  if (r.ec != std::errc() || r.ptr != end)
    fail("ONNXTRAIN_EXTERNAL_DATA_BYTES", "expected a number of bytes, got '" + std::string(env) + "'");
  return std::min(v, dflt);  // above the default protobuf would fail
}

void save_model_large(const Model& m, const fs::path& path, const SaveOptions& opts, const TensorBytes& bytes) {
  // The model without its large tensors' bytes; those are placed after, inline or in the data file.
  std::vector<Moved> main_moved;
  std::vector<std::vector<Moved>> alg_moved(m.training_info.size()), init_moved(m.training_info.size());
  Model shell;
  shell.ir_version = m.ir_version;
  shell.opset_imports = m.opset_imports;
  shell.producer_name = m.producer_name;
  shell.producer_version = m.producer_version;
  shell.domain = m.domain;
  shell.model_version = m.model_version;
  shell.doc = m.doc;
  shell.metadata = m.metadata;
  shell.functions = m.functions;
  const size_t min_bytes = std::max<size_t>(opts.external_min_bytes, 1);
  shell.graph = shell_of(m.graph, min_bytes, main_moved);
  size_t total = 0;
  for (const auto& [name, t] : m.graph.initializers) total += nbytes(t);
  for (size_t i = 0; i < m.training_info.size(); ++i) {
    const TrainingInfo& ti = m.training_info[i];
    TrainingInfo s;
    s.initialization = shell_of(ti.initialization, min_bytes, init_moved[i]);
    s.initialization_binding = ti.initialization_binding;
    s.algorithm = shell_of(ti.algorithm, min_bytes, alg_moved[i]);
    s.update_binding = ti.update_binding;
    shell.training_info.push_back(std::move(s));
    for (const Graph* g : {&ti.algorithm, &ti.initialization})
      for (const auto& [name, t] : g->initializers) total += nbytes(t);
  }
  onnx::ModelProto p = to_proto(shell);
  shell = Model{};
  // A checkpoint (a model with a training step) carries the checksums of its tensors and metadata, which
  // from_checkpoint verifies; an earlier entry (a loaded checkpoint saved again) is replaced.
  if (!m.training_info.empty()) {
    const std::string key = std::string(kCheckpointKeyPrefix) + "checksums";
    auto* props = p.mutable_metadata_props();
    for (int i = props->size() - 1; i >= 0; --i)
      if (props->Get(i).key() == key) props->DeleteSubrange(i, 1);
    auto* e = p.add_metadata_props();
    e->set_key(key);
    e->set_value(checksums_text(m, key, bytes));
  }
  if (!opts.force_external_data && total < external_data_threshold()) {
    place_inline(p.mutable_graph(), main_moved, bytes, path);
    for (int i = 0; i < p.training_info_size(); ++i) {
      place_inline(p.mutable_training_info(i)->mutable_algorithm(), alg_moved[i], bytes, path);
      place_inline(p.mutable_training_info(i)->mutable_initialization(), init_moved[i], bytes, path);
    }
    if (p.ByteSizeLong() > static_cast<size_t>(INT_MAX))
      fail(path.string(), "is larger than 2 GB; protobuf cannot serialize it (store the weights as external data)");
    std::string out;
    if (!p.SerializeToString(&out)) fail(path.string(), "serializing the model to protobuf failed");
    write_file_atomically(out, path);
    remove_stale_data_files(path, "");
    return;
  }
  std::random_device rd;
  const std::string location = path.filename().string() + "." + std::to_string(rd()) + std::to_string(rd()) + ".data";
  // Written in this order; place_external hands out the offsets in the same order.
  std::vector<const std::vector<Moved>*> order{&main_moved};
  size_t offset = 0;
  place_external(p.mutable_graph(), main_moved, location, offset);
  for (int i = 0; i < p.training_info_size(); ++i) {
    place_external(p.mutable_training_info(i)->mutable_algorithm(), alg_moved[i], location, offset);
    place_external(p.mutable_training_info(i)->mutable_initialization(), init_moved[i], location, offset);
    order.push_back(&alg_moved[i]);
    order.push_back(&init_moved[i]);
  }
  if (p.ByteSizeLong() > static_cast<size_t>(INT_MAX))
    fail(path.string(), "is larger than 2 GB even with its tensors stored as external data");
  fs::path dir = path.parent_path();
  if (dir.empty()) dir = ".";
  const size_t data_size = offset;
  write_file_atomically(data_size, [&](const WriteBytes& write) {
    static const char zeros[64] = {};
    size_t at = 0;
    for (const std::vector<Moved>* list : order)
      for (const Moved& mv : *list) {
        const std::span<const std::byte> b = data_of(*mv.name, *mv.tensor, bytes, path);
        write(b.data(), b.size());
        at += b.size();
        const size_t padded = (at + 63) / 64 * 64;
        write(zeros, padded - at);
        at = padded;
      }
  }, dir / location);
  std::string out;
  if (!p.SerializeToString(&out)) fail(path.string(), "serializing the model to protobuf failed");
  write_file_atomically(out, path);
  remove_stale_data_files(path, location);
}

}  // namespace onnxtrain
