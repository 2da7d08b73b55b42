#!/usr/bin/env bash
# NIXL's VRAM path on a lent GPU machine: kv_transfer/bench (device->device and device->host
# READs against memcpy) plus `python -m cluster.doctor report`, in one call.
#
# That machine has PyTorch (python3 3.12, torch 2.11+cu130 as last seen) but neither vLLM nor
# Ray, and reaches no registry: the NIXL wheels travel with the call (nixl-cu13 for cp312 is
# 56 MiB, under the 64 MiB a call carries). The bench itself needs only torch and NIXL; its plot
# needs matplotlib (there as last seen; without it the JSON alone is written).
#
# 1. Here, once (downloads the wheels into .cache/device-wheels/, ignored by git):
#      bash tests/gpu/device_nixl_bench.sh --prepare [PYTHON_VERSION=3.12] [CUDA_MAJOR=13]
# 2. One device call (about 2-4 minutes of device time; the results come back from $OUT):
#      run(command="bash tests/gpu/device_nixl_bench.sh", carry=[".cache/device-wheels"], timeout_s=480)
#    It writes $OUT/doctor.txt, $OUT/nixl_vram.json (+ .png) and $OUT/log.txt, and exits 0 when
#    every transfer was verified, 1 when not, 3 when the carried wheel does not fit the machine
#    (the log says which Python / CUDA it found: prepare again for those).
set -euo pipefail
cd "$(dirname "$0")/../.."  # repository root
WHEELS=.cache/device-wheels  # .gitignore'd (.cache/), so `carry` can take it
NIXL_VERSION=1.5.1

if [ "${1:-}" = --prepare ]; then
  PYVER=${2:-3.12}
  CUDA_MAJOR=${3:-13}
  rm -rf "$WHEELS" && mkdir -p "$WHEELS"
  python3 -m pip download --no-deps --only-binary=:all: --python-version "$PYVER" \
    --platform manylinux_2_28_x86_64 -d "$WHEELS" "nixl-cu$CUDA_MAJOR==$NIXL_VERSION" "nixl==$NIXL_VERSION"
  du -sh "$WHEELS"; ls "$WHEELS"
  exit 0
fi

OUT=${OUT:-/tmp/device-nixl-out}
# DEVICE=cpu and BENCH_ARGS="--sizes-mib 1 4 --block-mib 1 --repeats 1" try the plumbing here.
DEVICE=${DEVICE:-cuda}
read -r -a BENCH_ARGS <<< "${BENCH_ARGS:-}"
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
export PYTHONUNBUFFERED=1
PY=${PY:-python3}

nvidia-smi -L || true
"$PY" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__,
  "cuda", torch.version.cuda, "gpu", torch.cuda.is_available() and torch.cuda.get_device_name())'

# The wheel must match this python and torch's CUDA (the choice bootstrap.sh makes).
want=$(PYTHONPATH=$PWD "$PY" -m cluster.doctor nixl-package | tr - _)
tag=$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
wheel=$(ls "$WHEELS"/"${want}-${NIXL_VERSION}-${tag}-"*.whl 2>/dev/null | head -1 || true)
if [ -z "$wheel" ]; then
  echo "no ${want} wheel for ${tag} in $WHEELS (have: $(ls "$WHEELS" 2>/dev/null | tr '\n' ' ')):"
  echo "run here: bash tests/gpu/device_nixl_bench.sh --prepare <python X.Y> <CUDA major>"
  exit 3
fi

# Into a folder of its own on PYTHONPATH: the machine's packages stay as they are.
SITE=$(mktemp -d /tmp/nixl-site.XXXXXX)
"$PY" -m pip install --no-index --no-deps --quiet --target "$SITE" "$wheel" "$WHEELS"/nixl-"$NIXL_VERSION"-py3-none-any.whl
export PYTHONPATH="$PWD:$SITE"

"$PY" -m cluster.doctor report | tee "$OUT/doctor.txt" || true  # exit 1 = problems (no vLLM/Ray here)

# The benchmark, as kv_transfer/README.md runs it on GPUs (the plot only where matplotlib imports).
timeout 420 "$PY" tests/gpu/nixl_vram_bench.py "$DEVICE" "$OUT/nixl_vram.json" ${BENCH_ARGS[@]+"${BENCH_ARGS[@]}"}
