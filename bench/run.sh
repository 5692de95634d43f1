#!/usr/bin/env bash
# The benchmark suite, one command: this pack against plain diffusers, side by side in the same run.
#   bash bench/run.sh [--quick] [--figures comfyui,handback,cold_start,data_parallel,compile,mfu] [--repeats N]
#                     [--soak N] [--out DIR]          (--help for all options)
# Uses the cached environment of scripts/bootstrap.sh (venv + real ComfyUI), like scripts/test.sh.
# Prints a table; writes bench/results/<device>-<date>.json.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
eval "$(bash scripts/bootstrap.sh)"
export COMFYUI_DIR HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# One torch thread per process, ours and the baseline's alike (--threads N changes both).
threads=1
for ((i = 1; i <= $#; i++)); do
  case "${!i}" in
    --threads) j=$((i + 1)); threads="${!j}" ;;
    --threads=*) threads="${!i#--threads=}" ;;
  esac
done
export OMP_NUM_THREADS="$threads" COMFYUI_TPU_WORKER_THREADS="$threads"
exec "$VENV/bin/python" -m bench "$@"
