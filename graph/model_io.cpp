#include "graph/model_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <climits>
#include <cstring>
#include <fstream>
#include <random>

#include "graph/error.h"
#include "graph/proto.h"
#include "graph/shape_inference.h"
#include "graph/validate.h"

namespace onnxtrain {

namespace {

namespace fs = std::filesystem;

// Validation looks at names, types and structure, never at a weight's values, but the ONNX checker reads a
// ModelProto: converting the model whole would copy every weight once more (a second 2.5 GB for a 2.5 GB
// model). The large initializers' bytes are set aside while it runs, each replaced by an empty tensor of the
// same dtype, and put back afterwards.
void validate_light(Model& m, const std::string& source) {
  constexpr size_t kSetAsideBytes = 4096;
  std::vector<std::pair<TensorData*, TensorData>> aside;
  auto set_aside = [&](Graph& g) {
    for (auto& [name, t] : g.initializers) {
      if (t.bytes.size() < kSetAsideBytes) continue;
      aside.emplace_back(&t, TensorData{t.dtype, {0}, {}});
      std::swap(t, aside.back().second);
    }
  };
  auto restore = [&] {
    for (auto& [slot, t] : aside) std::swap(*slot, t);
  };
  set_aside(m.graph);
  for (TrainingInfo& ti : m.training_info) {
    set_aside(ti.algorithm);
    set_aside(ti.initialization);
  }
  try {
    validate_model(m, source);
  } catch (...) {
    restore();
    throw;
  }
  restore();
}

Model load_impl(std::string_view bytes, const std::string& source, const std::string& base_dir,
                const LoadOptions& opts) {
  onnx::ModelProto p;
  if (bytes.size() > static_cast<size_t>(INT_MAX))
    fail(source, "is larger than 2 GB; protobuf cannot hold it (store the weights as external data)");
  if (!p.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
    fail(source, "not a valid ONNX model (the protobuf could not be parsed; is the file truncated?)");
  // Almost any short byte string parses as some protobuf; a model needs at least these two fields.
  if (p.ir_version() <= 0 || !p.has_graph())
    fail(source, std::string("not a valid ONNX model (") + (p.ir_version() <= 0 ? "no ir_version" : "no graph") + ")");
  Model m;
  try {
    m = from_proto(p, base_dir);
  } catch (const Error& e) {
    fail(source, e.what());
  }
  if (opts.validate) validate_light(m, source);
  if (opts.infer_shapes) {
    try {
      infer_shapes(m);
    } catch (const Error& e) {
      fail(source, e.what());
    }
  }
  return m;
}

std::string errno_text() { return std::strerror(errno); }

}  // namespace

Model load_model(const fs::path& path, const LoadOptions& opts) {
  const std::string source = path.string();
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(source, "cannot open: " + errno_text());
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) fail(source, "reading failed: " + errno_text());
  fs::path dir = path.parent_path();
  if (dir.empty()) dir = ".";
  return load_impl(bytes, source, dir.string(), opts);
}

Model load_model_from_bytes(std::string_view bytes, const std::string& source, const LoadOptions& opts) {
  return load_impl(bytes, source, {}, opts);
}

std::string serialize_model(const Model& m) {
  const onnx::ModelProto p = to_proto(m);
  if (p.ByteSizeLong() > static_cast<size_t>(INT_MAX))
    throw Error("model is larger than 2 GB; protobuf cannot serialize it (store the weights as external data)");
  std::string out;
  if (!p.SerializeToString(&out)) throw Error("serializing the model to protobuf failed");
  return out;
}

bool is_hollow(const TensorData& t) { return t.bytes.empty() && t.numel() > 0; }

void save_model(const Model& m, const fs::path& path) { write_file_atomically(serialize_model(m), path); }

namespace {

// Test-only hook, like ONNXTRAIN_TEST_SHAPE_INFERENCE_FAULT: ONNXTRAIN_TEST_KILL_SAVE="<phase>[:<suffix>]" makes
// the process SIGKILL itself during an atomic write of a path ending in <suffix> (any path without one), at
// <phase>: "write" (half the bytes written), "rename" (the temp file complete and synced, not yet renamed) or
// "renamed" (just after the rename). The crash-safety tests kill at exactly those points instead of at random
// times. Read at each call: a forked child sets it after the parent has saved.
void kill_point(const fs::path& path, const char* phase) {
  const char* spec = std::getenv("ONNXTRAIN_TEST_KILL_SAVE");
  if (!spec || !*spec) return;
  const std::string s(spec);
  const size_t colon = s.find(':');
  const std::string suffix = colon == std::string::npos ? "" : s.substr(colon + 1);
  if (s.substr(0, colon) == phase && path.string().ends_with(suffix)) ::raise(SIGKILL);
}

// Temp files of earlier saves of `path` (".<name>.tmp.*" and, for external data, ".<name>.<nonce>.data.tmp.*")
// that a killed save left behind: once a newer save of `path` is complete, they can never be completed, so
// they go (same-tick ones too: some filesystems keep coarse times). A temp file newer than the saved file (a
// concurrent save still writing) stays.
void remove_stale_temp_files(const fs::path& dir, const fs::path& path) {
  std::error_code ec;
  const auto saved = fs::last_write_time(path, ec);
  if (ec) return;
  const std::string prefix = "." + path.filename().string() + ".";
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) != 0 || name.find(".tmp.", prefix.size() - 1) == std::string::npos) continue;
    std::error_code e2;
    if (fs::last_write_time(e.path(), e2) <= saved && !e2) fs::remove(e.path(), e2);
  }
}

}  // namespace

