#!/usr/bin/env bash
# One Wan video on this host's chips, timed: the figure to compare with the published TPU numbers.
#   bash bench/wan.sh --model PATH/Wan2.2-T2V-A14B-Diffusers [--steps 40] [--frames 81] [--width 1280 --height 720]
#                     [--layout cfg+cp|cp|one] [--mode compiled|eager] [--out result.json]   (--help for all)
# Uses the cached environment of scripts/bootstrap.sh, like bench/run.sh. Not yet run on a TPU.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
eval "$(bash scripts/bootstrap.sh)"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec "$VENV/bin/python" -m bench.wan_timing "$@"
