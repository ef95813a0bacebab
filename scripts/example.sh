#!/usr/bin/env bash
# The main job: sets up everything, builds, generates the digits fine-tuning example (a pretrained classifier as
# ONNX and its data, from scikit-learn's bundled digits dataset) and fine-tunes its head with
#   onnxtrain train examples/digits/config.yaml
# Ends by printing where the trained model is and its validation accuracy. Extra arguments go to `onnxtrain
# train` (e.g. --set train.epochs=5).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$(bash "$here/scripts/build.sh" | tail -n 1)"
onnxtrain="$build/cli/onnxtrain"
config="$here/examples/digits/config.yaml"
"$here/.venv/bin/python" "$here/examples/digits/make_digits.py" "$here/examples/digits/data"
echo "before fine-tuning (fresh head):"
"$onnxtrain" eval "$config" | sed 's/^/  validation /'
rm -rf "$here/examples/digits/data/run"   # a fresh run, not the continuation of an earlier one's log
"$onnxtrain" train "$config" "$@" | tee "$here/examples/digits/data/train.log"
model="$(sed -n 's/^trained model: //p' "$here/examples/digits/data/train.log")"
accuracy="$(sed -n 's/^validation accuracy: //p' "$here/examples/digits/data/train.log")"
echo
echo "trained model: $model"
echo "validation accuracy: $accuracy"
