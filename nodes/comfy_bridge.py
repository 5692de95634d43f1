"""The few ComfyUI facilities the nodes use: model folders, progress, text next to a node, interrupt."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import comfy.model_management
import comfy.utils
import folder_paths

from ..backend.protocol.errors import Interrupted
from ..backend.protocol.messages import Status, Step

T = TypeVar("T")


def diffusers_roots() -> list[str]:
    """ComfyUI's diffusers model folders (models/diffusers plus extra_model_paths entries)."""
    try:
        return list(folder_paths.get_folder_paths("diffusers"))
    except Exception:
        return []


def file_roots() -> dict[str, list[str]]:
    """ComfyUI's folders per role of a model file (checkpoints; diffusion_models and unet; text_encoders and
    clip; vae; clip_vision), extra_model_paths.yaml entries included."""
    from ..backend.controller.files.listing import ROLE_FOLDERS

    roots = {}
    for role, folder in ROLE_FOLDERS.items():
        try:
            roots[role] = list(folder_paths.get_folder_paths(folder))
        except Exception:
            roots[role] = []
    return roots


def safetensors_files(folder: str) -> list[str]:
    """The .safetensors files in one of ComfyUI's model folders ("loras", "style_models", "clip_vision": models/...
    plus extra_model_paths entries), as ComfyUI names them (relative paths). Pickle files are not listed: they
    can run code when loaded."""
    try:
        return [name for name in folder_paths.get_filename_list(folder) if name.endswith(".safetensors")]
    except Exception:
        return []


def folder_file(folder: str, name: str) -> str:
    """The full path of a file picked from that folder's list ('' when ComfyUI does not know it)."""
    try:
        return folder_paths.get_full_path(folder, name) or ""
    except Exception:
        return ""


def lora_files() -> list[str]:
    """The .safetensors files in ComfyUI's loras folders."""
    return safetensors_files("loras")


def lora_path(name: str) -> str:
    """The full path of a file picked from the loras list ('' when ComfyUI does not know it)."""
    return folder_file("loras", name)


def controlnet_names() -> list[str]:
    """What ComfyUI's controlnet folders (models/controlnet plus extra_model_paths entries) hold that Apply
    ControlNet reads: diffusers folders (a config.json beside the weights), then the .safetensors files outside
    them, as ComfyUI names files (relative paths)."""
    from pathlib import Path

    try:
        roots = [Path(r) for r in folder_paths.get_folder_paths("controlnet")]
        files = [name for name in folder_paths.get_filename_list("controlnet") if name.endswith(".safetensors")]
    except Exception:
        return []
    folders = sorted({c.parent.relative_to(r).as_posix() for r in roots if r.is_dir()
                      for c in r.glob("**/config.json") if c.parent != r})
    inside = tuple(f"{f}/" for f in folders)
    return folders + [name for name in files if not name.startswith(inside)]


def controlnet_path(name: str) -> str:
    """The full path of a ControlNet file or folder picked from that list ('' when there is none)."""
    if path := folder_paths.get_full_path("controlnet", name):
        return path
    try:
        roots = folder_paths.get_folder_paths("controlnet")
    except Exception:
        return ""
    return next((os.path.join(r, name) for r in roots if os.path.isfile(os.path.join(r, name, "config.json"))), "")


def compile_cache_dir() -> str:
    """Where compiled graphs are kept across restarts: a folder in ComfyUI's user directory."""
    return os.path.join(folder_paths.get_user_directory(), "comfyui-tpu", "compile-cache")


def conditioning_arrays(conditioning: Any) -> list | None:
    """ComfyUI's CONDITIONING ([[tensor, dict], ...]) with its tensors as float32 numpy arrays on the CPU (bfloat16
    has no numpy type), for the controller to check and send (backend/controller/conditioning.py)."""
    import torch

    def plain(value: Any) -> Any:
        return value.detach().float().cpu().numpy() if isinstance(value, torch.Tensor) else value

    if conditioning is None:
        return None
    return [[plain(cond), {k: plain(v) for k, v in extras.items()}] if isinstance(extras, dict) else [cond, extras]
            for cond, extras in conditioning]


def send_text(node_id: str | None, text: str) -> None:
    """Shows `text` next to the node in the UI (ComfyUI's progress-text channel)."""
    if node_id is None:
        return
    try:
        from server import PromptServer

        PromptServer.instance.send_progress_text(text, node_id)
    except Exception:
        pass


