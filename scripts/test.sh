#!/usr/bin/env bash
# Runs the whole test suite on a fresh machine: builds the environment (cached), lints, then pytest.
# Extra arguments go to pytest (e.g. scripts/test.sh -k backend). With none it runs every test (what CI runs).
# Test tiers (markers, each test has one; see pyproject.toml):
#   bash scripts/test.sh -m unit              the daily loop: in-process checks, under a minute (below)
#   bash scripts/test.sh -m "unit or pipelines"  plus in-process runs of whole tiny pipelines, tiny-model builds
#                                             and ComfyUI-file conversions (a fresh clone builds the files first)
#   bash scripts/test.sh -m "unit or pipelines or workers"  plus worker processes (no ComfyUI server)
#   bash scripts/test.sh -m "not soak"        everything but the long soak run
# Other tiers: workers (other processes), server (a real ComfyUI), frontend (ComfyUI's web UI in headless
# Chromium), soak. A unit test may not use comfyui_files (tests/conftest.py says so at collection).
# The tests run on one xdist worker per CPU core (-n auto --dist loadgroup): each module's tests on one worker,
# the tests of the one shared ComfyUI server and browser together on one (tests/xdist_groups.py); the unit tier
# too. `-n 0` (or any -n) as an extra argument overrides it. The unit tier (309 tests) measured on a 2-core
# machine while other jobs used about one of its cores: -n 2 35 s (37 s of CPU), 38 s on a fresh clone (41 s of
# CPU: the tiny models are built first); -n 0 27 s of CPU, 29 s on a fresh clone.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
eval "$(bash scripts/bootstrap.sh)"
# Debian's headless Chromium for the tests that load workflows in the real ComfyUI frontend (they skip without it)
COMFYUI_TPU_CHROMIUM="$(bash scripts/ensure_chromium.sh)"
# one torch thread per process, xdist workers included: on 2 cores more threads make tiny models far slower
export COMFYUI_DIR TPU_VENV HF_HUB_OFFLINE=1 COMFYUI_TPU_CHROMIUM OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
"$VENV/bin/python" scripts/sync_requirements.py --check
"$VENV/bin/ruff" check .
exec "$VENV/bin/python" -m pytest -p no:cacheprovider --durations=25 -n auto --dist loadgroup "$@"
