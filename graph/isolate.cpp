#include "graph/isolate.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "graph/error.h"

// Defined only when a sanitizer runtime is linked (scripts/sanitize.sh, fuzz/); libFuzzer sets a death callback
// that would write the child's crash as a reproducer of the parent's input.
extern "C" void __sanitizer_set_death_callback(void (*callback)(void)) __attribute__((weak));

namespace onnxtrain {

namespace {

constexpr char kReturned = 'R';
constexpr char kThrew = 'X';
constexpr size_t kHeader = 1 + sizeof(uint64_t);

void write_all(int fd, const char* data, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, data, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      ::_exit(121);  // the parent is gone or closed the pipe; nobody is left to report to
    }
    data += w;
    n -= static_cast<size_t>(w);
  }
}

[[noreturn]] void child_main(int fd, pid_t parent, const std::function<std::string()>& work) {
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGTRAP, SIGSYS, SIGPIPE, SIGTERM}) ::signal(sig, SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  if (__sanitizer_set_death_callback) __sanitizer_set_death_callback(nullptr);
  // Dies with the thread that forked it, so a parent killed while waiting leaves no orphan computing on.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(122);  // it died before the line above took effect
  char tag = kReturned;
  std::string payload;
  try {
    payload = work();
  } catch (const std::exception& e) {
    tag = kThrew;
    payload = e.what();
  } catch (...) {
    tag = kThrew;
    payload = "an exception that is not a std::exception";
  }
  char header[kHeader];
  header[0] = tag;
  const uint64_t n = payload.size();
  std::memcpy(header + 1, &n, sizeof n);
  write_all(fd, header, kHeader);
  write_all(fd, payload.data(), payload.size());
  ::_exit(0);
}

std::string errno_text(const std::string& call) { return call + " failed: " + std::strerror(errno); }

// Reaps the child; false when it was reaped elsewhere (SIGCHLD ignored, or another waitpid(-1) in the process).
bool reap(pid_t pid, int& status) {
  for (;;) {
    if (::waitpid(pid, &status, 0) == pid) return true;
    if (errno != EINTR) return false;
  }
}

bool complete(const std::string& buf) {
  if (buf.size() < kHeader) return false;
  uint64_t n = 0;
  std::memcpy(&n, buf.data() + 1, sizeof n);
  return buf.size() - kHeader >= n;
}

}  // namespace

std::string signal_name(int sig) {
  switch (sig) {
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGILL: return "SIGILL";
    case SIGABRT: return "SIGABRT";
    case SIGTRAP: return "SIGTRAP";
    case SIGSYS: return "SIGSYS";
    case SIGKILL: return "SIGKILL";
    case SIGTERM: return "SIGTERM";
    case SIGPIPE: return "SIGPIPE";
    case SIGXCPU: return "SIGXCPU";
    case SIGXFSZ: return "SIGXFSZ";
    default: return "signal " + std::to_string(sig);
  }
}

ChildResult run_in_child(const std::function<std::string()>& work, double timeout_seconds, const std::string& what) {
  const pid_t parent = ::getpid();
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) fail(what, "cannot start its child process: " + errno_text("pipe"));
  const pid_t pid = ::fork();
  if (pid < 0) {
    const std::string why = errno_text("fork");
    ::close(fds[0]);
    ::close(fds[1]);
    fail(what, "cannot start its child process: " + why + " (ONNXTRAIN_ISOLATE_ONNX=0 runs it in this process)");
  }
  if (pid == 0) {
    ::close(fds[0]);
    child_main(fds[1], parent, work);
  }
  ::close(fds[1]);

  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(std::min(timeout_seconds, 1e9)));
  std::string buf;
  bool timed_out = false;
  std::string io_error;    // the pipe failed: the child is killed, since nothing it sends can arrive
  bool collected = false;  // the child was reaped inside the loop
  int status = 0;
  char chunk[1 << 16];
  while (!complete(buf)) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    // Wake up now and then: if another process forked meanwhile and inherited the pipe's write end, the
    // pipe never reports end-of-file, so the child's exit is noticed by waitpid instead.
    pollfd p{fds[0], POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::min<long long>(left, 200)));
    if (r < 0) {
      if (errno == EINTR) continue;
      io_error = errno_text("poll");
      break;
    }
    if (r == 0) {
      const pid_t w = ::waitpid(pid, &status, WNOHANG);
      if (w == pid || (w < 0 && errno == ECHILD)) {
        collected = true;
        if (w < 0) status = -1;
        // Whatever it wrote before exiting is still in the pipe.
        while (::poll(&p, 1, 0) == 1 && (p.revents & POLLIN)) {
          const ssize_t n = ::read(fds[0], chunk, sizeof chunk);
          if (n <= 0) break;
          buf.append(chunk, static_cast<size_t>(n));
        }
        break;
      }
      continue;
    }
    const ssize_t n = ::read(fds[0], chunk, sizeof chunk);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      io_error = errno_text("read");
      break;
    }
    if (n == 0) break;  // end of file: the child exited (or closed the pipe) without finishing its message
    buf.append(chunk, static_cast<size_t>(n));
  }
  if (!collected) {
    if (timed_out || !io_error.empty()) ::kill(pid, SIGKILL);
    if (!reap(pid, status)) status = -1;
  }
  ::close(fds[0]);

  ChildResult out;
  if (timed_out) {
    out.status = ChildResult::Status::TimedOut;
    return out;
  }
  if (complete(buf)) {
    out.status = buf[0] == kThrew ? ChildResult::Status::Threw : ChildResult::Status::Returned;
    out.payload = buf.substr(kHeader);
    return out;
  }
  out.status = ChildResult::Status::Crashed;
  if (!io_error.empty()) {
    out.payload = "reading its result: " + io_error;
  } else if (status == -1) {
    out.payload = "the child ended without a result and its exit status was collected elsewhere";
  } else if (WIFSIGNALED(status)) {
    out.payload = signal_name(WTERMSIG(status));
    if (WTERMSIG(status) == SIGKILL) out.payload += ", perhaps from the out-of-memory killer";
  } else if (WIFEXITED(status) && WEXITSTATUS(status) != 0) {
    out.payload = "exit status " + std::to_string(WEXITSTATUS(status)) + " without a result";
  } else {
    out.payload = "the child exited after sending " + std::to_string(buf.size()) + " bytes of an incomplete result";
  }
  return out;
}

OnnxIsolation onnx_isolation_from_env() {
  OnnxIsolation o;
  if (const char* v = std::getenv("ONNXTRAIN_ISOLATE_ONNX"); v && *v) {
    const std::string s = v;
    if (s == "0") o.enabled = false;
    else if (s != "1")
      fail("ONNXTRAIN_ISOLATE_ONNX", "expected 1 (run ONNX's inference in a child process, the default) or 0 (in "
                                     "this process), got '" + s + "'");
  }
  if (const char* v = std::getenv("ONNXTRAIN_ONNX_TIMEOUT"); v && *v) {
    char* end = nullptr;
    const double t = std::strtod(v, &end);
    if (end == v || *end != '\0' || !(t > 0) || !std::isfinite(t))
      fail("ONNXTRAIN_ONNX_TIMEOUT", std::string("expected a positive number of seconds, got '") + v + "'");
    o.timeout_seconds = t;
  }
  return o;
}

}  // namespace onnxtrain
