#!/usr/bin/env bash
# The GPU check, in one command, on a GPU machine that has only a driver and PyTorch's CUDA wheels: unpacks the
# bundle that scripts/gpu_bundle.sh made on the build machine (binaries, their libraries, data), then runs the CUDA
# test suites, the device-sensitive suites with every session on the GPU, NCCL with a world of one, the digits
# fine-tune on the GPU against the CPU, and the W1/W3 benchmarks against PyTorch eager on the same GPU. One
# PASS/FAIL/SKIP line per step, a summary, and exit status 1 if any step failed. Logs: $LOG_DIR (default $OUT/gpu-check
# when $OUT is set, else gpu-bundle/logs).
#
#   bash scripts/gpu_check.sh                  from the checkout, with gpu-bundle/bundle.tar.xz beside it
#   DEVICE=guarded bash scripts/gpu_check.sh   the same flow on a machine without a GPU, on the guarded test device
#                                              (a CPU device); the steps that need CUDA say SKIP
#
# Knobs: DEVICE (cuda:0), DEVICE_SUITES_FILTER (below), NVIDIA_WHEELS (the site-packages/nvidia folder holding
# */lib with libcudart, libcublas, libcudnn, libnccl), TORCH_PYTHON (/opt/torch/.venv/bin/python, else the project
# venv), BUNDLE, WORKLOADS ("w1 w3"; any of w1 w2 w3 w4, or empty), REPEATS (timed runs per benchmark: 3; 1 on
# guarded), TIMEOUT_SCALE (1; 4 on guarded), TIME_BUDGET (seconds for everything: 300; none on guarded), LOG_DIR.
set -euo pipefail

# The suites CI runs on the guarded device (tests/device_suites.txt, line "training"), here on $DEVICE.
DEVICE_SUITES_FILTER="${DEVICE_SUITES_FILTER:-$(awk '$1 == "training" {print $3}' "$(dirname "${BASH_SOURCE[0]}")/../tests/device_suites.txt")}"

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEVICE="${DEVICE:-cuda:0}"
case $DEVICE in
  cuda*) cuda=1 ;;
  guarded) cuda=0 ;;
  *) echo "gpu_check.sh: DEVICE must be cuda, cuda:N or guarded, not '$DEVICE'" >&2; exit 2 ;;
esac
NVIDIA_WHEELS="${NVIDIA_WHEELS:-/opt/torch/.venv/lib/python3.12/site-packages/nvidia}"
if [ -z "${TORCH_PYTHON:-}" ]; then
  TORCH_PYTHON=/opt/torch/.venv/bin/python
  [ -x "$TORCH_PYTHON" ] || TORCH_PYTHON="$repo/.venv/bin/python"
fi
BUNDLE="${BUNDLE:-$repo/gpu-bundle/bundle.tar.xz}"
WORKLOADS="${WORKLOADS-w1 w3}"
REPEATS="${REPEATS:-$([ $cuda = 1 ] && echo 3 || echo 1)}"
TIMEOUT_SCALE="${TIMEOUT_SCALE:-$([ $cuda = 1 ] && echo 1 || echo 4)}"
TIME_BUDGET="${TIME_BUDGET:-$([ $cuda = 1 ] && echo 300 || echo 0)}"  # seconds for the whole check; 0: no limit
LOG_DIR="${LOG_DIR:-${OUT:+$OUT/gpu-check}}"
LOG_DIR="${LOG_DIR:-$repo/gpu-bundle/logs}"
torch_device=$([ $cuda = 1 ] && echo "$DEVICE" || echo cpu)  # torch names cuda and cuda:N the same way
unset ONNXTRAIN_DEVICE  # set per step below: steps a, b and e choose their devices themselves
work="$repo/gpu-bundle/work"
root="$work/onnxtrain-gpu"
start=$SECONDS

