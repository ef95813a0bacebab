#pragma once
// Launching programs under mpirun from the tests in test_distributed (ONNXTRAIN_MPIEXEC, DIST_WORKER are
// compile definitions of that target). Every launch runs under `timeout --verbose -s KILL`, so a hang fails the
// test instead of blocking the suite, and Launch::hung() tells that kill from a rank's own exit (both are 137).
#include <sys/wait.h>

#include <cstdio>
#include <string>

#include "compare.h"

namespace onnxtrain::test {

struct Launch {
  int status = -1;  // exit status of mpirun (or of timeout: 137 when it had to kill it)
  std::string output;
  // The launch's time limit ended it (timeout --verbose says so on stderr): an event, not a stopwatch reading.
  bool hung() const { return output.find("timeout: sending signal KILL") != std::string::npos; }
};

// The output and exit status of a shell command (stderr included).
inline Launch launch(const std::string& command) {
  Launch l;
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (!p) return l;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) l.output.append(buf, n);
  const int st = pclose(p);
  l.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return l;
}

// OpenMPI refuses root without these, and needs --oversubscribe for more ranks than the 2 cores.
inline Launch mpirun(int np, const std::string& args, const std::string& options = "", const std::string& program = DIST_WORKER) {
  return launch(std::string("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout --verbose -s KILL 240 ") +
                ONNXTRAIN_MPIEXEC + " -np " + std::to_string(np) + " --oversubscribe -x OMP_NUM_THREADS=1 " + options + " " +
                program + " " + args);
}

}  // namespace onnxtrain::test
