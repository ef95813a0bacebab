#!/usr/bin/env bash
# Sets up everything, builds, and runs every test: the C++ suites (ctest), the Python suites (pytest), and the
# C++ suites again under sanitizers plus a short fuzz run (ONNXTRAIN_SANITIZE=0 skips those two).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$(bash "$here/scripts/build.sh" | tail -n 1)"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
status=0
ctest --test-dir "$build" --output-on-failure -j"${JOBS:-2}" --timeout 600 || status=1
if compgen -G "$here/tests/python/test_*.py" >/dev/null; then
  ONNXTRAIN_BUILD_DIR="$build" "$here/.venv/bin/python" -m pytest -q "$here/tests/python" || status=1
fi
# Reliability (docs/reliability.md): every C++ suite again under ASan + UBSan + LSan, then 20 s of each fuzz
# target, both in the instrumented clang tree build/asan. ONNXTRAIN_SANITIZE=0 skips them (building that tree is
# the expensive part: see docs/reliability.md for measured times).
if [ "${ONNXTRAIN_SANITIZE:-1}" != 0 ]; then
  JOBS="${JOBS:-2}" bash "$here/scripts/sanitize.sh" || status=1
  JOBS="${JOBS:-2}" bash "$here/scripts/fuzz.sh" "${FUZZ_SECONDS:-20}" || status=1
fi
exit $status