[ -f "$BUNDLE" ] || { echo "gpu_check.sh: no bundle at $BUNDLE (make it with scripts/gpu_bundle.sh after a build)" >&2; exit 2; }
[ -x "$TORCH_PYTHON" ] || { echo "gpu_check.sh: no Python at $TORCH_PYTHON (set TORCH_PYTHON)" >&2; exit 2; }
rm -rf "$work" "$LOG_DIR"
mkdir -p "$work" "$LOG_DIR"
if command -v xz >/dev/null; then tar -C "$work" -xJf "$BUNDLE"
else "$TORCH_PYTHON" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$BUNDLE" "$work"
fi
info() { sed -n "s/^$1=//p" "$root/BUNDLE_INFO"; }

# Our binaries get the bundle's libraries and the wheels' CUDA libraries; nothing else does (the bundle's are
# Debian 12's and would shadow the target's own in Python).
orig_ld="${LD_LIBRARY_PATH:-}"
ld="$root/lib"
for d in "$NVIDIA_WHEELS"/*/lib; do [ -d "$d" ] && ld+=":$d"; done
ld+="${orig_ld:+:$orig_ld}"

# The Python the tests run their reference scripts with: the target's, plus the bundled onnx package if it has none.
pypath=""
if ! "$TORCH_PYTHON" -c 'import onnx' 2>/dev/null && [ -d "$root/py" ]; then pypath="$root/py"; fi
py="$work/python"
{
  echo '#!/bin/sh'
  echo "# The tests' Python: the target's own libraries, not the bundle's (those are for onnxtrain's binaries)."
  printf 'export LD_LIBRARY_PATH=%q\n' "$orig_ld"
  [ -z "$pypath" ] || printf 'export PYTHONPATH=%q${PYTHONPATH:+:$PYTHONPATH}\n' "$pypath"
  printf 'exec %q "$@"\n' "$TORCH_PYTHON"
} > "$py"
chmod +x "$py"
export ONNXTRAIN_SOURCE_DIR="$repo" ONNXTRAIN_PYTHON="$py" OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
# Some tests run the Python compiled into them (ONNXTRAIN_PYTHON used directly, not through test_env.cpp): where
# that path does not exist here, point it at the wrapper for the duration of the check.
compiled_py="$(info compiled_python)"
made_link=""
if [ -n "$compiled_py" ] && [ ! -e "$compiled_py" ] && mkdir -p "$(dirname "$compiled_py")" 2>/dev/null &&
   ln -s "$py" "$compiled_py" 2>/dev/null; then
  made_link="$compiled_py"
fi
trap '[ -z "$made_link" ] || rm -f "$made_link"' EXIT

results=()
failed=0
record() {  # PASS|FAIL|SKIP|WARN step detail
  results+=("$(printf '%-4s  %-20s %s' "$1" "$2" "$3")")
  [ "$1" != FAIL ] || failed=1
  printf '%-4s  %-20s %s\n' "$1" "$2" "$3"
}
# A step's timeout: its own (scaled), cut to what is left of TIME_BUDGET, so the whole check ends in time.
secs() {
  local t=$(($1 * TIMEOUT_SCALE)) left=$((TIME_BUDGET - (SECONDS - start)))
  [ "$TIME_BUDGET" = 0 ] || [ $left -ge $t ] || t=$((left > 5 ? left : 5))
  echo $t
}
ot() { env LD_LIBRARY_PATH="$ld" "$@"; }  # runs one of our binaries

echo "== gpu_check: device $DEVICE, bundle $(info commit) made $(info made), CUDA toolkit $(info cuda_toolkit)"
echo "   python: $TORCH_PYTHON $("$py" -c 'import importlib, sys
v = []
for m in ("torch", "numpy", "onnx", "sklearn"):
    try: v.append(m + " " + importlib.import_module(m).__version__)
    except Exception: v.append(m + " missing")
print("(" + ", ".join(v) + ")")' 2>&1 | tail -1)${pypath:+, onnx from the bundle}"
[ -z "$made_link" ] || echo "   linked the tests' compiled-in Python $made_link -> $py (removed at exit)"
[ -e "$compiled_py" ] || echo "   WARN: the tests' compiled-in Python $compiled_py does not exist and could not be made:" \
                              "tests that call it directly will fail"
if [ $cuda = 1 ]; then
  command -v nvidia-smi >/dev/null &&
    echo "   GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1)"
  echo "   CUDA libraries from: $(printf '%s\n' "$NVIDIA_WHEELS"/*/lib | tr '\n' ' ')"
