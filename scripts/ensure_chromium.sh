#!/usr/bin/env bash
# Makes sure a headless Chromium is present for the frontend tests and the screenshots (scripts/frontend.py):
# Debian's chromium-headless-shell from apt (about 17 s the first time), never a browser download of its own.
# Prints the browser's path on stdout, or nothing when none can be installed (then says why on stderr and the
# frontend tests skip). Always exits 0. $COMFYUI_TPU_CHROMIUM, if set, names the browser to use.
set -uo pipefail
log() { echo "[ensure_chromium] $*" >&2; }
found() {
  if [ -n "${COMFYUI_TPU_CHROMIUM:-}" ]; then
    [ -x "$COMFYUI_TPU_CHROMIUM" ] && echo "$COMFYUI_TPU_CHROMIUM" && return 0
    log "COMFYUI_TPU_CHROMIUM=$COMFYUI_TPU_CHROMIUM is not an executable"; return 1
  fi
  for name in chromium-headless-shell chromium chromium-browser; do
    command -v "$name" && return 0
  done
  return 1
}
found && exit 0
[ -n "${COMFYUI_TPU_CHROMIUM:-}" ] && exit 0
if ! command -v apt-get >/dev/null; then
  log "no Chromium and no apt-get: install Chromium and set COMFYUI_TPU_CHROMIUM; frontend tests will skip"
  exit 0
fi
SUDO=()
if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then SUDO=(sudo -n); else
    log "no Chromium, and installing it needs root (apt-get install chromium-headless-shell); frontend tests will skip"
    exit 0
  fi
fi
PKGS=(chromium-headless-shell fonts-dejavu-core)
install() { "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" >&2; }
log "installing Debian's ${PKGS[*]}"
if ! install "${PKGS[@]}"; then
  "${SUDO[@]}" apt-get update -q >&2 && install "${PKGS[@]}" || install chromium fonts-dejavu-core \
    || log "apt-get could not install Chromium; frontend tests will skip"
fi
found || true
exit 0
