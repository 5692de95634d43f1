"""The speed nodes' side: the parallel layouts (Shard TP, Data Parallel, CFG Parallel, Context Parallel;
layouts.py does the work), Sampling Options (sampling_options.py), execution modes and compiling (compile_plan.py
plans it), and the compile statistics and cache folder.
"""

from __future__ import annotations

from ..protocol import settings
from ..protocol.errors import CompileError, ModelError
from ..protocol.spec import MODE_CHOICES, WARMUP_STEPS, CompilePlan, PipelineSpec, mode_note
from . import compile_plan, layouts, models
from .sampling_options import plan_sampling
from .workers import worker_info


def shard(spec: PipelineSpec, degree: int, shard_text_encoders: bool = False) -> tuple[PipelineSpec, str]:
    """`spec` sharded over `degree` chips (0 = auto), checked; and what is sharded, for the node's text."""
    return layouts.plan_tp(spec, degree, shard_text_encoders)


def replicate(spec: PipelineSpec, replicas: int) -> tuple[PipelineSpec, str]:
    """`spec` with `replicas` data-parallel copies (0 = auto), checked; and the layout, for the node's text."""
    return layouts.plan_dp(spec, replicas)


def cfg_parallel(spec: PipelineSpec) -> tuple[PipelineSpec, str]:
    """`spec` with its two CFG passes on two ranks, checked; and what that does for this model."""
    return layouts.plan_cfg(spec)


def context_parallel(spec: PipelineSpec, degree: int, mode: str = "ulysses") -> tuple[PipelineSpec, str]:
    """`spec` with its transformer's sequence split over `degree` ranks (0 = auto), checked; and what it does."""
    return layouts.plan_cp(spec, degree, mode)


def sampling_options(spec: PipelineSpec, prompt_cache: bool = True, batched: bool = False,
                     true_cfg_scale: float = 1.0, step_cache: str = "off",
                     cache_threshold: float = 0.0, sigmas: str = "") -> tuple[PipelineSpec, str]:
    """`spec` with these sampling options, checked; and what they do, for the node's text."""
    return plan_sampling(spec, prompt_cache, batched, true_cfg_scale, step_cache, cache_threshold, sigmas)


def with_mode(spec: PipelineSpec, mode: str) -> tuple[PipelineSpec, list[str]]:
    """`spec` run in `mode` (no reload when it changes), and notes for the user about this device."""
    if mode not in MODE_CHOICES:
        raise CompileError(f"mode: '{mode}' is not one of {', '.join(MODE_CHOICES)}.")
    unplanned = spec.compile is None
    spec = compile_plan.resolve_compile(spec.with_changes(mode=mode))
    note = mode_note(spec.kind, mode)
    notes = list(spec.compile.notes) if spec.compile_plan() else []
    if spec.compile_plan() is not None and unplanned:
        plan = spec.compile
        notes.append(f"compiled with the defaults ({plan.target}, backend {plan.backend}); each new size compiles "
                     "on its first Sample. Add a Compile node to choose, or to compile sizes up front.")
    return spec, ([note] if note else []) + notes


def with_compile(spec: PipelineSpec, target: str, backend: str, warmup: str,
                 snap_to_warmup: bool = False) -> tuple[PipelineSpec, list[str]]:
    """`spec` in compiled mode with this plan, checked against the model and device; and notes for the user."""
    shapes = compile_plan.frame_rates(spec.family, compile_plan.parse_warmup(warmup))
    for w, h, _, frames, _ in shapes:
        if spec.family.frame_step and not frames:
            raise CompileError(f"warmup: {w}x{h} has no frames, and {spec.family.name} makes videos, each frame "
                               f"count a shape of its own: write them as xFRAMESf, e.g. '{w}x{h}x81f'.")
        try:
            models.check_size(models.info_of(spec), w, h)
            models.check_frames(spec.family, frames)
        except ModelError as e:
            raise CompileError(f"warmup: {w}x{h}" + (f"x{frames}f" if frames else "") + f": {e}") from None
    if snap_to_warmup and not shapes:
        raise CompileError("snap_to_warmup: there are no warm-up sizes to snap to; list some in warmup.")
    plan = CompilePlan(target, backend, shapes, bool(snap_to_warmup))
    spec = compile_plan.resolve_compile(spec.with_changes(mode="compiled", compile=plan))
    return spec, list(spec.compile.notes)


def warmup_steps(spec: PipelineSpec) -> int:
    """Steps a load runs when its compile plan warms sizes up (for a progress bar)."""
    plan = spec.compile_plan()
    return WARMUP_STEPS * max(1, len(plan.warmup)) if plan else WARMUP_STEPS


def compile_stats() -> dict | None:
    """Rank 0's mode, compile and cache statistics (compiles, hits, seconds per shape); None without workers."""
    info = worker_info()
    return info[0].get("compile") if info else None


def set_compile_cache_dir(path: str, override: bool = False) -> str:
    """The folder the persistent compile caches use from the next worker start; an explicit
    COMFYUI_TPU_COMPILE_CACHE in the environment wins unless `override`. Returns the folder in use."""
    if override or not settings.COMPILE_CACHE.is_set():
        settings.COMPILE_CACHE.set(str(path))
    return settings.COMPILE_CACHE.raw()
