#!/usr/bin/env bash
# The main job on a fresh machine: build the environment (cached), start a real ComfyUI headless with this pack,
# run workflows/api/tiny_demo.json (or --workflow FILE) and print the path of each PNG it wrote.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
eval "$(bash scripts/bootstrap.sh)"
export COMFYUI_DIR HF_HUB_OFFLINE=1
exec "$VENV/bin/python" scripts/demo.py "$@"
