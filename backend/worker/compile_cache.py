"""The persistent compile cache: one folder, stamped with the versions that make its contents valid.

`prepare_cache_env` runs at worker start, before torch loads and the device starts (inductor and TorchTPU read
their cache folders once): it points both at one folder and renews it when the manifest names other versions.
The controller only chooses the folder (settings.COMPILE_CACHE); ComfyUI's nodes put it in ComfyUI's user folder.
"""

from __future__ import annotations

import fcntl
import importlib.metadata
import json
import logging
import os
import platform
import shutil
import time
from pathlib import Path
from typing import Any

from ..protocol import settings

log = logging.getLogger("comfyui_tpu")

DEFAULT_CACHE = "~/.cache/comfyui-tpu/compile"
MANIFEST = "manifest.json"
_CACHE_SUBDIRS = ("inductor", "tpu")  # the only folders a renewal deletes (the root may be shared)


def compile_cache_env(root: str) -> dict[str, str]:
    """Environment that puts the persistent compile caches under `root` (read when the device starts)."""
    return {
        "TORCHINDUCTOR_CACHE_DIR": os.path.join(root, "inductor"),  # FX graph + AOT autograd caches (CPU, CUDA)
        "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
        "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT": os.path.join(root, "tpu"),  # TorchTPU's on-disk executables
    }


CACHE_INFO: dict[str, Any] = {"dir": None, "status": "not set up"}


def versions() -> dict[str, str]:
    """What a compiled artifact depends on; read from package metadata (nothing is imported)."""
    out = {"python": platform.python_version()}
    for dist in ("torch", "torch_tpu", "libtpu", "diffusers"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def prepare_cache_env(environ: dict | os._Environ = os.environ, root: str | None = None) -> dict[str, Any]:
    """Points the compile caches at `root` (default: $COMFYUI_TPU_COMPILE_CACHE, else ~/.cache/comfyui-tpu/compile)
    after checking its manifest. Call before torch loads and before the device starts. Never raises: a folder
    that cannot be used leaves the libraries' own defaults in place and says why."""
    path = Path(root or settings.COMPILE_CACHE.raw(environ) or DEFAULT_CACHE).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
        with open(path / ".lock", "a") as lock:  # ranks of one group start together: one checks at a time
            fcntl.flock(lock, fcntl.LOCK_EX)
            status = _check_manifest(path)
        for sub in _CACHE_SUBDIRS:
            (path / sub).mkdir(exist_ok=True)
    except OSError as e:
        status = f"disabled: the folder cannot be used ({e}); compiled graphs are not kept across restarts"
        log.warning("comfyui-tpu: compile cache %s %s", path, status)
        CACHE_INFO.update(dir=str(path), status=status)
        return dict(CACHE_INFO)
    environ.update(compile_cache_env(str(path)))
    CACHE_INFO.update(dir=str(path), status=status)
    return dict(CACHE_INFO)


def _check_manifest(path: Path) -> str:
    """'new', 'reused', or 'renewed (reason)' after deleting caches built by other versions."""
    want = versions()
    manifest = path / MANIFEST
    reason = None
    if manifest.exists():
        try:
            have = json.loads(manifest.read_text())
            have = {k: have.get(k) for k in want}
        except (OSError, ValueError) as e:
            reason = f"its manifest is unreadable ({type(e).__name__})"
        else:
            changed = [f"{k} {have[k]} → {want[k]}" for k in want if have[k] != want[k]]
            if not changed:
                return "reused"
            reason = "built with other versions: " + ", ".join(changed)
    elif any((path / sub).exists() for sub in _CACHE_SUBDIRS):
        reason = "it has no manifest"
    if reason:
        log.warning("comfyui-tpu: compile cache %s is stale (%s); starting a fresh one.", path, reason)
        for sub in _CACHE_SUBDIRS:
            shutil.rmtree(path / sub, ignore_errors=True)
    tmp = path / f".{MANIFEST}.{os.getpid()}"
    tmp.write_text(json.dumps({**want, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}, indent=1))
    os.replace(tmp, manifest)
    return f"renewed ({reason})" if reason else "new"
