"""Start a real ComfyUI server with this pack loaded, and drive it like the web UI does.

Used by the demo (scripts/demo.py), the tests and the benchmarks. It runs ComfyUI as a separate process
(the tree that scripts/bootstrap.sh extracted) and talks to it only over HTTP and the websocket.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import requests
import websocket

PACK_ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PromptFailed(RuntimeError):
    """A prompt was rejected (validation) or failed while running; `.details` holds ComfyUI's answer."""

    def __init__(self, message: str, details: dict):
        super().__init__(message)
        self.details = details


class ComfyServer:
    """A real ComfyUI process with ComfyUI-TPU as a custom node pack and `models_dir` as diffusers folder."""

    def __init__(self, comfyui_dir: str, models_dir: str, work_dir: str | None = None,
                 env: dict[str, str] | None = None, python: str = sys.executable, extra_args: list[str] | None = None,
                 extra_paths: dict[str, str] | None = None, host: str = "127.0.0.1", prefix: list[str] | None = None):
        self.comfyui_dir = Path(comfyui_dir)
        self.models_dir = Path(models_dir)
        self.extra_paths = extra_paths or {}  # more extra_model_paths.yaml entries: folder name -> path
        self.work_dir = Path(work_dir or tempfile.mkdtemp(prefix="comfyui-tpu-server-"))
        self.python = python
        self.env = env or {}
        self.extra_args = extra_args or []
        self.host = host  # where ComfyUI listens (a test host in a network namespace has its own address)
        self.prefix = prefix or []  # e.g. ["ip", "netns", "exec", NAME]: run ComfyUI inside a network namespace
        self.port = free_port()
        self.url = f"http://{host}:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.log_path = self.work_dir / "comfyui.log"
        self.output_dir = self.work_dir / "output"

    def start(self, timeout: float = 120.0) -> ComfyServer:
        nodes_dir = self.work_dir / "custom_nodes"
        nodes_dir.mkdir(parents=True, exist_ok=True)
        link = nodes_dir / "ComfyUI-TPU"
        if not link.exists():
            link.symlink_to(PACK_ROOT, target_is_directory=True)
        audio = nodes_dir / "comfy_audio_nodes"  # ComfyUI's Load Audio where its audio nodes cannot import
        if not audio.exists():
            audio.symlink_to(Path(__file__).resolve().parent / "comfy_audio_nodes", target_is_directory=True)
        config = self.work_dir / "extra_model_paths.yaml"
        config.write_text(json.dumps({"comfyui_tpu": {"base_path": "/", "custom_nodes": str(nodes_dir),
                                                      "diffusers": str(self.models_dir),
                                                      **{k: str(v) for k, v in self.extra_paths.items()}}}))
        args = [*self.prefix, self.python, "main.py", "--listen", self.host, "--port", str(self.port),
                "--base-directory", str(self.work_dir), "--output-directory", str(self.output_dir),
                "--extra-model-paths-config", str(config), "--disable-auto-launch", *self.extra_args]
        if not _cuda_available(self.python):
            args.insert(len(self.prefix) + 2, "--cpu")
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(args, cwd=self.comfyui_dir, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ComfyUI exited with code {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if requests.get(self.url + "/system_stats", timeout=2).ok:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.3)
        self.stop()
        raise TimeoutError(f"ComfyUI did not answer within {timeout:.0f} s:\n{self.log_tail()}")

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGINT (like Ctrl+C), then SIGKILL if it does not stop. Returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode

    def kill(self) -> int | None:
        """SIGKILL, like a crash or the kernel's OOM killer: nothing in ComfyUI's process gets to clean up."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._log.close()
        return self.proc.returncode

    def interrupt(self) -> None:
        """What the UI's Cancel button does: stop the running prompt."""
        self.post("/interrupt").raise_for_status()

    def __enter__(self) -> ComfyServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    # ---- client
    def get(self, path: str, **kw) -> requests.Response:
        return requests.get(self.url + path, timeout=30, **kw)

    def post(self, path: str, **kw) -> requests.Response:
        return requests.post(self.url + path, timeout=30, **kw)

    def queue(self, prompt: dict, client_id: str) -> str:
        # json.dumps, not requests' json=: the API accepts NaN and Infinity, and tests send them
        r = self.post("/prompt", data=json.dumps({"prompt": prompt, "client_id": client_id}),
                      headers={"Content-Type": "application/json"})
        if r.status_code != 200:
            details = r.json()
            raise PromptFailed(_validation_message(details), details)
        return r.json()["prompt_id"]

    def run(self, prompt: dict, timeout: float = 300.0, on_message=None) -> dict:
        """Queues `prompt`, follows it on the websocket to the end, returns
        {"prompt_id", "status": "success"|"error"|"interrupted", "messages", "history", "images"}.
        `messages` holds the JSON messages and, decoded, the progress text shown next to nodes (`progress_text`)."""
        client_id = uuid.uuid4().hex
        ws = websocket.create_connection(f"ws://{self.host}:{self.port}/ws?clientId={client_id}", timeout=timeout)
        try:
            prompt_id = self.queue(prompt, client_id)
            messages, status = [], None
            deadline = time.monotonic() + timeout
            while status is None:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"prompt {prompt_id} did not finish in {timeout:.0f} s:\n{self.log_tail()}")
                raw = ws.recv()
                if isinstance(raw, str):
                    msg = json.loads(raw)
                else:
                    msg = decode_binary(raw)
                    if msg is None:
                        continue  # preview images
                data = msg.get("data", {})
                if data.get("prompt_id") not in (None, prompt_id):
                    continue
                messages.append(msg)
                if on_message:
                    on_message(msg)
                if msg["type"] == "execution_error":
                    status = "error"
                elif msg["type"] == "execution_interrupted":
                    status = "interrupted"
                elif msg["type"] == "executing" and data.get("node") is None and data.get("prompt_id") == prompt_id:
                    status = "success"
        finally:
            ws.close()
        history = self.get(f"/history/{prompt_id}").json().get(prompt_id, {})
        return {"prompt_id": prompt_id, "status": status, "messages": messages, "history": history,
                "images": self.output_images(history)}

    def output_images(self, history: dict) -> list[Path]:
        paths = []
        for node_output in history.get("outputs", {}).values():
            for img in node_output.get("images", []):
                if img.get("type") == "output":
                    paths.append(self.output_dir / img.get("subfolder", "") / img["filename"])
        return paths


