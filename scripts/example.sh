#!/usr/bin/env bash
# The main job: sets up everything, builds, writes the example MLP (64-256-256-1, ReLU) as an ONNX model and
# trains it with the C++ API, printing the loss per epoch. Extra arguments go to train_mlp (--epochs, --lr, ...).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$(bash "$here/scripts/build.sh" | tail -n 1)"
out="$build/example"
mkdir -p "$out"
"$here/.venv/bin/python" "$here/examples/make_mlp.py" "$out/mlp.onnx" --sizes 64 256 256 1 >/dev/null
"$build/examples/train_mlp" "$out/mlp.onnx" --epochs 10 --out "$out/mlp.trained.onnx" "$@"
