"""What the nodes (and scripts, tests, benchmarks) call. Validates, then hands work to the worker group."""

from __future__ import annotations

import atexit
import os
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from . import compiler, device, group, models, parallel
from .spec import (
    DTYPE_CHOICES,
    MODE_CHOICES,
    OFFLOAD_CHOICES,
    CompilePlan,
    GroupConfig,
    PipelineSpec,
    SampleRequest,
)

StatusFn = Callable[[str], None]
ProgressFn = Callable[[dict], None]

atexit.register(group.shutdown_all)


def make_spec(model: str, roots: Iterable[str], dtype: str = "auto", device_choice: str = "auto",
              offload: str = "none", allow_pickle: bool = False) -> PipelineSpec:
    """Checks the user's choices and the model folder (no weights read) and describes the pipeline."""
    if dtype not in DTYPE_CHOICES:
        raise models.ModelError(f"dtype: '{dtype}' is not one of {', '.join(DTYPE_CHOICES)}.")
    if offload not in OFFLOAD_CHOICES:
        raise models.ModelError(f"offload: '{offload}' is not one of {', '.join(OFFLOAD_CHOICES)}.")
    kind = device.resolve_kind(device_choice)
    if dtype == "float16" and kind == "tpu":
        raise models.ModelError("dtype: float16 is not a good fit for TPUs; choose 'auto' (bfloat16) instead.")
    path = models.resolve_model_path(model, roots)
    info = models.inspect_model(path, allow_pickle=allow_pickle)
    return PipelineSpec(model_path=info.path, class_name=info.class_name, size_factor=info.size_factor,
                        dtype=dtype, device=device_choice, offload=offload)


def check_request(spec: PipelineSpec, req: SampleRequest) -> None:
    """Rejects a sample request before any worker sees it, naming the input and the fix."""
    models.check_size(_model_info(spec), req.width, req.height)
    if req.steps < 1:
        raise models.ModelError(f"steps: {req.steps} is too small; use at least 1.")
    if req.batch_size < 1:
        raise models.ModelError(f"batch_size: {req.batch_size} is too small; use at least 1.")
    if not req.prompt.strip():
        raise models.ModelError("prompt: the prompt is empty; describe the image you want.")
    if (count := len(parallel.images_of(req))) > 4096:
        raise models.ModelError(f"batch_size: {count} images in one run (prompt lines × batch_size) is too "
                                "many; use at most 4096.")
    if not 0 <= req.seed < 2**64:
        raise models.ModelError(f"seed: {req.seed} is out of range; use 0 to 2^64-1.")


def _model_info(spec: PipelineSpec) -> models.ModelInfo:
    """What models.inspect_model found, rebuilt from the spec (no file read)."""
    return models.ModelInfo(spec.model_path, spec.class_name, models.FAMILIES[spec.class_name], spec.size_factor)


def group_config(spec: PipelineSpec) -> GroupConfig:
    parallel.check_spec(spec)  # TP degree / replicas against the model and this host, before any launch
    return GroupConfig(kind=device.resolve_kind(spec.device), world_size=spec.world_size)


def load(spec: PipelineSpec, on_progress: ProgressFn | None = None,
         should_interrupt: Callable[[], bool] | None = None) -> dict:
    """Makes sure the pipeline is loaded and warm in the workers (warm-up shapes compiled); returns rank 0's info."""
    workers = group.get_group(group_config(spec), _status_adapter(on_progress))
    return workers.request("load", {"spec": spec.to_dict()}, on_progress, should_interrupt)[0]["value"]


def sample(spec: PipelineSpec, req: SampleRequest, on_progress: ProgressFn | None = None,
           should_interrupt: Callable[[], bool] | None = None) -> np.ndarray:
    """Images [B, H, W, C] float32 in 0..1 for one request (loading the pipeline first if needed)."""
    check_request(spec, req)
    workers = group.get_group(group_config(spec), _status_adapter(on_progress))
    replies = workers.request("sample", {"spec": spec.to_dict(), "request": req.to_dict()},
                              _group_progress(spec, req, on_progress), should_interrupt)
    # Each replica's first rank sends its slice; rank order is image order.
    parts = [r["values"]["images"] for r in replies if "images" in r.get("values", {})]
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def worker_info() -> list[dict]:
    """Per-rank state of the running group (empty when none runs)."""
    workers = group.current_group()
    if workers is None:
        return []
    return [r["value"] for r in workers.request("info", {})]


