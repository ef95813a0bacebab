#!/usr/bin/env bash
# Packs what scripts/gpu_check.sh needs on a GPU machine that has none of this machine's libraries: stripped copies
# of the test, CLI and benchmark binaries of an existing build, every shared library they load except glibc,
# libstdc++/libgcc_s (the target's are newer) and the CUDA/cuBLAS/cuDNN/NCCL ones (the target has them as PyTorch's
# pip wheels), the digits example data, the shared benchmark models and peer scripts, and the onnx Python package
# for CPython 3.12 (tests generate their models with it). Writes one archive, gpu-bundle/bundle.tar.xz (git-ignored;
# carry it with the checkout), and prints its size.
#
#   bash scripts/gpu_bundle.sh          (after a build: BUILD_DIR, default build/release; builds nothing)
#
# Knobs: BUILD_DIR, SHARED_BENCH (default ../shared/bench), PY_WHEELS=0 (leave out the onnx package; otherwise it
# is downloaded once with pip into build/gpu-bundle-cache), XZ_PRESET (default 9; 6 is faster, larger).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$(cd "${BUILD_DIR:-$repo/build/release}" && pwd)"
shared="${SHARED_BENCH:-$repo/../shared/bench}"
venv_py="$repo/.venv/bin/python"
out="$repo/gpu-bundle"
cache="$repo/build/gpu-bundle-cache"
log() { printf '[gpu_bundle] %s\n' "$*" >&2; }

# Binary in the build tree -> name in the bundle; test_distributed (NCCL test) only where MPI was found.
bins=(tests/test_executor tests/test_training cli/onnxtrain benchmarks/bench_train tests/distributed/test_distributed)
# Not bundled: the glibc family and the GCC runtime (Ubuntu 24.04's are newer than Debian 12's, which this build
# needs; checked below), and the NVIDIA libraries the target loads from its wheels (and the driver's libcuda).
system_re='^(linux-vdso|ld-linux|libc\.so|libm\.so|libmvec|libdl\.so|libpthread|librt\.so|libresolv|libutil|libanl|libnsl|libstdc\+\+|libgcc_s)'
nvidia_re='^lib(cuda|cudart|cublas|cublasLt|cudnn[a-z_]*|nccl|nvrtc[a-z-]*|nvJitLink|cusparse|cufft|curand|cusolver|nvToolsExt|cupti)\.so'

stage="$(mktemp -d "${TMPDIR:-/tmp}/gpu-bundle.XXXXXX")"
trap 'rm -rf "$stage"' EXIT
root="$stage/onnxtrain-gpu"
mkdir -p "$root/bin" "$root/lib" "$root/digits" "$root/shared/bench/peers" "$root/shared/bench/models"

declare -A libs=() nvidia=()
for b in "${bins[@]}"; do
  if [ ! -x "$build/$b" ]; then
    [ "$b" = tests/distributed/test_distributed ] && { log "no $b (built without MPI?): the NCCL step will skip"; continue; }
    echo "gpu_bundle.sh: $build/$b is missing; build first (scripts/build.sh)" >&2; exit 1
  fi
  strip --strip-unneeded -o "$root/bin/$(basename "$b")" "$build/$b"
  while read -r name path; do
    if [[ $name =~ $nvidia_re ]]; then nvidia[$name]=1
    elif [[ $name =~ $system_re ]]; then :
    elif [ "$path" = "not" ]; then echo "gpu_bundle.sh: $b needs $name, which ldd cannot find here" >&2; exit 1
    else libs[$name]="$path"
    fi
  done < <(ldd "$build/$b" | awk '$2 == "=>" {print $1, $3}')
done
for name in "${!libs[@]}"; do strip --strip-unneeded -o "$root/lib/$name" "$(readlink -f "${libs[$name]}")"; done
log "binaries: $(ls "$root/bin" | tr '\n' ' ')"
log "bundled libraries (${#libs[@]}): $(printf '%s\n' "${!libs[@]}" | sort | tr '\n' ' ')"

# The newest libstdc++ symbol version anything bundled needs: Ubuntu 24.04 (GCC 14) provides up to GLIBCXX_3.4.33.
glibcxx="$(objdump -T "$root"/bin/* "$root"/lib/* 2>/dev/null | grep -o 'GLIBCXX_3\.4\.[0-9]*' | sort -t. -k3 -n -u | tail -1)"
glibc="$(objdump -T "$root"/bin/* "$root"/lib/* 2>/dev/null | grep -o 'GLIBC_2\.[0-9]*' | sort -t. -k2 -n -u | tail -1)"
log "needs at most $glibcxx and $glibc from the target (Ubuntu 24.04: GLIBCXX_3.4.33, GLIBC_2.39)"

# The digits example (scikit-learn here; the target has none) and the shared benchmark's models and the peer
# modules gpu_torch_peer.py imports. The benchmark data is regenerated there with numpy (bench_data.py).
"$venv_py" "$repo/examples/digits/make_digits.py" "$root/digits" >&2
cp "$shared"/peers/{bench_data.py,models.py,common.py,torch_harness.py,data_checksums.json} "$root/shared/bench/peers/"
cp "$shared"/models/{manifest.json,w1.onnx,w1.init.npz,w2.onnx,w2.init.npz,w3.onnx,w3.init.npz,w4.onnx,w4.init.npz} \
   "$root/shared/bench/models/"

# onnx (and protobuf) for CPython 3.12, in case the target's Python lacks it; its backend test data is left out.
if [ "${PY_WHEELS:-1}" = 1 ]; then
  mkdir -p "$cache/wheels"
  if ls "$cache"/wheels/onnx-*.whl >/dev/null 2>&1 ||
     "$venv_py" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
       --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 "onnx==1.17.0" "protobuf>=4.25,<6" \
       -d "$cache/wheels" >&2; then
    mkdir -p "$root/py"
    for w in "$cache"/wheels/*.whl; do "$venv_py" -m zipfile -e "$w" "$root/py"; done
    rm -rf "$root/py/onnx/backend/test/data"
  else
    log "could not download the onnx wheel: left out (gpu_check.sh then needs onnx in the target's Python)"
  fi
fi

{
  echo "commit=$(git -C "$repo" rev-parse --short HEAD)$(git -C "$repo" diff --quiet HEAD -- . 2>/dev/null || echo +dirty)"
  echo "made=$(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
  echo "build=$build"
  # Compiled into the test binaries; tests that call the Python directly (not through test_env.cpp) need it.
  echo "compiled_python=$repo/.venv/bin/python"
  echo "compiled_source_dir=$repo"
  echo "cuda_toolkit=$(/usr/local/cuda/bin/nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
  echo "nvidia_libs=$(printf '%s\n' "${!nvidia[@]}" | sort | tr '\n' ' ')"
} > "$root/BUNDLE_INFO"

mkdir -p "$out"
rm -f "$out/bundle.tar.xz"
# One xz stream with a dictionary larger than the binaries: they share most of their code and CUDA fatbins, so
# the later ones compress to little. Single-threaded, like the build, to keep this machine's two cores usable.
tar -C "$stage" -cf - onnxtrain-gpu | xz --lzma2=preset="${XZ_PRESET:-9}",dict=192MiB -T1 > "$out/bundle.tar.xz"
log "uncompressed: $(du -sh "$root" | cut -f1)"
echo "wrote $out/bundle.tar.xz ($(du -m "$out/bundle.tar.xz" | cut -f1) MiB; $(stat -c %s "$out/bundle.tar.xz") bytes)"
