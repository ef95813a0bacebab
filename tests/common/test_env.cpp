#include "common/test_env.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>

#include "graph/error.h"

namespace onnxtrain::test {

namespace {
// $name when set and not empty, else the compiled-in fallback: a build copied to another machine (scripts/gpu_check.sh)
// finds its checkout and Python there.
std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}
}  // namespace

std::string python() { return env_or("ONNXTRAIN_PYTHON", ONNXTRAIN_PYTHON); }

std::filesystem::path source_dir() { return env_or("ONNXTRAIN_SOURCE_DIR", ONNXTRAIN_SOURCE_DIR); }

std::filesystem::path onnx_node_test_dir() {
  static const std::filesystem::path dir = [] {
    std::string cmd = python() +
                      " -c \"import onnx, os; print(os.path.join(os.path.dirname(onnx.__file__), "
                      "'backend', 'test', 'data', 'node'))\" 2>/dev/null";
    std::unique_ptr<FILE, int (*)(FILE*)> p(popen(cmd.c_str(), "r"), pclose);
    if (!p) return std::filesystem::path();
    char buf[4096];
    std::string out;
    while (fgets(buf, sizeof buf, p.get())) out += buf;
    while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
    return std::filesystem::path(out);
  }();
  return dir;
}

std::filesystem::path temp_dir(const std::string& name) {
  // The pid keeps concurrent runs of the same test (several worktrees, ctest -j) out of each other's files.
  auto d = std::filesystem::temp_directory_path() / ("onnxtrain_test_" + std::to_string(::getpid()) + "_" + name);
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

std::filesystem::path make_mlp(const std::filesystem::path& dir, const std::string& sizes) {
  auto path = dir / "mlp.onnx";
  std::string cmd = python() + " " + (source_dir() / "examples/make_mlp.py").string() + " " +
                    path.string() + " --sizes " + sizes + " > /dev/null";
  if (std::system(cmd.c_str()) != 0) throw std::runtime_error("failed: " + cmd);
  return path;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace onnxtrain::test
