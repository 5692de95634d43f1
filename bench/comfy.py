"""Driving the real ComfyUI server for the bench: one websocket kept open, prompts timed from queue to done."""

from __future__ import annotations

import json
import sys
import time
import uuid
from pathlib import Path

import psutil

from .common import ROOT, Ctx

sys.path.insert(0, str(ROOT / "scripts"))
from comfy_server import ComfyServer, PromptFailed  # noqa: E402

PROMPT = "a red fox in the snow"


class Comfy:
    """A real ComfyUI process with this pack, as scripts/comfy_server.py starts it for the tests."""

    def __init__(self, ctx: Ctx, name: str):
        work = ctx.work / f"comfy-{name}"
        work.mkdir(parents=True, exist_ok=True)
        self.server = ComfyServer(ctx.comfyui_dir, str(ctx.models_dir), work_dir=str(work))
        self.ws = None
        self.client_id = uuid.uuid4().hex
        self.object_info: dict = {}

    def start(self) -> Comfy:
        import websocket

        self.server.start(timeout=180)
        self.ws = websocket.create_connection(f"ws://127.0.0.1:{self.server.port}/ws?clientId={self.client_id}",
                                              timeout=600)
        self.object_info = self.server.get("/object_info").json()
        return self

    def stop(self) -> None:
        if self.ws is not None:
            self.ws.close()
            self.ws = None
        self.server.stop()

    @property
    def pid(self) -> int:
        return self.server.proc.pid

    # ---- prompts
    def _node(self, class_type: str, inputs: dict) -> dict:
        """The node with `inputs`, plus the default of every other required input the server declares (so
        inputs added to the nodes later, with defaults, do not break the bench's API prompts)."""
        required = self.object_info.get(class_type, {}).get("input", {}).get("required", {})
        full = dict(inputs)
        for name, spec in required.items():
            if name in full or not isinstance(spec, list) or not spec:
                continue
            kind, opts = spec[0], (spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {})
            if "default" in opts:
                full[name] = opts["default"]
            elif isinstance(kind, list) and kind:
                full[name] = kind[0]
        return {"class_type": class_type, "inputs": full}

    def prompt(self, model: str, seed: int, width: int, height: int, steps: int, text: str = PROMPT,
               batch_size: int = 1) -> dict:
        """Load TPU Pipeline → Sample (TPU) → Save Image."""
        return {
            "1": self._node("LoadTPUPipeline", {"model": model, "dtype": "auto", "device": "auto", "offload": "none"}),
            "2": self._node("TPUSample", {"pipeline": ["1", 0], "prompt": text, "negative_prompt": "",
                                          "width": width, "height": height, "steps": steps, "guidance": 0.0,
                                          "seed": seed, "batch_size": batch_size}),
            "3": self._node("SaveImage", {"images": ["2", 0], "filename_prefix": "bench"}),
        }

    def run(self, prompt: dict, timeout: float = 600.0) -> float:
        """Seconds from POST /prompt to the 'executing: None' message that ends the prompt."""
        t0 = time.perf_counter()
        prompt_id = self.server.queue(prompt, self.client_id)
        deadline = time.monotonic() + timeout
        while True:
            if time.monotonic() > deadline:
                raise TimeoutError(f"prompt did not finish in {timeout:.0f} s:\n{self.server.log_tail()}")
            raw = self.ws.recv()
            if not isinstance(raw, str):
                continue  # preview frames
            msg = json.loads(raw)
            data = msg.get("data", {})
            if data.get("prompt_id") != prompt_id:
                continue
            if msg["type"] == "execution_error":
                raise PromptFailed(f"{data.get('exception_type')}: {data.get('exception_message')}", data)
            if msg["type"] == "execution_interrupted":
                raise PromptFailed("the prompt was interrupted", data)
            if msg["type"] == "executing" and data.get("node") is None:
                return time.perf_counter() - t0

    # ---- processes
    def rss(self) -> int:
        return psutil.Process(self.pid).memory_info().rss

    def worker_rss(self) -> int:
        """Summed RSS of the server's worker ranks (`-m backend.worker`, not the torchrun launcher)."""
        total = 0
        for p in psutil.Process(self.pid).children(recursive=True):
            try:
                cmd = p.cmdline()
                if "backend.worker" in cmd and "torch.distributed.run" not in cmd:
                    total += p.memory_info().rss
            except psutil.Error:
                continue
        return total

    def output_dir(self) -> Path:
        return self.server.output_dir