fi

# 0. Every binary finds every library (the bundle's, the wheels', the system's).
missing=""
for b in "$root"/bin/*; do
  m="$(ot ldd "$b" | awk '/not found/ {print $1}' | tr '\n' ' ')"
  [ -z "$m" ] || missing+="$(basename "$b"): $m; "
done
if [ -n "$missing" ] && [ $cuda = 1 ]; then record FAIL libraries "not found: $missing(NVIDIA_WHEELS=$NVIDIA_WHEELS)"
else record PASS libraries "$(ls "$root/bin" | wc -l) binaries, $(ls "$root/lib" | wc -l) bundled libraries${missing:+ (not found here: $missing)}"
fi

# A gtest binary with a filter -> one line: PASS (n passed, m skipped), SKIP (all skipped), FAIL (names, or why).
gtest_step() {  # step timeout binary filter [VAR=value ...]
  local name=$1 t bin=$3 filter=$4 log="$LOG_DIR/$1.log" rc=0 passed skipped names why
  t="$(secs "$2")"
  shift 4
  [ -x "$root/bin/$bin" ] || { record SKIP "$name" "$bin is not in the bundle"; return; }
  local t0=$SECONDS
  ot env "$@" timeout -k 10 "$t" "$root/bin/$bin" --gtest_filter="$filter" --gtest_color=no > "$log" 2>&1 || rc=$?
  passed="$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$log" | tail -1)"
  skipped="$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$log" | tail -1)"
  names="$(grep -E '^\[  FAILED  \] [A-Za-z]' "$log" | sed -E 's/^\[  FAILED  \] ([^ ,]*).*/\1/' | sort -u | head -8 | tr '\n' ' ' || true)"
  local took="$((SECONDS - t0)) s"
  if [ $rc = 124 ] || [ $rc = 137 ]; then
    record FAIL "$name" "timed out after $t s in $(grep '^\[ RUN      \]' "$log" | tail -1 | cut -c14- || true) ($log)"
  elif [ $rc != 0 ]; then
    local nfail
    nfail="$(sed -n 's/^\[  FAILED  \] \([0-9]*\) tests\{0,1\}, listed below.*/\1/p' "$log" | tail -1)"
    if [ -n "$names" ]; then why="${nfail:-?} of $((${passed:-0} + ${nfail:-0} + ${skipped:-0})) failed: $names"
    else why="exit $rc: $(grep -v '^\[' "$log" | tail -2 | tr '\n' ' ' || true)"
    fi
    record FAIL "$name" "$why($took; $log)"
  elif [ "${passed:-0}" = 0 ] && [ "${skipped:-0}" != 0 ]; then
    why="$(grep -A1 -m1 'Skipped$' "$log" | tail -1 || true)"
    record SKIP "$name" "all ${skipped} skipped: $why ($took)"
  elif [ "${passed:-0}" = 0 ]; then
    record FAIL "$name" "no test matches '$filter'"
  else
    record PASS "$name" "${passed} passed${skipped:+, $skipped skipped} ($took)"
  fi
}

# a. CUDA kernels against the CPU's, the twin registry, dropout, the guarded device, half-precision MatMul.
gtest_step executor 90 test_executor 'Ops/CudaParity.*:CudaTwins.*:CudaDropout.*:GuardedDevice.*:HalfMatMul.*'
# b. Sessions on each device against the CPU (Guarded runs anywhere, Cuda0 needs a GPU).
gtest_step device_session 60 test_training 'Devices/DeviceSession.*'

