#!/usr/bin/env bash
# Side-by-side benchmark of onnxtrain against PyTorch eager on the shared workloads (../shared/bench), in one
# sequence of alternating processes so both see the same machine state; prints ratios, not bare times.
#
#   bash benchmarks/run.sh
#
# Knobs (environment): THREADS="1 2"  WORKLOADS="w1 w2 w3 w4" (also w1sgd)  ROUNDS=5 (torch/onnxtrain process pairs per
# configuration)  BUILD_DIR=build/bench  PY=/usr/bin/python3  APPEND=1 (append the table to results.md)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
shared="$(cd "$repo/.." && pwd)/shared/bench"
PY="${PY:-/usr/bin/python3}"
THREADS="${THREADS:-1 2}"
WORKLOADS="${WORKLOADS:-w1 w2 w3 w4}"
ROUNDS="${ROUNDS:-5}"
APPEND="${APPEND:-1}"
build="${BUILD_DIR:-$repo/build/bench}"
OPENBLAS=/usr/lib/x86_64-linux-gnu/openblas-openmp
log() { printf '[bench] %s\n' "$*" >&2; }

for f in models/w1.onnx models/w2.onnx models/w3.onnx models/w4.onnx peers/bench_data.py peers/torch_harness.py \
         peers/w1_mlp_torch.py peers/w2_cnn_torch.py peers/w3_transformer_torch.py peers/w4_overhead_torch.py; do
  [ -f "$shared/$f" ] || { echo "run.sh: the shared benchmark folder is missing $shared/$f" \
                                "(expected ../shared/bench next to the repository)" >&2; exit 1; }
done

# Debian's torch and numpy use whatever libblas.so.3 is installed: without OpenBLAS that is the netlib
# reference BLAS, ~10x slower on W1, which would flatter onnxtrain. threadpoolctl lets the harness probe it.
if ! "$PY" -c 'import torch, numpy, threadpoolctl' 2>/dev/null || [ ! -e "$OPENBLAS/libblas.so.3" ]; then
  log "installing python3-torch python3-numpy python3-threadpoolctl libopenblas0-openmp"
  sudo_=""; [ "$(id -u)" = 0 ] || sudo_=sudo
  $sudo_ apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_ apt-get install -y -qq python3-torch python3-numpy \
    python3-threadpoolctl libopenblas0-openmp >/dev/null
fi

# scripts/build.sh builds every target of the folder; the benchmark needs only bench_train, so a failure
# elsewhere (someone's work in progress) falls back to building just that target.
export BUILD_DIR="$build" CMAKE_ARGS="${CMAKE_ARGS:--DONNXTRAIN_BUILD_TESTS=OFF}"
if ! bash "$repo/scripts/build.sh" >/dev/null; then
  log "scripts/build.sh failed; building only bench_train"
  cmake --build "$build" -j"${JOBS:-2}" --target bench_train >&2
fi
bench="$build/benchmarks/bench_train"
[ -x "$bench" ] || { echo "run.sh: $bench was not built" >&2; exit 1; }

export BENCH_DATA_DIR="$build/bench-data"
"$PY" "$shared/peers/bench_data.py" --materialize --check >&2

load_start="$(cut -d' ' -f1-3 /proc/loadavg)"
out="$build/bench-results/$(date +%Y%m%d-%H%M%S)"
mkdir -p "$out"
log "results in $out"
for t in $THREADS; do
  export OMP_NUM_THREADS=$t OPENBLAS_NUM_THREADS=$t MKL_NUM_THREADS=$t
  for w in $WORKLOADS; do
    case $w in
      w1) peer=("$here/torch_peer.py" "$shared/peers/w1_mlp_torch.py") ;;
      w2) peer=("$here/torch_peer.py" "$shared/peers/w2_cnn_torch.py") ;;
      w3) peer=("$here/torch_peer.py" "$shared/peers/w3_transformer_torch.py") ;;
      w4) peer=("$here/torch_peer.py" "$shared/peers/w4_overhead_torch.py") ;;
      w1sgd) peer=("$here/w1_sgd_torch.py") ;;
      *) echo "run.sh: unknown workload $w (w1, w2, w3, w4, w1sgd)" >&2; exit 1 ;;
    esac
    for r in $(seq 1 "$ROUNDS"); do
      log "$w threads=$t round $r/$ROUNDS"
      LD_LIBRARY_PATH="$OPENBLAS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
        "$PY" "${peer[@]}" --threads "$t" --out "$out/torch_${w}_t${t}_r${r}.jsonl" \
        --losses "$out/torch_${w}_t${t}_r${r}_losses.npy" >&2
      "$bench" --workload "$w" --models "$shared/models" --data "$BENCH_DATA_DIR" --threads "$t" \
        --losses "$out/onnxtrain_${w}_t${t}_r${r}_losses.txt" > "$out/onnxtrain_${w}_t${t}_r${r}.jsonl"
    done
  done
done

# Other work on the machine shows up here first: on 2 cores a busy core stalls every 2-thread parallel region.
table="$("$PY" "$here/report.py" "$out")
Load average (1/5/15 min) at start: $load_start; at end: $(cut -d' ' -f1-3 /proc/loadavg)."
echo "$table"
if [ "$APPEND" = 1 ]; then
  { echo; echo "## $(date '+%Y-%m-%d %H:%M %Z')"; echo
    echo "\`THREADS=\"$THREADS\" WORKLOADS=\"$WORKLOADS\" ROUNDS=$ROUNDS bash benchmarks/run.sh\`" \
         "(raw: \`${out#"$repo"/}\`)"; echo
    echo "$table"; } >> "$here/results.md"
  log "appended to benchmarks/results.md"
fi
