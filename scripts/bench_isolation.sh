#!/usr/bin/env bash
# Cost of running ONNX's shape inference in a child process (docs/reliability.md, "ONNX shape inference in a
# child process"): loads each model once, then calls infer_shapes alternately isolated and in process (same
# process, so machine load hits both alike) and prints the median/min wall time and the CPU time per call
# (the parent's and the children's, from getrusage).
#
#   scripts/bench_isolation.sh [calls per mode, default 30] [model.onnx ...]   (default: the shared W1 and W3)
# Needs the release build (scripts/build.sh).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-$here/build/release}"
calls="${1:-30}"
shift || true
models=("$@")
[ ${#models[@]} -gt 0 ] || models=("$here/../shared/bench/models/w1.onnx" "$here/../shared/bench/models/w3.onnx")
onnx_prefix="$(bash "$here/scripts/setup.sh" | tail -n 1)"
work="$build/bench_isolation"
mkdir -p "$work"
cat > "$work/bench_isolation.cpp" <<'CPP'
#include <sys/resource.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include "graph/model_io.h"
#include "graph/shape_inference.h"
using namespace onnxtrain;
static double cpu(int who) { rusage r; getrusage(who, &r); return r.ru_utime.tv_sec + r.ru_stime.tv_sec + 1e-6 * (r.ru_utime.tv_usec + r.ru_stime.tv_usec); }
int main(int argc, char** argv) {
  LoadOptions lo; lo.infer_shapes = false;
  const Model base = load_model(argv[1], lo);
  const int n = argc > 2 ? std::atoi(argv[2]) : 20;
  std::vector<double> iso, inproc;
  double cpu_iso_self = 0, cpu_iso_child = 0, cpu_in = 0;
  for (int i = 0; i < n; ++i) {
    for (int mode = 0; mode < 2; ++mode) {
      setenv("ONNXTRAIN_ISOLATE_ONNX", mode == 0 ? "1" : "0", 1);
      Model m = base;
      const double s0 = cpu(RUSAGE_SELF), c0 = cpu(RUSAGE_CHILDREN);
      auto t0 = std::chrono::steady_clock::now();
      infer_shapes(m);
      const double dt = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      const double ds = cpu(RUSAGE_SELF) - s0, dc = cpu(RUSAGE_CHILDREN) - c0;
      if (mode == 0) { iso.push_back(dt); cpu_iso_self += ds; cpu_iso_child += dc; } else { inproc.push_back(dt); cpu_in += ds; }
      if (m.graph.value_info.empty()) { std::puts("no types?"); return 1; }
    }
  }
  std::sort(iso.begin(), iso.end()); std::sort(inproc.begin(), inproc.end());
  std::printf("%s: %zu nodes, %d calls each\n", argv[1], base.graph.nodes.size(), n);
  std::printf("isolated:   median %.2f ms wall (min %.2f), cpu/call %.2f ms parent + %.2f ms child\n", iso[n/2], iso[0], 1e3*cpu_iso_self/n, 1e3*cpu_iso_child/n);
  std::printf("in process: median %.2f ms wall (min %.2f), cpu/call %.2f ms\n", inproc[n/2], inproc[0], 1e3*cpu_in/n);
}
CPP
c++ -std=gnu++20 -O2 -DONNX_ML=1 -DONNX_NAMESPACE=onnx -I"$here" -isystem "$onnx_prefix/include" \
  "$work/bench_isolation.cpp" "$build/libonnxtrain_graph.a" "$onnx_prefix/lib/libonnx.a" \
  "$onnx_prefix/lib/libonnx_proto.a" -lprotobuf -o "$work/bench_isolation"
for m in "${models[@]}"; do "$work/bench_isolation" "$m" "$calls"; done