# c. The device-sensitive suites with every session on the device. Patterns that match nothing are reported, and
# tests whose reference needs a Python package the target lacks are left out, saying so.
positive="${DEVICE_SUITES_FILTER%%-*}"
for pat in ${positive//:/ }; do
  n="$(ot "$root/bin/test_training" --gtest_list_tests --gtest_filter="$pat" 2>/dev/null | grep -c '^  ' || true)"
  [ "$n" != 0 ] || record WARN device_suites "filter pattern '$pat' matches no test"
done
filter="$DEVICE_SUITES_FILTER"
exclude=""
"$py" -c 'import sklearn' 2>/dev/null || exclude+=":Trainer.MetricsMatchScikitLearn:Convergence.*"
"$py" -c 'import onnx' 2>/dev/null || record WARN device_suites "no onnx Python package: tests that write their models with it will fail"
if [ -n "$exclude" ]; then
  record WARN device_suites "no scikit-learn in $TORCH_PYTHON: left out ${exclude#:}"
  if [[ $filter == *-* ]]; then filter+="$exclude"; else filter+="-${exclude#:}"; fi
fi
gtest_step device_suites 150 test_training "$filter" ONNXTRAIN_DEVICE="$DEVICE"

# d. NCCL with a world of one: a communicator, allreduce, broadcast and barrier on device buffers.
if [ $cuda = 1 ]; then gtest_step nccl 60 test_distributed 'Nccl.*'
else record SKIP nccl "needs CUDA"
fi

# e. The digits fine-tune with the CLI on the device against the same run on the CPU: final validation metrics.
digits() {  # tag device -> prints "loss accuracy stopped..." or fails
  local d="$work/digits_$1"
  mkdir -p "$d/data"
  cp "$repo/examples/digits/config.yaml" "$d/"
  cp "$root"/digits/{digits.onnx,train.npz,val.npz} "$d/data/"
  ot timeout -k 10 "$(secs 60)" "$root/bin/onnxtrain" train "$d/config.yaml" --set device="$2" > "$LOG_DIR/digits_$1.log" 2>&1 || return 1
  echo "$(sed -n 's/^validation loss: //p' "$LOG_DIR/digits_$1.log") $(sed -n 's/^validation accuracy: //p' "$LOG_DIR/digits_$1.log")" \
       "$(sed -n 's/^stopped: //p' "$LOG_DIR/digits_$1.log")"
}
t0=$SECONDS
if ! on_cpu="$(digits cpu cpu)"; then record FAIL digits "the CPU run failed: $(tail -1 "$LOG_DIR/digits_cpu.log")"
elif ! on_dev="$(digits device "$DEVICE")"; then record FAIL digits "the $DEVICE run failed: $(tail -1 "$LOG_DIR/digits_device.log")"
else
  read -r lc ac _ <<< "$on_cpu"
  read -r ld_ ad _ <<< "$on_dev"
  detail="cpu: loss $lc accuracy $ac; $DEVICE: loss $ld_ accuracy $ad ($((SECONDS - t0)) s; ${on_dev#* * })"
  if awk -v lc="$lc" -v ac="$ac" -v ld="$ld_" -v ad="$ad" 'BEGIN {
       da = ad - ac; dl = ld - lc; if (da < 0) da = -da; if (dl < 0) dl = -dl; if (lc < 0) lc = -lc
       exit !(lc != "" && ld != "" && da <= 0.01 && dl <= 1e-3 * lc) }'; then record PASS digits "$detail"
  else record FAIL digits "$detail: accuracy may differ by 0.01, loss by 1e-3 relative"
  fi
fi

# f. W1/W3 step times: onnxtrain's bench_train on the device against PyTorch eager on the same device (same
# data, initial weights, batches and optimizer; benchmarks/gpu_torch_peer.py). The losses must agree (the bounds
# of benchmarks/report.py); the speed ratio is reported, never judged.
data="$work/bench-data"
shared="$root/shared/bench"
if ! BENCH_DATA_DIR="$data" timeout "$(secs 90)" "$py" "$shared/peers/bench_data.py" --materialize > "$LOG_DIR/bench_data.log" 2>&1; then
  record FAIL bench "bench_data.py --materialize failed: $(tail -1 "$LOG_DIR/bench_data.log")"
