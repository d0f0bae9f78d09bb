#!/usr/bin/env bash
# Install x1_pretrain into the current Python without ever replacing its torch (or flash-attn, triton, numpy).
#
#   bash deploy/install.sh            # from the x1 checkout; used by deploy/Dockerfile and deploy/skypilot.yaml
#
# Why not a plain `pip install .`: the NVIDIA container's torch is 2.5.0a0+e000cf0ad9 (a pre-release build
# of 2.5), which does not satisfy `torch>=2.5`, so pip would download a PyPI torch over it and break
# flash-attn's ABI. So x1 itself goes in with --no-deps, and its other requirements (none of which needs
# torch) are installed under a constraints file that pins the container's GPU stack at its versions.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
py="${PYTHON:-python}"

constraints="$(mktemp)"
requirements="$(mktemp)"
trap 'rm -f "$constraints" "$requirements"' EXIT

"$py" -m pip list --format=freeze 2>/dev/null \
  | grep -iE '^(torch|torchvision|torchaudio|triton|pytorch-triton|flash[-_]attn|transformer[-_]engine|apex|numpy|nvidia-[a-z0-9-]+)==' \
  > "$constraints" || true
if ! grep -qi '^torch==' "$constraints"; then
  echo "error: no torch in $("$py" -c 'import sys; print(sys.executable)'); this script keeps an existing torch." >&2
  echo "       Inside nvcr.io/nvidia/pytorch:24.10-py3 it is there; elsewhere install torch first (pip install torch)." >&2
  exit 2
fi
echo "[install] keeping: $(tr '\n' ' ' < "$constraints")"

"$py" -m pip install --no-deps .
# x1's own requirements from its installed metadata, minus torch (kept as it is) and the extras
"$py" - > "$requirements" <<'PY'
import importlib.metadata as md
import re

for req in md.requires("x1_pretrain") or []:
    if "extra ==" not in req and not re.match(r"torch\b", req):
        print(req)
PY
extra=()
[[ -n "${PIP_CONSTRAINT:-}" ]] && extra+=(-c "$PIP_CONSTRAINT")  # the container's own pins, if it sets them
"$py" -m pip install -c "$constraints" "${extra[@]}" -r "$requirements"
# `hf`/`huggingface-cli` for the data download; <1.0 keeps the lab's `huggingface-cli` command
"$py" -m pip install -c "$constraints" "${extra[@]}" "huggingface_hub>=0.24,<1.0"

"$py" - <<'PY'
import torch

import x1_pretrain
from x1_pretrain.model import flash_available

print(f"[install] x1_pretrain {x1_pretrain.__version__} with torch {torch.__version__} "
      f"(CUDA {torch.version.cuda}); flash-attn importable: {flash_available()}")
PY
