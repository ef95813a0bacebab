#!/usr/bin/env bash
# Configures and builds onnxtrain (after scripts/setup.sh). BUILD_DIR and PRESET may be overridden.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
onnx_prefix="$(bash "$here/scripts/setup.sh" | tail -n 1)"
build="${BUILD_DIR:-$here/build/release}"
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-Release}" \
    -DCMAKE_PREFIX_PATH="$onnx_prefix" ${CMAKE_ARGS:-} >&2
fi
cmake --build "$build" -j"${JOBS:-2}" >&2
echo "$build"
