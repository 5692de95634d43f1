"""Warm start (COMFYUI_TPU_WARM_START=1): this host's worker group (device auto, one worker) starts in the
background while ComfyUI starts, so the first prompt only loads weights."""

from __future__ import annotations

import logging
import threading
import time

from ..protocol import settings
from ..protocol.spec import GroupConfig
from . import devices, group

log = logging.getLogger("comfyui_tpu")


def enabled() -> bool:
    return settings.WARM_START.on()


def start() -> threading.Thread | None:
    """Starts the group in a thread when enabled; never blocks the caller (ComfyUI's start) and never raises:
    errors are logged. A prompt that arrives meanwhile waits for the start and uses the group (or replaces it,
    if it wants another)."""
    if not enabled():
        return None

    def run() -> None:
        try:
            kind = devices.resolve_kind("auto")
            t0 = time.perf_counter()
            group.get_group(GroupConfig(kind=kind, world_size=1))
            log.info("comfyui-tpu: warm start: a %s worker is ready (%.1f s)", kind, time.perf_counter() - t0)
        except Exception as e:  # logged, never raised: ComfyUI runs on, the first prompt starts the group itself
            log.error("comfyui-tpu: warm start failed: %s", e)

    thread = threading.Thread(target=run, daemon=True, name="comfyui-tpu-warm-start")
    thread.start()
    return thread