def decode_binary(raw: bytes) -> dict | None:
    """A binary websocket frame as a message: ComfyUI's progress text (event 3: node id length, node id, text)
    becomes {"type": "progress_text", "data": {"node": id, "text": text}}; other frames (previews) give None."""
    if len(raw) < 8 or struct.unpack(">I", raw[:4])[0] != 3:
        return None
    n = struct.unpack(">I", raw[4:8])[0]
    return {"type": "progress_text",
            "data": {"node": raw[8:8 + n].decode("utf-8", "replace"), "text": raw[8 + n:].decode("utf-8", "replace")}}


def error_message(result: dict) -> str:
    """The exception message of a failed run, as the UI shows it."""
    for msg in result["messages"]:
        if msg["type"] == "execution_error":
            d = msg["data"]
            return f"{d.get('exception_type')}: {d.get('exception_message')}"
    return ""


def _validation_message(details: dict) -> str:
    parts = [details.get("error", {}).get("message", "")]
    for node_id, err in details.get("node_errors", {}).items():
        for e in err.get("errors", []):
            parts.append(f"node {node_id} ({err.get('class_type')}): {e.get('message')}: {e.get('details')}")
    return "\n".join(p for p in parts if p)


def _cuda_available(python: str) -> bool:
    if python == sys.executable:
        try:
            import torch

            return torch.cuda.is_available()
        except ImportError:
            return False
    out = subprocess.run([python, "-c", "import torch; print(torch.cuda.is_available())"],
                         capture_output=True, text=True)
    return out.stdout.strip() == "True"


def load_workflow(path: str | os.PathLike, models: dict[str, str] | None = None, **overrides) -> dict:
    """Reads an API-format workflow; `models` maps model names to substitutes (e.g. a tiny model);
    `overrides` sets inputs by "node_id.input" keys."""
    prompt = json.loads(Path(path).read_text())
    prompt = {k: v for k, v in prompt.items() if not k.startswith("_")}
    for node in prompt.values():
        inputs = node.get("inputs", {})
        if models and isinstance(inputs.get("model"), str) and inputs["model"] in models:
            inputs["model"] = models[inputs["model"]]
    for key, value in overrides.items():
        node_id, name = key.split(".", 1)
        prompt[node_id]["inputs"][name] = value
    return prompt

