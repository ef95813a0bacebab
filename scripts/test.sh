#!/usr/bin/env bash
# Sets up everything, builds, and runs every test: the C++ suites (ctest) and the Python suites (pytest).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$(bash "$here/scripts/build.sh" | tail -n 1)"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
status=0
ctest --test-dir "$build" --output-on-failure -j"${JOBS:-2}" --timeout 600 || status=1
if compgen -G "$here/tests/python/test_*.py" >/dev/null; then
  ONNXTRAIN_BUILD_DIR="$build" "$here/.venv/bin/python" -m pytest -q "$here/tests/python" || status=1
fi
exit $status
