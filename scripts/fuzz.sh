#!/usr/bin/env bash
# Runs the libFuzzer targets of fuzz/ for a bounded time each (docs/reliability.md, "Fuzzing").
#
#   scripts/fuzz.sh [seconds per target, default 60] [target ...]
#   scripts/fuzz.sh 0 [target ...]   # replay: run every seed of fuzz/corpus once (deterministic; what CI runs)
#   targets: fuzz_load_model fuzz_gradients fuzz_checkpoint fuzz_config (default: all)
#
# Builds them in the instrumented clang tree build/asan (configured by scripts/sanitize.sh: ASan + UBSan +
# libFuzzer coverage). Each run starts from the seed corpus fuzz/corpus/<target without fuzz_> and keeps what it
# learns in build/fuzz/corpus/<target>, so the repository's corpus only changes by hand. A crash, sanitizer
# report, leak, timeout (10 s per input) or any exception other than onnxtrain::Error fails the run; the
# reproducer lands in build/fuzz/artifacts/<target>/. Replay one with: build/asan/fuzz/<target> <file>.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
seconds="${1:-60}"
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(fuzz_load_model fuzz_gradients fuzz_checkpoint fuzz_config)
build="${ASAN_BUILD_DIR:-$here/build/asan}"
work="$here/build/fuzz"

SANITIZE_BUILD_ONLY=1 NO_TESTS_BUILD=1 bash "$here/scripts/sanitize.sh"
cmake --build "$build" -j"${JOBS:-1}" --target "${targets[@]}" >&2

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:halt_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$here/scripts/lsan.supp:print_suppressions=0}"
export OMP_NUM_THREADS=1
# ONNX's shape inference runs in a child process (docs/reliability.md); its timeout must stay below libFuzzer's
# 10 s per input, so a model that hangs ONNX is an Error (what the loader promises), not a fuzzer timeout.
export ONNXTRAIN_ONNX_TIMEOUT="${ONNXTRAIN_ONNX_TIMEOUT:-3}"
status=0
for t in "${targets[@]}"; do
  seeds="$here/fuzz/corpus/${t#fuzz_}"
  mkdir -p "$work/corpus/$t" "$work/artifacts/$t"
  if [ "$seconds" = 0 ]; then
    echo "[fuzz] $t: replaying the seed corpus $seeds" >&2
    run=("$build/fuzz/$t" -runs=0 "$seeds")
  else
    echo "[fuzz] $t for ${seconds}s (seeds: $seeds)" >&2
    run=("$build/fuzz/$t" "$work/corpus/$t" "$seeds" -max_total_time="$seconds")
  fi
  if ! "${run[@]}" -timeout=10 -rss_limit_mb=2048 -artifact_prefix="$work/artifacts/$t/" -print_final_stats=1 \
      >"$work/$t.log" 2>&1; then
    echo "[fuzz] $t FAILED; log: $work/$t.log" >&2
    tail -40 "$work/$t.log" >&2
    status=1
  else
    grep -E "stat::number_of_executed_units|stat::new_units_added" "$work/$t.log" | sed "s/^/[fuzz] $t /" >&2 || true
  fi
done
exit $status