def device_info() -> device.DeviceInfo:
    return device.detect()


def shutdown() -> None:
    """Stops all workers (frees every chip and the host memory they hold)."""
    group.shutdown_all()


def list_models(roots: Iterable[str]) -> list[str]:
    return models.find_models([str(Path(r)) for r in roots])


def _group_progress(spec: PipelineSpec, req: SampleRequest,
                    on_progress: ProgressFn | None) -> ProgressFn | None:
    """One progress bar for the whole group: completed steps of all replicas over the steps of all images."""
    if on_progress is None:
        return None
    total = len(parallel.images_of(req)) * req.steps
    done: dict[int, int] = {}

    def aggregate(msg: dict) -> None:
        if "step" in msg:
            done[msg.get("rank", 0) // spec.tp_degree] = msg["step"]  # each replica reports its own share
            msg = {**msg, "step": sum(done.values()), "total": total}
        on_progress(msg)

    return aggregate


def _status_adapter(on_progress: ProgressFn | None) -> StatusFn | None:
    if on_progress is None:
        return None
    return lambda text: on_progress({"type": "progress", "text": text})


# ---- execution modes and compiling (backend/compiler.py does the work)

def with_mode(spec: PipelineSpec, mode: str) -> tuple[PipelineSpec, list[str]]:
    """`spec` run in `mode` (no reload when it changes), and notes for the user about this device."""
    if mode not in MODE_CHOICES:
        raise compiler.CompileError(f"mode: '{mode}' is not one of {', '.join(MODE_CHOICES)}.")
    spec = spec.with_changes(mode=mode)
    kind = device.resolve_kind(spec.device)
    plan, notes = compiler.resolve_plan(spec, kind)
    note = device.mode_note(kind, mode)
    if plan is not None and spec.compile is None:
        notes.append(f"compiled with the defaults ({plan.target}, backend {plan.backend}); each new size compiles "
                     "on its first Sample. Add a Compile node to choose, or to compile sizes up front.")
    return spec, ([note] if note else []) + notes


def with_compile(spec: PipelineSpec, target: str, backend: str, warmup: str,
                 snap_to_warmup: bool = False) -> tuple[PipelineSpec, list[str]]:
    """`spec` in compiled mode with this plan, checked against the model and device; and notes for the user."""
    shapes = compiler.parse_warmup(warmup)
    for w, h, _ in shapes:
        try:
            models.check_size(_model_info(spec), w, h)
        except models.ModelError as e:
            raise compiler.CompileError(f"warmup: {w}x{h}: {e}") from None
    if snap_to_warmup and not shapes:
        raise compiler.CompileError("snap_to_warmup: there are no warm-up sizes to snap to; list some in warmup.")
    spec = spec.with_changes(mode="compiled", compile=CompilePlan(target, backend, shapes, bool(snap_to_warmup)))
    return spec, compiler.resolve_plan(spec, device.resolve_kind(spec.device))[1]


def compile_stats() -> dict | None:
    """Rank 0's mode, compile and cache statistics (compiles, hits, seconds per shape); None without workers."""
    info = worker_info()
    return info[0].get("compile") if info else None


def set_compile_cache_dir(path: str, override: bool = False) -> str:
    """The folder the persistent compile caches use from the next worker start; an explicit
    COMFYUI_TPU_COMPILE_CACHE in the environment wins unless `override`. Returns the folder in use."""
    if override or not os.environ.get(compiler.CACHE_ENV):
        os.environ[compiler.CACHE_ENV] = str(path)
    return os.environ[compiler.CACHE_ENV]
