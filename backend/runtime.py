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

from . import device, loading, parallel
from .compiler import Compiler
from .models import FAMILIES
from .spec import PipelineSpec, SampleRequest
from .worker import MEMORY_LIMIT_ENV

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
# Allocator messages: torch CUDA ("CUDA out of memory"), torch CPU ("DefaultCPUAllocator: can't allocate
# memory ... Error code 12 (Cannot allocate memory)"; Windows: "not enough memory"), XLA (RESOURCE_EXHAUSTED).
_OOM_MARKERS = ("out of memory", "resource_exhausted", "resource exhausted", "cannot allocate memory",
                "can't allocate memory", "not enough memory")


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
        self.steps = 0  # denoising steps run, all requests together (ranks of one sharded model agree)
        self._rid = None
        self.compiler = Compiler(kind, self.status)  # execution mode, compile plan, shape cache
        self.vote = parallel.StopVote(1)  # replaced at load time when the model is sharded

    # ---- dispatch
    def handle(self, op: str, msg: dict) -> tuple[Any, dict | None]:
        self._rid = msg.get("id")
        if op == "load":
            return self.ensure_loaded(PipelineSpec.from_dict(msg["spec"])), None
        if op == "sample":
            spec, req = PipelineSpec.from_dict(msg["spec"]), SampleRequest(**msg["request"])
            self.ensure_loaded(spec)
            images = self.sample(spec, req)
            return {"loads": self.loads}, ({"images": images} if images is not None else None)
        if op == "info":
            return self.info(), None
        raise ValueError(f"unknown worker op '{op}'")

    def status(self, text: str) -> None:
        if self.rank != 0:  # every rank does the same; one voice is enough
            return
        self.channel.send({"type": "progress", "id": self._rid, "text": text})

    def info(self) -> dict:
        return {"rank": self.rank, "pid": os.getpid(), "device": str(self.device), "loads": self.loads,
                "samples": self.samples, "steps": self.steps,
                "model": self.load_key[0] if self.load_key else None,
                "dtype": str(self.pipe.dtype).replace("torch.", "") if self.pipe is not None else None,
                "compile": self.compiler.stats()}

    # ---- loading
    def ensure_loaded(self, spec: PipelineSpec) -> dict:
        if self.load_key == spec.load_key() and self.pipe is not None:
            self.compiler.configure(self, spec)  # mode / compile plan changes never reload
            return self.info()
        self.unload()
        dtype_name = device.default_dtype_name(self.kind) if spec.dtype == "auto" else spec.dtype
        name = spec.model_path.rstrip("/").rsplit("/", 1)[-1]
        self.status(f"loading {name} ({dtype_name}) on {self.device}")
        t0 = time.perf_counter()
        try:
            extra = parallel.tp_load_kwargs(spec, self.kind) if spec.tp_degree > 1 else None
            pipe = loading.load_pipeline(spec.model_path, _DTYPES[dtype_name], self.status, extra)
        except OSError as e:
            if _is_oom(e):
                raise
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
        self.vote = parallel.StopVote(spec.tp_degree)
        self.pipe, self.load_key = pipe, spec.load_key()
        self.loads += 1
        self.status(f"loaded {name} in {time.perf_counter() - t0:.1f} s")
        if self.should_stop():  # loading cannot stop midway; stop right after it (all TP ranks agree)
            self.status("stopped after loading finished (loading cannot be interrupted midway); the model "
                        "stays loaded for the next run")
            raise self.Interrupted()
        self.compiler.configure(self, spec)
        return self.info()

    def unload(self) -> None:
        if self.pipe is None:
            return
        self.compiler.forget()
        self.pipe, self.load_key = None, None
        gc.collect()
        if self.kind == "cuda":
            torch.cuda.empty_cache()

    # ---- sampling
    def sample(self, spec: PipelineSpec, req: SampleRequest) -> np.ndarray | None:
        """This replica's images [B, H, W, C] float32 in 0..1 (None on ranks that do not send images).

        Global image i is drawn from its own generator (seed + i) and with its own pipeline call, so the
        same seed gives the same pixels whatever the batch size or the number of replicas (batched matmuls
        differ in the last bits between a batch of 4 and two of 2). Replica r draws a contiguous slice.
        """
        layout = parallel.Layout(spec.tp_degree, self.world_size, self.rank)
        items = layout.my_images(req)
        if self.should_stop():
            raise self.Interrupted()
        images = []
        for k, (prompt, seed) in enumerate(items):
            kwargs = self._call_kwargs(spec, req, [torch.Generator("cpu").manual_seed(seed)], prompt=prompt,
                                       done=k * req.steps, total=len(items) * req.steps, report=layout.leader)
            with torch.inference_mode(), self.compiler.sampling(self.pipe, spec, kwargs):
                out = self.pipe(**kwargs)
            images.append(np.asarray(out.images, dtype=np.float32))
        self.samples += 1
        if not layout.leader or not images:
            return None
        return np.ascontiguousarray(np.concatenate(images))

    def should_stop(self) -> bool:
        """The controller asked to stop; with a sharded model, agreed by all its ranks at the same step."""
        return self.vote(self.channel.interrupt.is_set())

    def _call_kwargs(self, spec: PipelineSpec, req: SampleRequest, generators: list,
                     prompt: str | None = None, done: int = 0, total: int | None = None,
                     report: bool = True) -> dict:
        params = inspect.signature(self.pipe.__call__).parameters
        family = FAMILIES[spec.class_name]
        kwargs: dict[str, Any] = {
            "prompt": req.prompt if prompt is None else prompt, "height": req.height, "width": req.width,
            "num_inference_steps": req.steps, "generator": generators,
            "num_images_per_prompt": len(generators), "output_type": "np",
            family.guidance_arg: req.guidance,
        }
        if "negative_prompt" in params and (req.negative_prompt or family.guidance_arg == "true_cfg_scale"):
            kwargs["negative_prompt"] = req.negative_prompt  # Qwen-Image enables true CFG only with one
        total, start = req.steps if total is None else total, time.perf_counter()

        def on_step_end(pipe, step, timestep, callback_kwargs):
            self.steps += 1
            stop = self.should_stop()
            if stop and step == 0 and self.compiler.compiling:  # the compile ran inside this first step
                # before the step's progress: ComfyUI's progress hook raises on it once Cancel was pressed
                self.status(f"stopped right after compiling {self.compiler.compiling} (a compile cannot be "
                            "interrupted midway); it is kept, so the next run at this size starts at once")
            if report:  # steps of this rank's whole share: done before this image + this image's
                self.channel.send({"type": "progress", "id": self._rid, "step": done + step + 1,
                                   "total": total, "elapsed": time.perf_counter() - start})
            if stop:
                raise self.Interrupted()
            return {}

        if "callback_on_step_end" in params:
            kwargs["callback_on_step_end"] = on_step_end
        return {k: v for k, v in kwargs.items() if k in params}

    # ---- errors
    def describe_error(self, e: BaseException) -> str:
        text = f"{type(e).__name__}: {e}"
        if _is_oom(e):
            cap = os.environ.get(MEMORY_LIMIT_ENV, "").strip()
            if cap:
                cap = f" (this worker's memory is capped at {cap} GiB by {MEMORY_LIMIT_ENV})"
            return (f"out of memory on {self.device}{cap}: {text}. Try offload 'model' or 'sequential' in "
                    "Load TPU Pipeline, a smaller width/height or batch_size, or Shard TP over more chips.")
        return text


def _is_oom(e: BaseException) -> bool:
    if isinstance(e, (torch.OutOfMemoryError, MemoryError)):
        return True
    return any(m in str(e).lower() for m in _OOM_MARKERS)
