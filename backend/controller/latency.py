"""Where the last Sample's time went, kept for the node's text and Device Info: group start (controller), each
phase of the slowest replica (workers: load, text encoding, denoising, VAE), the hand-back of the images
(worker send → here), and the prompt's wait in ComfyUI's queue (the node's share)."""

from __future__ import annotations

import threading

_lock = threading.Lock()
_last: dict | None = None


def record(results: list, start_s: float, received: float, total_s: float) -> None:
    """The report of the Sample whose workers answered with `results` (received at `received`, time.time())."""
    global _last
    sent = [r for r in results if "images" in r.arrays and "latency" in r.value]
    phases = {k: max(r.value["latency"][k] for r in sent) for k in sent[0].value["latency"]} if sent else {}
    handback = max((received - r.value["sent_at"] for r in sent), default=0.0)
    with _lock:
        _last = {"start_s": round(start_s, 4), **phases, "handback_s": round(max(0.0, handback), 4),
                 "total_s": round(total_s, 4)}


def record_queue_wait(seconds: float) -> None:
    """How long the last Sample's prompt waited in ComfyUI's queue (and for the nodes before Sample)."""
    with _lock:
        if _last is not None:
            _last["queue_s"] = round(max(0.0, seconds), 4)


def last() -> dict | None:
    """A copy of the last report, in seconds (None before the first Sample): start_s, load_s, text_s, denoise_s,
    vae_s, handback_s, total_s (the whole api.sample) and, from the node, queue_s."""
    with _lock:
        return None if _last is None else dict(_last)