def progress_reporter(node_id: str | None, total: int, after: str = "") -> Callable[[Status | Step], None]:
    """Turns worker progress messages into ComfyUI's progress bar plus 's/step, ETA' text (the ETA counts the
    steps; `after` names what comes after them, e.g. a video's VAE decode).

    Seconds per step come from the workers' own step times, so starting, loading and compiling do not count
    as steps (the first step of each image, which holds text encoding and any compile, counts only until a
    later step is timed). The progress bar's hook raises ComfyUI's interrupt exception when the user presses
    Cancel; the backend catches it, stops every rank at its next step and re-raises it.
    """
    bar = comfy.utils.ProgressBar(total)
    step_times: list[float] = []

    def on_progress(msg: Status | Step) -> None:
        if isinstance(msg, Step):
            step_times.append(msg.step_s)
            later = step_times[1:] or step_times
            per_step = sorted(later)[len(later) // 2]  # the median: one slow first step does not skew it
            bar.update_absolute(msg.step, msg.total)
            send_text(node_id, f"step {msg.step}/{msg.total} · {per_step:.2f} s/step · ETA "
                               f"{per_step * (msg.total - msg.step):.0f} s{after}")
        elif msg.text:
            send_text(node_id, msg.text)

    return on_progress


def treat_sigterm_as_ctrl_c() -> None:
    """ComfyUI exits cleanly on Ctrl+C (KeyboardInterrupt), so the pack's exit hook stops the workers, but it
    leaves SIGTERM (systemd, `docker stop`, `kill`) at Python's default, which ends the process on the spot.
    Where nothing else has claimed SIGTERM, it is handled like Ctrl+C. Signal handlers can only be set from
    the main thread, where ComfyUI imports custom nodes."""
    import signal
    import threading

    main = threading.current_thread() is threading.main_thread()
    if main and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, signal.default_int_handler)


def run_cancellable(call: Callable[..., T], *args: Any, node_id: str | None, total: int, after: str = "") -> T:
    """`call(*args, on_progress, should_interrupt)` (api.load, api.run_sample, api.sample) with ComfyUI's progress bar and text
    for `node_id` (`total` steps). Cancel stops the workers at their next step and ends the prompt the way
    ComfyUI expects, with its interrupt exception."""
    try:
        return call(*args, progress_reporter(node_id, total, after), comfy.model_management.processing_interrupted)
    except Interrupted as e:
        if str(e) != Interrupted.DEFAULT:  # more than "interrupted": e.g. which rank did not stop
            send_text(node_id, str(e))
        raise comfy.model_management.InterruptProcessingException() from None


def queued_at() -> float | None:
    """When ComfyUI queued the prompt that runs now (its `create_time`), as time.time(); None if unknown."""
    try:
        from server import PromptServer

        server = PromptServer.instance
        for item in list(server.prompt_queue.currently_running.values()):
            if item[1] == server.last_prompt_id:
                return item[3]["create_time"] / 1000.0
    except Exception:
        pass
    return None


LATENCY_PARTS = (("queue_s", "queue"), ("start_s", "start"), ("load_s", "load"), ("text_s", "text"),
                 ("denoise_s", "denoise"), ("vae_s", "VAE"), ("handback_s", "hand-back"))


def latency_text(latency: dict | None) -> str:
    """'time 4.2 s: queue 0.0 · start 2.1 · load 1.5 · text 0.1 · denoise 0.4 · VAE 0.1 · hand-back 0.0'."""
    if not latency:
        return ""
    parts = " · ".join(f"{label} {latency[key]:.2f}" for key, label in LATENCY_PARTS if key in latency)
    total = latency.get("total_s", 0.0) + latency.get("queue_s", 0.0)
    return f"time {total:.2f} s: {parts} (seconds)"


def show_latency(node_id: str | None, queued: float | None, started: float, notes: Sequence[str] = ()) -> None:
    """Puts `notes` and where the last Sample's time went next to the node (and the queue wait into the backend's
    record)."""
    from ..backend.controller import api

    if queued is not None:
        api.record_queue_wait(started - queued)
    if text := "\n".join([*notes, latency_text(api.last_latency())]).strip():
        send_text(node_id, text)


def now() -> float:
    return time.time()
