#!/usr/bin/env bash
# Soak run (docs/reliability.md, "Soak"): a CLI fine-tuning run, `onnxtrain train` on the digits example (a
# pretrained classifier whose new head is trained, examples/digits), for SOAK_SECONDS (default 1800 = the issue's
# 30 minutes), then stopped with Ctrl-C (SIGINT: the CLI saves a final checkpoint and exits 130). It writes a
# checkpoint every SOAK_CKPT_STEPS optimizer steps (default 200000, about one every 10 s on an idle core) and keeps
# them all. The resident set of the training process is sampled every SOAK_EVERY seconds (default 60). Afterwards
# every checkpoint must load and evaluate (`onnxtrain eval --model CKPT`) and continue training (`onnxtrain
# resume`, SOAK_RESUME_STEPS steps, default 5).
#
# Fails when the resident set grows by more than SOAK_MAX_GROWTH_KB (default 4096) after the second sample (the
# first includes start-up), when training stops early, or when any checkpoint fails. Prints CSV samples and a
# summary line; everything (config, data, logs, checkpoints) stays in SOAK_DIR (default build/soak). Not a CI test.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${SOAK_BUILD_DIR:-$(bash "$here/scripts/build.sh" | tail -n 1)}"
cli="$build/cli/onnxtrain"
seconds="${SOAK_SECONDS:-1800}"
every="${SOAK_EVERY:-60}"
ckpt_steps="${SOAK_CKPT_STEPS:-200000}"
resume_steps="${SOAK_RESUME_STEPS:-5}"
max_growth="${SOAK_MAX_GROWTH_KB:-4096}"
dir="${SOAK_DIR:-$here/build/soak}"

rm -rf "$dir"
mkdir -p "$dir"
"$here/.venv/bin/python" "$here/examples/digits/make_digits.py" "$dir/data" >/dev/null
cp "$here/examples/digits/config.yaml" "$dir/config.yaml"
# The example's config, made to run until interrupted: no early stop, a constant rate, every checkpoint kept.
"$cli" train "$dir/config.yaml" --set output=run --set train.epochs=100000000 --set early_stopping.patience=0 \
  --set schedule.kind=constant --set checkpoint.every="$ckpt_steps" --set checkpoint.keep_last=0 \
  --set log.every=1000 --set log.progress=none >"$dir/train.log" 2>&1 &
pid=$!
metrics="$dir/run/metrics.csv"

rss_kb() { awk '/^VmRSS:/ {print $2}' "/proc/$pid/status" 2>/dev/null || echo -1; }
# The last step row of the metrics log: "step,epoch,step,loss,..." -> "step,loss".
last_step() { { tail -n 400 "$metrics" 2>/dev/null || true; } | awk -F, '$1 == "step" {s = $3 "," $4} END {print (s == "" ? "0," : s)}'; }

echo "seconds,steps,loss,rss_kb,checkpoints"
start=$SECONDS
samples=()
next=$every
while kill -0 "$pid" 2>/dev/null; do
  sleep 1
  t=$((SECONDS - start))
  [ "$t" -lt "$next" ] && [ "$t" -lt "$seconds" ] && continue
  r="$(rss_kb)"
  samples+=("$r")
  n="$(find "$dir/run/checkpoints" -name 'step-*.onnx' 2>/dev/null | wc -l)"
  echo "$t,$(last_step),$r,$n"
  next=$((next + every))
  if [ "$t" -ge "$seconds" ]; then
    kill -INT "$pid"
    break
  fi
done
code=0
wait "$pid" || code=$?
status=0
if [ "$code" != 130 ]; then
  echo "soak: the training process ended with exit code $code before it was interrupted; see $dir/train.log" >&2
  tail -20 "$dir/train.log" >&2
  status=1
fi

# Every checkpoint loads, evaluates and trains on.
checkpoints=0
bad=0
while read -r ckpt; do
  checkpoints=$((checkpoints + 1))
  step="$(basename "$ckpt" .onnx)"
  step="${step#step-}"
  if ! out="$("$cli" eval "$dir/config.yaml" --model "$ckpt" 2>&1)" || ! grep -q '^accuracy ' <<<"$out"; then
    echo "soak: checkpoint $ckpt does not evaluate: $out" >&2
    bad=$((bad + 1))
    continue
  fi
  echo "$step,$(awk '$1 == "accuracy" {print $2}' <<<"$out")" >>"$dir/checkpoint_accuracy.csv"
  if ! out="$("$cli" resume "$ckpt" --set output="$dir/resumed" --set train.max_steps=$((step + resume_steps)) \
                --set log.progress=none 2>&1)" || ! grep -q "^stopped: max_steps" <<<"$out"; then
    echo "soak: checkpoint $ckpt does not resume: $out" >&2
    bad=$((bad + 1))
  fi
done < <(find "$dir/run/checkpoints" -name 'step-*.onnx' | awk -F'step-' '{print $NF "\t" $0}' | sort -n | cut -f2)

base="${samples[1]:-${samples[0]:--1}}"
peak="$base"
for ((i = 1; i < ${#samples[@]}; ++i)); do
  [ "${samples[i]}" -gt "$peak" ] && peak="${samples[i]}"
done
final="$(last_step)"
echo "summary: $((SECONDS - start)) s, ${final%%,*} steps, $checkpoints checkpoints ($bad failed to load, evaluate or" \
  "resume), RSS ${samples[0]:--1} kB at the first sample, $base kB at the second, ${samples[-1]:--1} kB at the end," \
  "peak $peak kB; accuracy per checkpoint in $dir/checkpoint_accuracy.csv"
[ "$checkpoints" -gt 0 ] || { echo "soak: no checkpoint was written" >&2; status=1; }
[ "$bad" -eq 0 ] || status=1
if [ $((peak - base)) -gt "$max_growth" ]; then
  echo "soak: the resident set grew by $((peak - base)) kB (limit $max_growth kB)" >&2
  status=1
fi
exit $status
