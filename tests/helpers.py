"""Helpers shared by the test files: the families' tiny pipelines, prompts for a real ComfyUI server, its worker
state, its processes.

The worker processes belong to the server process, so their state is read through the server (the TPU Device
Info node) and the processes are inspected with psutil.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import psutil
from comfy_server import ComfyServer, error_message, load_workflow
from PIL import Image

from backend.families import FAMILIES, ModelFamily

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "workflows" / "api" / "tiny_demo.json"
INFO_NODE = "90"  # id of the TPU Device Info node added to prompts
# ~50 s on one CPU thread: a Sample that tests only ever cut short
LONG = {"width": 512, "height": 512, "batch_size": 4, "steps": 1000}

_seeds = itertools.count(1000)


def tiny_pipelines(keep: Callable[[ModelFamily], bool] = lambda family: True) -> list[str]:
    """The tiny pipeline folder ("tiny-flux", ...: backend/tiny_models.py) of each family of the registry
    (backend/families) that `keep` keeps, in the registry's order. The per-family tests take their cases from
    here, so that a new family folder joins them without a test being copied or a list edited."""
    return [f"tiny-{family.tiny[0]}" for family in FAMILIES.values() if family.tiny and keep(family)]


def makes_images(family: ModelFamily) -> bool:
    """An image family (no video pipeline: those take frames, and other requests)."""
    return not any(p.frame_step for p in family.pipelines)


def diffusion_pipeline(family: ModelFamily) -> bool:
    """An image family run as a diffusers DiffusionPipeline class: what the tests that hold the pack against
    DiffusionPipeline.from_pretrained and its call take (modular pipelines are held against diffusers' modular
    pipelines in tests/test_flux3.py and tests/test_minimax_h3.py)."""
    return makes_images(family) and not any(p.modular for p in family.pipelines)


def repaints(family: ModelFamily) -> bool:
    """An image family with diffusers image-to-image and inpainting pipelines for its text-to-image one."""
    return any(p.img2img for p in family.pipelines) and any(p.inpaint for p in family.pipelines)


def prompt(model: str = "tiny-flux", info: bool = False, **inputs) -> dict:
    """The demo workflow at 64x64 with a fresh seed (so Sample really runs), `inputs` set on Sample."""
    sample = {"width": 64, "height": 64, "seed": next(_seeds), **inputs}
    wf = load_workflow(DEMO, models={"tiny-flux": model}, **{f"2.{k}": v for k, v in sample.items()})
    if info:
        wf[INFO_NODE] = {"class_type": "TPUDeviceInfo", "inputs": {}}
    return wf


def run_ok(server: ComfyServer, wf: dict, timeout: float = 120, **kw) -> dict:
    """Runs `wf` and fails the test, with the error and the server's log, unless it succeeded."""
    result = server.run(wf, timeout=timeout, **kw)
    assert result["status"] == "success", f"{error_message(result)}\n{server.log_tail()}"
    return result


def info_from(result: dict) -> dict:
    """The TPU Device Info node's JSON from a finished prompt's history."""
    return json.loads(result["history"]["outputs"][INFO_NODE]["text"][0])


def device_info(server: ComfyServer) -> dict:
    """What the TPU Device Info node reports now ({"workers", ...}), from a prompt of that node alone."""
    return info_from(run_ok(server, {INFO_NODE: {"class_type": "TPUDeviceInfo", "inputs": {}}}))


def worker_state(server: ComfyServer) -> dict | None:
    """Rank 0's state ({"pid", "loads", "samples", "steps", "model", ...}); None when no worker runs."""
    workers = device_info(server)["workers"]
    return workers[0] if workers else None


def node_texts(result: dict, node: str) -> list[str]:
    """The progress text shown next to `node` during a run, in order."""
    return [
        m["data"]["text"]
        for m in result["messages"]
        if m["type"] == "progress_text" and m["data"]["node"] == node
    ]


def pixels(path: Path) -> np.ndarray:
    """A saved image's RGB pixels (it must be a PNG)."""
    with Image.open(path) as img:
        assert img.format == "PNG"
        return np.asarray(img.convert("RGB"))


def alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def group_processes(server: ComfyServer, workers_only: bool = False) -> list[psutil.Process]:
    """The server's running worker processes (the `-m backend.worker` ranks, started by the pack itself)."""
    procs = []
    for p in psutil.Process(server.proc.pid).children(recursive=True):
        try:
            cmd = p.cmdline()
        except psutil.Error:
            continue
        if "backend.worker" in cmd and alive(p) and not (workers_only and "torch.distributed.run" in cmd):
            procs.append(p)
    return procs


def wait_gone(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Waits until none of `procs` runs; returns those still running after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(p) for p in procs):
        time.sleep(0.05)
    return [p for p in procs if alive(p)]


def kill_all(procs: list[psutil.Process]) -> None:
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass


def wait_for_log(server: ComfyServer, text: str, timeout: float = 30) -> str:
    """ComfyUI's log once it holds `text` (a line the controller writes after an event the test saw happen)."""
    deadline = time.monotonic() + timeout
    while text not in (log := server.log_path.read_text()):
        if time.monotonic() > deadline:
            raise AssertionError(f"{text!r} not in ComfyUI's log after {timeout:.0f} s:\n{log[-3000:]}")
        time.sleep(0.1)
    return log
