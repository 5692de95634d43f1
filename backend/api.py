"""What the nodes (and scripts, tests, benchmarks) call. Validates, then hands work to the worker group."""

from __future__ import annotations

import atexit
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from . import device, group, models
from .spec import DTYPE_CHOICES, OFFLOAD_CHOICES, GroupConfig, PipelineSpec, SampleRequest

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
    family = models.FAMILIES[spec.class_name]
    info = models.ModelInfo(spec.model_path, spec.class_name, family, spec.size_factor)
    models.check_size(info, req.width, req.height)
    if req.steps < 1:
        raise models.ModelError(f"steps: {req.steps} is too small; use at least 1.")
    if req.batch_size < 1:
        raise models.ModelError(f"batch_size: {req.batch_size} is too small; use at least 1.")
    if not req.prompt.strip():
        raise models.ModelError("prompt: the prompt is empty; describe the image you want.")
    if not 0 <= req.seed < 2**64:
        raise models.ModelError(f"seed: {req.seed} is out of range; use 0 to 2^64-1.")


def group_config(spec: PipelineSpec) -> GroupConfig:
    return GroupConfig(kind=device.resolve_kind(spec.device), world_size=spec.world_size)


def load(spec: PipelineSpec, on_progress: ProgressFn | None = None) -> dict:
    """Makes sure the pipeline is loaded and warm in the workers; returns rank 0's info."""
    workers = group.get_group(group_config(spec), _status_adapter(on_progress))
    return workers.request("load", {"spec": spec.to_dict()}, on_progress)[0]["value"]


def sample(spec: PipelineSpec, req: SampleRequest, on_progress: ProgressFn | None = None,
           should_interrupt: Callable[[], bool] | None = None) -> np.ndarray:
    """Images [B, H, W, C] float32 in 0..1 for one request (loading the pipeline first if needed)."""
    check_request(spec, req)
    workers = group.get_group(group_config(spec), _status_adapter(on_progress))
    replies = workers.request("sample", {"spec": spec.to_dict(), "request": req.to_dict()},
                              on_progress, should_interrupt)
    return replies[0]["values"]["images"]


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


def _status_adapter(on_progress: ProgressFn | None) -> StatusFn | None:
    if on_progress is None:
        return None
    return lambda text: on_progress({"type": "progress", "text": text})
