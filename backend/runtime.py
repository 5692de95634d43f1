"""Worker-side pipeline handling: load (or reuse) a diffusers pipeline, apply offload, sample.

Runs only inside a worker process (backend.worker). Keeps one pipeline warm; the load key decides
when weights must be reloaded.
"""

from __future__ import annotations

import gc
import inspect
import os
import time
from typing import Any

import numpy as np
import torch

from . import device
from .models import FAMILIES
from .spec import PipelineSpec, SampleRequest

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
_OOM_MARKERS = ("out of memory", "resource_exhausted", "resource exhausted", "cannot allocate memory")


class Runtime:
    class Interrupted(Exception):
        """Raised from the step callback when the controller asked to stop."""

    def __init__(self, kind: str, rank: int, local_rank: int, world_size: int, channel: Any):
        self.kind, self.rank, self.world_size = kind, rank, world_size
        self.channel = channel
        self.device = device.torch_device(kind, local_rank)
        self.pipe: Any = None
        self.load_key: tuple | None = None
        self.loads = 0
        self.samples = 0
        self._rid = None

    # ---- dispatch
    def handle(self, op: str, msg: dict) -> tuple[Any, dict | None]:
        self._rid = msg.get("id")
        if op == "load":
            return self.ensure_loaded(PipelineSpec.from_dict(msg["spec"])), None
        if op == "sample":
            spec, req = PipelineSpec.from_dict(msg["spec"]), SampleRequest(**msg["request"])
            self.ensure_loaded(spec)
            images = self.sample(spec, req)
            return {"loads": self.loads}, {"images": images}
        if op == "info":
            return self.info(), None
        raise ValueError(f"unknown worker op '{op}'")

    def status(self, text: str) -> None:
        self.channel.send({"type": "progress", "id": self._rid, "text": text})

    def info(self) -> dict:
        return {"rank": self.rank, "pid": os.getpid(), "device": str(self.device), "loads": self.loads, "samples": self.samples,
                "model": self.load_key[0] if self.load_key else None,
                "dtype": str(self.pipe.dtype).replace("torch.", "") if self.pipe is not None else None}

    # ---- loading
    def ensure_loaded(self, spec: PipelineSpec) -> dict:
        if self.load_key == spec.load_key() and self.pipe is not None:
            return self.info()
        self.unload()
        from diffusers import DiffusionPipeline

        dtype_name = device.default_dtype_name(self.kind) if spec.dtype == "auto" else spec.dtype
        name = spec.model_path.rstrip("/").rsplit("/", 1)[-1]
        self.status(f"loading {name} ({dtype_name}) on {self.device}")
        t0 = time.perf_counter()
        try:
            pipe = DiffusionPipeline.from_pretrained(
                spec.model_path, dtype=_DTYPES[dtype_name], local_files_only=True, use_safetensors=True)
        except OSError as e:
            raise RuntimeError(
                f"model: '{name}' could not be loaded from its folder ({e}). ComfyUI-TPU never downloads at "
                "run time: make sure the folder holds every component (safetensors weights, configs, "
                "tokenizers).") from e
        if spec.offload == "model":
            pipe.enable_model_cpu_offload(device=self.device)
        elif spec.offload == "sequential":
            pipe.enable_sequential_cpu_offload(device=self.device)
        else:
            pipe.to(self.device)
        pipe.set_progress_bar_config(disable=True)
        self.pipe, self.load_key = pipe, spec.load_key()
        self.loads += 1
        self.status(f"loaded {name} in {time.perf_counter() - t0:.1f} s")
        return self.info()

    def unload(self) -> None:
        if self.pipe is None:
            return
        self.pipe, self.load_key = None, None
        gc.collect()
        if self.kind == "cuda":
            torch.cuda.empty_cache()

    # ---- sampling
    def sample(self, spec: PipelineSpec, req: SampleRequest) -> np.ndarray:
        """Images [B, H, W, C] float32 in 0..1; image i is drawn from its own generator (seed + i)."""
        if self.channel.interrupt.is_set():
            raise self.Interrupted()
        generators = [torch.Generator("cpu").manual_seed((req.seed + i) % 2**64) for i in range(req.batch_size)]
        kwargs = self._call_kwargs(spec, req, generators)
        with torch.inference_mode():
            out = self.pipe(**kwargs)
        self.samples += 1
        return np.ascontiguousarray(out.images, dtype=np.float32)

    def _call_kwargs(self, spec: PipelineSpec, req: SampleRequest, generators: list) -> dict:
        params = inspect.signature(self.pipe.__call__).parameters
        family = FAMILIES[spec.class_name]
        kwargs: dict[str, Any] = {
            "prompt": req.prompt, "height": req.height, "width": req.width,
            "num_inference_steps": req.steps, "generator": generators,
            "num_images_per_prompt": req.batch_size, "output_type": "np",
            family.guidance_arg: req.guidance,
        }
        if "negative_prompt" in params and (req.negative_prompt or family.guidance_arg == "true_cfg_scale"):
            kwargs["negative_prompt"] = req.negative_prompt  # Qwen-Image enables true CFG only with one
        total, start = req.steps, time.perf_counter()

        def on_step_end(pipe, step, timestep, callback_kwargs):
            self.channel.send({"type": "progress", "id": self._rid, "step": step + 1, "total": total,
                               "elapsed": time.perf_counter() - start})
            if self.channel.interrupt.is_set():
                raise self.Interrupted()
            return {}

        if "callback_on_step_end" in params:
            kwargs["callback_on_step_end"] = on_step_end
        return {k: v for k, v in kwargs.items() if k in params}

    # ---- errors
    def describe_error(self, e: BaseException) -> str:
        text = f"{type(e).__name__}: {e}"
        if isinstance(e, torch.OutOfMemoryError) or any(m in str(e).lower() for m in _OOM_MARKERS):
            return (f"out of memory on {self.device}: {e}. Try offload 'model' or 'sequential' in Load TPU "
                    "Pipeline, a smaller width/height or batch_size, or shard the model over more chips.")
        return text