void write_file_atomically(const std::string& bytes, const fs::path& path) {
  write_file_atomically(bytes.size(), [&](const WriteBytes& write) { write(bytes.data(), bytes.size()); }, path);
}

void write_file_atomically(size_t total, const std::function<void(const WriteBytes& write)>& produce,
                           const fs::path& path) {
  const std::string target = path.string();
  fs::path dir = path.parent_path();
  if (dir.empty()) dir = ".";
  // Same folder as the target so rename() stays on one filesystem and is atomic.
  std::random_device rd;
  std::string tmp_name(".");  // appended piecewise: GCC 12 warns falsely (-Wrestrict) on "." + string
  tmp_name += path.filename().string();
  tmp_name += ".tmp." + std::to_string(getpid()) + "." + std::to_string(rd());
  const fs::path tmp = dir / tmp_name;
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) fail(target, "cannot create temporary file '" + tmp.string() + "': " + errno_text());
  auto abandon = [&](const std::string& what) {
    const std::string err = errno_text();
    ::close(fd);
    ::unlink(tmp.c_str());
    fail(target, what + ": " + err);
  };
  // The "write" kill point falls once half of `total` is written, wherever the pieces end.
  const size_t half = total / 2;
  size_t done = 0;
  auto write_all = [&](const char* p, size_t n) {
    while (n > 0) {
      size_t chunk = n;
      if (done < half) chunk = std::min(chunk, half - done);
      ssize_t w = ::write(fd, p, std::min<size_t>(chunk, size_t(1) << 30));
      if (w < 0) {
        if (errno == EINTR) continue;
        fail(target, "writing failed: " + errno_text());  // the temp file goes below
      }
      const size_t before = done;
      done += static_cast<size_t>(w);
      p += w;
      n -= static_cast<size_t>(w);
      if (before < half && done >= half) kill_point(path, "write");
    }
  };
  try {
    produce([&](const void* data, size_t n) { write_all(static_cast<const char*>(data), n); });
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (done != total) {
    ::close(fd);
    ::unlink(tmp.c_str());
    fail(target, "wrote " + std::to_string(done) + " bytes, expected " + std::to_string(total));
  }
  if (::fsync(fd) != 0) abandon("fsync failed");
  if (::close(fd) != 0) {
    const std::string err = errno_text();
    ::unlink(tmp.c_str());
    fail(target, "closing the temporary file failed: " + err);
  }
  kill_point(path, "rename");
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string err = errno_text();
    ::unlink(tmp.c_str());
    fail(target, "renaming the temporary file into place failed: " + err);
  }
  kill_point(path, "renamed");
  // The rename is durable only once the folder's entry is on disk too.
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  remove_stale_temp_files(dir, path);
}

}  // namespace onnxtrain
