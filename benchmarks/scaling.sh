#!/usr/bin/env bash
# Data-parallel scaling efficiency, 1 vs 2 ranks, one thread each (issue 9). Per round, side by side:
#   one  = `mpirun -np 1 bench_dp` samples/s
#   two  = `mpirun -np 2 bench_dp` samples/s (both ranks' samples; the same batch per rank: weak scaling)
#   pair = two independent single-process bench_dp runs at the same time, summed: what this machine gives two
#          ranks that never communicate (the ceiling, well below 2 x one on a shared, loaded machine)
# and prints efficiency = two / (2 x one), ceiling = pair / (2 x one), and two / pair; medians at the end.
#
#   bash benchmarks/scaling.sh            # MODEL=../shared/bench/models/w1.onnx BATCH=128 STEPS=200 ROUNDS=5
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
build="${BUILD_DIR:-$repo/build/release}"
MODEL="${MODEL:-$(cd "$repo/.." && pwd)/shared/bench/models/w1.onnx}"
BATCH="${BATCH:-128}"
STEPS="${STEPS:-200}"
ROUNDS="${ROUNDS:-5}"
bench="$build/benchmarks/bench_dp"
[ -f "$MODEL" ] || { echo "scaling.sh: model $MODEL not found (set MODEL=...)" >&2; exit 1; }
[ -x "$bench" ] || { echo "scaling.sh: build bench_dp first (scripts/build.sh)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
rate() { sed -n 's/.*"samples_per_s": \([0-9.]*\).*/\1/p' "$1"; }
run() {  # ranks
  timeout -s KILL 600 mpirun -np "$1" --oversubscribe --bind-to none -x OMP_NUM_THREADS=1 \
    "$bench" "$MODEL" --batch "$BATCH" --steps "$STEPS" > "$tmp/out"
  rate "$tmp/out"
}
pair() {
  "$bench" "$MODEL" --batch "$BATCH" --steps "$STEPS" > "$tmp/a" &
  "$bench" "$MODEL" --batch "$BATCH" --steps "$STEPS" > "$tmp/b"
  wait
  awk -v a="$(rate "$tmp/a")" -v b="$(rate "$tmp/b")" 'BEGIN { printf "%.1f", a + b }'
}
median() { sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
echo "model $(basename "$MODEL"), batch $BATCH per rank, $STEPS steps, Adam, 1 thread per rank, $(OMP_NUM_THREADS= nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
: > "$tmp/eff"; : > "$tmp/ceil"; : > "$tmp/frac"
for r in $(seq "$ROUNDS"); do
  one=$(run 1); two=$(run 2); both=$(pair)
  awk -v o="$one" -v t="$two" -v p="$both" -v r="$r" -v d="$tmp" 'BEGIN {
    printf "round %d: 1 rank %.0f/s, 2 ranks %.0f/s, 2 lone processes %.0f/s: efficiency %.3f, ceiling %.3f, 2 ranks / 2 lone %.3f\n",
           r, o, t, p, t / (2 * o), p / (2 * o), t / p
    printf "%.3f\n", t / (2 * o) >> (d "/eff"); printf "%.3f\n", p / (2 * o) >> (d "/ceil"); printf "%.3f\n", t / p >> (d "/frac") }'
done
echo "median over $ROUNDS rounds: efficiency $(median < "$tmp/eff"), ceiling $(median < "$tmp/ceil"), 2 ranks / 2 lone $(median < "$tmp/frac")   (load after: $(cut -d' ' -f1-3 /proc/loadavg))"
