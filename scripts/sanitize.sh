#!/usr/bin/env bash
# Builds the C++ libraries and every GoogleTest suite with AddressSanitizer + UndefinedBehaviorSanitizer
# (LeakSanitizer included) in build/asan, then runs the suites. One instrumented clang build serves both
# this script and scripts/fuzz.sh (the code also carries libFuzzer's coverage hooks, -fsanitize=fuzzer-no-link),
# because the machine cannot afford two sanitizer builds of the whole tree.
#
#   scripts/sanitize.sh [ctest -R regex]     # default: every C++ suite; see docs/reliability.md for timings
#   scripts/sanitize.sh --subset             # the CI subset that scripts/test.sh runs by default (below)
#   SANITIZE_BUILD_ONLY=1 scripts/sanitize.sh [--subset]
#
# The subset builds only what parses untrusted input and its suites: the graph (loader, validator), gradient
# builder, reliability (malformed input, numerical guards, LeakSanitizer over 1000 W1 steps) and CLI config
# suites, the replica and checkpoint tests, the tests of the hand-written AVX-512 GEMM, convolutions and 2x2 max
# pool and of the kernels that call them (masked loads and stores at every tail, against exact-size buffers), plus the four fuzz targets, which pull in
# the rest of the libraries (executor, training, cli) but not the other suites, examples or benchmarks. It runs
# those suites' binaries directly.
#
# Any ASan/UBSan/LSan report fails the run (halt_on_error, exitcode != 0).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${ASAN_BUILD_DIR:-$here/build/asan}"
san_flags="-O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all -fsanitize=fuzzer-no-link"
if [ ! -f "$build/CMakeCache.txt" ]; then
  onnx_prefix="$(bash "$here/scripts/setup.sh" | tail -n 1)"
  CC=clang CXX=clang++ cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Debug \
    -DCMAKE_PREFIX_PATH="$onnx_prefix" -DCMAKE_CXX_FLAGS_DEBUG="$san_flags" \
    -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
    -DONNXTRAIN_CUDA=OFF -DONNXTRAIN_BUILD_PYTHON=OFF -DONNXTRAIN_FUZZ=ON ${CMAKE_ARGS:-} >&2
fi
# The CI subset: suite binary and its gtest filter (the CLI suite without its whole example runs).
subset_tests=("tests/test_graph:*" "tests/test_gradients:*" "tests/reliability/test_reliability:*"
              "tests/cli/test_cli:Config*:MalformedCli.*"
              "tests/test_training:*Replicat*:TrainEpoch.*:Checkpoint.*"
              "tests/test_executor:*OwnSgemm*:*MatMul*:*Gemm*:*Conv*:*Pool*")
subset=""
if [ "${1:-}" = --subset ]; then
  subset=1
  shift
fi
# build.sh only builds an existing tree; it configures only when the cache is missing. fuzz.sh needs just the
# configured tree (NO_TESTS_BUILD) and builds its own targets.
if [ -n "$subset" ]; then
  targets=(fuzz_load_model fuzz_gradients fuzz_checkpoint fuzz_config)
  for t in "${subset_tests[@]}"; do targets+=("$(basename "${t%%:*}")"); done
  cmake --build "$build" -j"${JOBS:-1}" --target "${targets[@]}" >&2
elif [ -z "${NO_TESTS_BUILD:-}" ]; then
  BUILD_DIR="$build" JOBS="${JOBS:-1}" bash "$here/scripts/build.sh" >/dev/null
fi
[ -n "${SANITIZE_BUILD_ONLY:-}" ] && exit 0

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:halt_on_error=1:abort_on_error=0:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$here/scripts/lsan.supp:print_suppressions=0}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
if [ -n "$subset" ]; then
  status=0
  for t in "${subset_tests[@]}"; do
    echo "[sanitize] ${t%%:*} --gtest_filter=${t#*:}" >&2
    # The replica tests build their sessions on several threads at once, and each build forks for ONNX's shape
    # inference. ASan's allocator (clang 14) has no fork handlers, so a child can inherit a lock another thread
    # held and hang (docs/reliability.md). Those models are the tests' own: their inference runs in process.
    isolate=()
    [[ $t == tests/test_training:* ]] && isolate=(ONNXTRAIN_ISOLATE_ONNX=0)
    # From the binary's folder, as ctest would run it.
    (cd "$build/$(dirname "${t%%:*}")" &&
      env "${isolate[@]}" timeout 1800 "./$(basename "${t%%:*}")" --gtest_filter="${t#*:}" --gtest_brief=1) ||
      status=1
  done
  exit $status
fi
args=(--test-dir "$build" --output-on-failure -j"${JOBS:-1}" --timeout 1800)
[ $# -gt 0 ] && args+=(-R "$1")
# Two tests run differently here (docs/reliability.md, "The whole suite"):
# - InstallAndBuildDownstream links a plain downstream program against these instrumented static libraries, which
#   then need the sanitizer runtime it does not link: it is the release suite's test, not this one's.
# - The tests that launch ranks under mpirun run with LeakSanitizer off in those processes: Open MPI unloads its
#   components at MPI_Finalize, so their process-lifetime allocations reach LSan with no module to suppress by.
#   ASan and UBSan stay on, and the same code paths run single-process with leak checks in the other suites.
#   (OMPI_MCA_mca_base_component_disable_dlclose=1 did not change that with Debian's Open MPI 4.1.)
# A run limited by a regex keeps leak checks on everywhere.
mpi_tests='Mpirun|CliMpirun|Equivalence.TwoRanks'
status=0
if [ $# -gt 0 ]; then
  ctest "${args[@]}" -E InstallAndBuildDownstream || status=1
else
  ctest "${args[@]}" -E "InstallAndBuildDownstream|$mpi_tests" || status=1
  ASAN_OPTIONS="$ASAN_OPTIONS:detect_leaks=0" ctest "${args[@]}" -R "$mpi_tests" || status=1
fi
exit $status
