#!/usr/bin/env bash
# Installs everything onnxtrain needs on a fresh Debian 12 machine. Idempotent: each step checks first, so
# a second run with nothing to do takes a few seconds.
#   - Debian packages (apt-get), only those missing;
#   - the project venv at .venv with numpy, onnx, onnxruntime, pytest;
#   - the ONNX C++ library built from PyPI's onnx sdist, cached outside the build tree
#     (${ONNXTRAIN_CACHE:-~/.cache/onnxtrain}), because Debian's libonnx-dev 1.12 rejects opset >= 18 models.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ONNX_VERSION=1.16.2   # last line that knows opset 21 and builds against Debian's protobuf 3.21 offline
cache="${ONNXTRAIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/onnxtrain}"
onnx_prefix="$cache/onnx-$ONNX_VERSION"
log() { printf '[setup] %s\n' "$*" >&2; }

debs=(build-essential cmake ninja-build pkg-config python3-venv
      libprotobuf-dev protobuf-compiler libeigen3-dev libdnnl-dev pybind11-dev
      libgtest-dev libgmock-dev libyaml-cpp-dev libzip-dev zlib1g-dev libopenmpi-dev openmpi-bin ccache
      python3-torch python3-numpy   # Debian's torch (1.13, CPU) is the tests' reference for torch semantics
      clang libclang-rt-14-dev libomp-14-dev)  # scripts/sanitize.sh and scripts/fuzz.sh (libFuzzer)
missing=()
for p in "${debs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
  log "installing Debian packages: ${missing[*]}"
  sudo_=""; [ "$(id -u)" = 0 ] || sudo_=sudo
  $sudo_ apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_ apt-get install -y -qq "${missing[@]}" >/dev/null
fi

venv="$here/.venv"
py_reqs="$here/scripts/requirements.txt"
stamp="$venv/.requirements.sha"
want="$(sha256sum "$py_reqs" | cut -d' ' -f1)"
if [ ! -x "$venv/bin/python" ]; then
  log "creating venv $venv"
  python3 -m venv "$venv"
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  log "installing Python packages"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q -r "$py_reqs"
  echo "$want" > "$stamp"
fi

if [ ! -f "$onnx_prefix/.complete" ]; then
  log "building the ONNX $ONNX_VERSION C++ library into $onnx_prefix (once per machine)"
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  "$venv/bin/python" -m pip download -q --no-deps --no-binary onnx "onnx==$ONNX_VERSION" -d "$work"
  tar xzf "$work/onnx-$ONNX_VERSION.tar.gz" -C "$work"
  cmake -S "$work/onnx-$ONNX_VERSION" -B "$work/build" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$onnx_prefix" \
    -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DONNX_USE_PROTOBUF_SHARED_LIBS=ON \
    -DONNX_ML=ON -DONNX_BUILD_TESTS=OFF -DBUILD_ONNX_PYTHON=OFF -DONNX_GEN_PB_TYPE_STUBS=OFF \
    -DPython3_EXECUTABLE="$venv/bin/python" >"$work/configure.log" 2>&1 \
    || { cat "$work/configure.log" >&2; exit 1; }
  cmake --build "$work/build" -j"${JOBS:-2}" >"$work/build.log" 2>&1 || { tail -50 "$work/build.log" >&2; exit 1; }
  cmake --install "$work/build" >/dev/null
  touch "$onnx_prefix/.complete"
fi
echo "$onnx_prefix"
