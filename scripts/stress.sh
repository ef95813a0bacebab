#!/usr/bin/env bash
# Runs a set of tests N times while BUSY processes spin on the CPU, and counts failures: the check that no test
# depends on timing or load (docs/reliability.md). Defaults: the tests that once used timers, sleeps or
# wall-clock bounds (Ctrl-C, communicator failures and timeouts, killed saves, the ONNX inference timeout, the
# two-host run), 20 rounds, 2 busy loops.
#   scripts/stress.sh [ROUNDS] [BUSY]      (env CTEST_REGEX, PYTEST_ARGS override the test selection)
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-$here/build/release}"
rounds="${1:-20}"
busy="${2:-2}"
regex="${CTEST_REGEX:-CtrlC|Interrupting|ThreadGroup|ReplicatedSession|IsolatedInference|Mpirun|KillMid|CheckpointChecksums}"
pytest_args="${PYTEST_ARGS:-$here/tests/python/test_sklearn_epoch.py -k ctrl_c}"
pids=()
for _ in $(seq "$busy"); do (while :; do :; done) & pids+=($!); done
trap 'kill "${pids[@]}" 2>/dev/null' EXIT
failed=0
for r in $(seq "$rounds"); do
  start=$(date +%s)
  ok=yes
  (cd "$build" && ctest -R "$regex" --output-on-failure > "$build/stress-$r.log" 2>&1) || ok=no
  # shellcheck disable=SC2086
  env ONNXTRAIN_BUILD_DIR="$build" "$here/.venv/bin/python" -m pytest -q $pytest_args >> "$build/stress-$r.log" 2>&1 || ok=no
  [ "$ok" = yes ] || failed=$((failed + 1))
  echo "round $r: $ok ($(( $(date +%s) - start )) s; $(grep -c 'Test *#' "$build/stress-$r.log") ctest tests; log $build/stress-$r.log)"
done
echo "stress: $failed of $rounds rounds failed, with $busy busy loops"
[ "$failed" -eq 0 ]
