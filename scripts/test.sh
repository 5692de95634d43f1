#!/usr/bin/env bash
# Runs the whole test suite on a fresh machine: builds the environment (cached), lints, then pytest.
# Extra arguments go to pytest (e.g. scripts/test.sh -k backend).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
eval "$(bash scripts/bootstrap.sh)"
export COMFYUI_DIR TPU_VENV HF_HUB_OFFLINE=1
"$VENV/bin/python" scripts/sync_requirements.py --check
"$VENV/bin/ruff" check .
exec "$VENV/bin/python" -m pytest -p no:cacheprovider "$@"
