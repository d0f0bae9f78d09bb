#!/usr/bin/env bash
# One-shot GPU check before (or at the start of) a paid run; see bench/gpu_check.py for what it measures.
#
#   bash bench/gpu_check.sh [OUT.md] [gpu_check.py options, e.g. --ab-data /workspace/data/tokenized]
#
# The report goes to OUT.md (and OUT.json beside it), else to $OUT/gpu_check.md when $OUT is a directory (or
# to $OUT itself when it names a file), and always to stdout. On one H100/H200 it finishes within 9 minutes:
# the phases share a 500 s budget, each with its own deadline, and this wrapper kills everything at 525 s
# (535 s with the grace period). Exit 0 when every phase passed, 1 otherwise (also when nvidia-smi sees a GPU
# that torch cannot use). Without any GPU it says so and runs every phase as a CPU smoke test.
# Python: $PYTHON, else the checkout's .venv, else python3 (the NVIDIA container's).
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
py="${PYTHON:-}"
if [[ -z "$py" ]]; then
  if [[ -x "$repo/.venv/bin/python" ]]; then py="$repo/.venv/bin/python"; else py="$(command -v python3 || command -v python)"; fi
fi

out=""
if [[ $# -gt 0 && "$1" != --* ]]; then out="$1"; shift; fi
if [[ -z "$out" && -n "${OUT:-}" ]]; then
  if [[ -d "$OUT" ]]; then out="$OUT/gpu_check.md"; else out="$OUT"; fi
fi

# a checkout that was never pip-installed still works
export PYTHONPATH="$repo/src${PYTHONPATH:+:$PYTHONPATH}"

echo "[gpu_check] $(date -u +%Y-%m-%dT%H:%M:%SZ) python: $py"
if command -v nvidia-smi >/dev/null 2>&1; then
  timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total,utilization.gpu,temperature.gpu,power.limit,clocks.sm,clocks.max.sm \
    --format=csv 2>&1 || echo "[gpu_check] nvidia-smi failed (driver problem?)"
else
  echo "[gpu_check] nvidia-smi not found: no NVIDIA driver on this machine"
fi

args=(--deadline-s 500)
[[ -n "$out" ]] && args+=(--out "$out")
timeout --kill-after=10 525 "$py" "$here/gpu_check.py" "${args[@]}" "$@"
code=$?
if [[ $code -eq 124 || $code -eq 137 ]]; then
  echo "[gpu_check] stopped at the 525 s cap; the report so far is in ${out:-(no file)}" >&2
fi
exit $code
