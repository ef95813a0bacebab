#!/usr/bin/env bash
# Data-parallel scaling, 2 ranks of one thread each (issues 9 and 30). Per round, one after the other (alternated,
# so a slow minute of a shared machine hits every configuration alike):
#   global  = one process at the global batch (2 x BATCH), alone: what data parallelism replaces
#   pair    = two independent processes at BATCH each, at the same time, rates summed: the same per-rank work with
#             no communication at all (the ceiling on this machine)
#   sync    = `mpirun -np 2`, BATCH per rank, one blocking AllReduce per bucket after the backward pass
#   overlap = `mpirun -np 2`, BATCH per rank, AllReduceStart/AllReduceWait (distributed.overlap, the default)
#   each extra BUCKETS entry: overlap with that bucket size in bytes
# and prints each mpirun rate over pair (the target: 0.9 on W3, 0.8 on W1) and over global; medians at the end,
# with the load average before and after. Then one profiled run per mpirun configuration gives the per-step time
# split (compute, AllReduceStart, AllReduceWait, blocking AllReduce) from the step profiler.
#
#   bash benchmarks/scaling.sh                      # WORKLOAD=w1 BATCH=128 STEPS=200 ROUNDS=5
#   WORKLOAD=w3 BATCH=16 STEPS=30 bash benchmarks/scaling.sh
#   WORKLOAD=w5 BATCH=8 STEPS=4 WARMUP=1 ROUNDS=3 bash benchmarks/scaling.sh   # the real all-MiniLM-L6-v2 (exported
#                                                 once by w5_minilm.py --export into build/bench; needs its package)
#   BUCKETS="65536 262144" bash benchmarks/scaling.sh
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
build="${BUILD_DIR:-$repo/build/release}"
WORKLOAD="${WORKLOAD:-w1}"
if [ "$WORKLOAD" = w5 ]; then
  MODEL="${MODEL:-$repo/build/bench/w5-minilm-s128.onnx}"
  [ -f "$MODEL" ] || "$repo/.venv/bin/python" "$here/w5_minilm.py" --export "$MODEL" --seq 128 >&2
else
  MODEL="${MODEL:-$(cd "$repo/.." && pwd)/shared/bench/models/$WORKLOAD.onnx}"
fi
BATCH="${BATCH:-128}"
STEPS="${STEPS:-200}"
WARMUP="${WARMUP:-20}"
ROUNDS="${ROUNDS:-5}"
BUCKETS="${BUCKETS:-}"
bench="$build/benchmarks/bench_dp"
[ -f "$MODEL" ] || { echo "scaling.sh: model $MODEL not found (set MODEL=...)" >&2; exit 1; }
[ -x "$bench" ] || { echo "scaling.sh: build bench_dp first (scripts/build.sh)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
args=(--workload "$WORKLOAD" --steps "$STEPS" --warmup "$WARMUP")
rate() { sed -n 's/.*"samples_per_s": \([0-9.]*\).*/\1/p' "$1"; }
alone() {  # batch
  timeout -s KILL 600 "$bench" "$MODEL" "${args[@]}" --batch "$1" > "$tmp/out"
  rate "$tmp/out"
}
ranks() {  # extra bench_dp options
  timeout -s KILL 600 mpirun -np 2 --oversubscribe --bind-to none -x OMP_NUM_THREADS=1 \
    "$bench" "$MODEL" "${args[@]}" --batch "$BATCH" "$@" > "$tmp/out"
  rate "$tmp/out"
}
pair() {
  "$bench" "$MODEL" "${args[@]}" --batch "$BATCH" > "$tmp/a" &
  "$bench" "$MODEL" "${args[@]}" --batch "$BATCH" > "$tmp/b"
  wait
  awk -v a="$(rate "$tmp/a")" -v b="$(rate "$tmp/b")" 'BEGIN { printf "%.1f", a + b }'
}
median() { sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
configs=(sync overlap)
for b in $BUCKETS; do configs+=("overlap_$b"); done
options() {  # config -> bench_dp options
  case "$1" in
    sync) echo "--overlap 0" ;;
    overlap) echo "--overlap 1" ;;
    overlap_*) echo "--overlap 1 --bucket-bytes ${1#overlap_}" ;;
  esac
}
echo "$WORKLOAD ($(basename "$MODEL")), batch $BATCH per rank (global $((2 * BATCH))), $STEPS steps, 1 thread per process," \
  "$(OMP_NUM_THREADS= nproc) cores, load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$ROUNDS"); do
  g=$(alone $((2 * BATCH))); p=$(pair)
  echo "$g" >> "$tmp/global"; echo "$p" >> "$tmp/pair"
  line="round $r: global $(printf %.0f "$g")/s, pair $(printf %.0f "$p")/s"
  for c in "${configs[@]}"; do
    # shellcheck disable=SC2046
    v=$(ranks $(options "$c"))
    awk -v v="$v" -v p="$p" 'BEGIN { printf "%.3f\n", v / p }' >> "$tmp/$c.pair"
    awk -v v="$v" -v g="$g" 'BEGIN { printf "%.3f\n", v / g }' >> "$tmp/$c.global"
    echo "$v" >> "$tmp/$c.rate"
    line="$line, $c $(printf %.0f "$v")/s ($(tail -1 "$tmp/$c.pair") of pair)"
  done
  echo "$line"
done
echo "medians over $ROUNDS rounds: global $(median < "$tmp/global")/s, pair $(median < "$tmp/pair")/s"
for c in "${configs[@]}"; do
  echo "  $c: $(median < "$tmp/$c.rate")/s, $(median < "$tmp/$c.pair") of pair (the ceiling), $(median < "$tmp/$c.global") of global"
done
echo "time split per step (one profiled run each, microseconds):"
for c in "${configs[@]}"; do
  # shellcheck disable=SC2046
  timeout -s KILL 600 mpirun -np 2 --oversubscribe --bind-to none -x OMP_NUM_THREADS=1 \
    "$bench" "$MODEL" "${args[@]}" --batch "$BATCH" --repeats 1 --profile 1 $(options "$c") > "$tmp/out"
  echo "  $c: $(sed -n 's/.*"profiled_step_us": \([0-9.]*\), "compute_us": \([0-9.]*\), "start_us": \([0-9.]*\), "wait_us": \([0-9.]*\), "blocking_allreduce_us": \([0-9.]*\).*/step \1, compute \2, start \3, wait \4, blocking allreduce \5/p' "$tmp/out")"
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
