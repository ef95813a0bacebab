#pragma once
// Runs code that may crash or hang on hostile input (ONNX's shape inference) in a forked child process, so a
// fatal signal or an endless loop there becomes an Error in the caller instead of a dead or stuck process.
#include <functional>
#include <string>

namespace onnxtrain {

// What became of work run by run_in_child.
struct ChildResult {
  enum class Status {
    Returned,  // payload: what the work returned
    Threw,     // payload: the exception's message
    Crashed,   // payload: how the child ended, e.g. "SIGSEGV" or "exit status 1 without a result"
    TimedOut,  // the child was killed after the timeout; payload empty
  };
  Status status = Status::Returned;
  std::string payload;
};

// Forks the calling thread, runs `work` in the child and sends its result back through a pipe, read while the
// child writes (no size limit). The child then calls _exit: no destructors, atexit handlers or stdio flushes,
// so nothing it copied from the parent is touched twice. Fork copies only the calling thread, so `work` must
// not need other threads or locks they might hold (OpenMP, MPI, CUDA): protobuf and ONNX code is fine.
// Fatal signals get their default action in the child (a sanitizer's or the fuzzer's handlers would report
// the child's crash as the parent's). A child still running after `timeout_seconds` is killed.
// Throws Error naming `what` only when no child can be started (fork or pipe failure).
ChildResult run_in_child(const std::function<std::string()>& work, double timeout_seconds, const std::string& what);

// "SIGSEGV", "SIGFPE", ... or "signal N".
std::string signal_name(int sig);

// How ONNX code runs on user models, from the environment (docs/reliability.md):
//   ONNXTRAIN_ISOLATE_ONNX=0     runs it in process (the escape hatch; a crash there kills the process)
//   ONNXTRAIN_ONNX_TIMEOUT=<s>   seconds before a child is killed (default 120)
// A malformed value is an Error naming the variable.
struct OnnxIsolation {
  bool enabled = true;
  double timeout_seconds = 120;
};
OnnxIsolation onnx_isolation_from_env();

}  // namespace onnxtrain