else
  for w in $WORKLOADS; do
    t0=$SECONDS
    if ! ot env ONNXTRAIN_DEVICE="$DEVICE" OMP_NUM_THREADS=1 timeout -k 10 "$(secs 90)" "$root/bin/bench_train" --workload "$w" \
         --models "$shared/models" --data "$data" --threads 1 --repeats "$REPEATS" --losses "$LOG_DIR/onnxtrain_$w.losses.txt" \
         > "$LOG_DIR/onnxtrain_$w.jsonl" 2> "$LOG_DIR/onnxtrain_$w.stderr"; then
      record FAIL "bench_$w" "bench_train failed: $(tail -1 "$LOG_DIR/onnxtrain_$w.stderr")"; continue
    fi
    if ! BENCH_DATA_DIR="$data" timeout -k 10 "$(secs 90)" "$py" "$repo/benchmarks/gpu_torch_peer.py" --workload "$w" \
         --device "$torch_device" --repeats "$REPEATS" --shared "$shared" --losses "$LOG_DIR/torch_$w.losses.txt" \
         > "$LOG_DIR/torch_$w.jsonl" 2> "$LOG_DIR/torch_$w.stderr"; then
      record FAIL "bench_$w" "gpu_torch_peer.py failed: $(tail -1 "$LOG_DIR/torch_$w.stderr")"; continue
    fi
    # One table row; exit status 1 when the losses disagree.
    rc=0
    row="$("$py" - "$w" "$LOG_DIR" "$shared/peers" <<'EOF'
import json, sys
w, logs, peers = sys.argv[1:4]
sys.path.insert(0, peers)
from bench_data import SPEC
FINAL_TOL = {"w1": 2e-2, "w2": 1e-1, "w3": 1e-3, "w4": 1e-3}  # benchmarks/report.py
EARLY_STEPS, EARLY_TOL = 10, 1e-4
def recs(sys_):
    return {r["metric"]: r for r in map(json.loads, open(f"{logs}/{sys_}_{w}.jsonl")) if r.get("workload") == w}
def losses(sys_):
    return [float(x) for x in open(f"{logs}/{sys_}_{w}.losses.txt")]
o, t = recs("onnxtrain"), recs("torch")
def step_ms(r):  # median timed run / steps
    times = sorted(next(v for v in r.values() if "times_s" in v)["times_s"])
    n = len(times)
    return (times[n // 2] if n % 2 else (times[n // 2 - 1] + times[n // 2]) / 2) * 1e3 / SPEC[w]["steps"]
so, st = step_ms(o), step_ms(t)
lo, lt = losses("onnxtrain"), losses("torch")
mean_t = sum(abs(x) for x in lt[:EARLY_STEPS]) / EARLY_STEPS
early = max(abs(a - b) for a, b in zip(lo[:EARLY_STEPS], lt[:EARLY_STEPS])) / mean_t
fo, ft = o["final_train_loss"]["value"], t["final_train_loss"]["value"]
final = abs(fo - ft) / abs(ft)
ok = early <= EARLY_TOL and final <= FINAL_TOL[w]
print(f"step {so:.3f} ms onnxtrain, {st:.3f} ms torch: ratio torch/onnxtrain {st / so:.2f}; "
      f"final loss {fo:.6g} vs {ft:.6g} (rel {final:.1e} <= {FINAL_TOL[w]:.0e}), first {EARLY_STEPS} steps rel {early:.1e} <= {EARLY_TOL:.0e}")
sys.exit(0 if ok else 1)
EOF
)" || rc=$?
    if [ $rc = 0 ]; then record PASS "bench_$w" "$row ($((SECONDS - t0)) s)"
    else record FAIL "bench_$w" "${row:-comparison failed (see $LOG_DIR)}: losses disagree"
    fi
  done
fi

echo
echo "== summary ($DEVICE, $((SECONDS - start)) s; logs in $LOG_DIR)"
printf '%s\n' "${results[@]}"
if [ $failed = 1 ]; then echo "gpu_check: FAILED"; exit 1; fi
echo "gpu_check: all steps passed or skipped"
