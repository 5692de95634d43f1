#!/usr/bin/env bash
# Runs the whole test suite on a fresh machine: builds the environment (cached), lints, then pytest.
# Extra arguments go to pytest (e.g. scripts/test.sh -k backend).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
eval "$(bash scripts/bootstrap.sh)"
# Debian's headless Chromium for the tests that load workflows in the real ComfyUI frontend (they skip without it)
COMFYUI_TPU_CHROMIUM="$(bash scripts/ensure_chromium.sh)"
export COMFYUI_DIR TPU_VENV HF_HUB_OFFLINE=1 COMFYUI_TPU_CHROMIUM
"$VENV/bin/python" scripts/sync_requirements.py --check
"$VENV/bin/ruff" check .
exec "$VENV/bin/python" -m pytest -p no:cacheprovider "$@"
