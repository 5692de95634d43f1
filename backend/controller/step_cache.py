"""Step caching (Sampling Options, controller side): which cache kinds suit which model and mode, checked before
any worker sees them, and what the chosen one does, for the node's text. The worker applies diffusers' hooks
(worker/step_cache.py)."""

from __future__ import annotations

import math

from ..families import PIPELINES
from ..protocol.errors import CompileError, ParallelError
from ..protocol.spec import CACHE_THRESHOLDS, STEP_CACHES, PipelineSpec

_WHAT = {
    "first block": "runs the first transformer block every step and skips the rest when its output changed less "
                   "than the threshold (relative mean change) since the last full step",
    "taylorseer": "computes every 5th step fully (after 3 full ones) and extrapolates the blocks' {what} "
                  "in between (Taylor series)",
    "magcache": "skips up to 3 steps in a row while the accumulated error predicted from FLUX.1's known "
                "magnitude ratios stays below the threshold (never in the first 20 % of the steps)",
}


def check(spec: PipelineSpec) -> None:
    """Raises an InputError naming the input when the step cache cannot run with this model, mode or value."""
    kind, threshold = spec.step_cache, spec.cache_threshold
    if kind not in STEP_CACHES:
        raise ParallelError(f"step_cache: '{kind}' is not one of {', '.join(STEP_CACHES)}.")
    if not (isinstance(threshold, (int, float)) and math.isfinite(threshold) and 0 <= threshold <= 10):
        raise ParallelError(f"cache_threshold: {threshold} is out of range; use 0 (the cache's default) up to 10.")
    if kind == "off":
        return
    if kind not in spec.family.step_caches:
        fits = sorted({p.name for p in PIPELINES.values() if kind in p.step_caches})
        others = list(spec.family.step_caches)
        instead = f" For {spec.family.name} use {' or '.join(others)}." if others else ""
        why = f" ({spec.family.no_step_cache})" if spec.family.no_step_cache else ""
        raise ParallelError(f"step_cache: '{kind}' does not suit {spec.family.name} ({spec.class_name}){why}; it suits "
                            f"{', '.join(fits)}.{instead} Otherwise set step_cache to off.")
    if kind == "taylorseer" and threshold:
        raise ParallelError(f"cache_threshold: {threshold:g} means nothing to taylorseer, which computes at a fixed "
                            "interval; leave it at 0.")
    if spec.mode == "compiled":
        raise CompileError(f"step_cache: '{kind}' cannot run in compiled mode: the cache decides in Python at every "
                           "step which blocks run, which breaks a compiled graph or recompiles it at each step. Use "
                           "an eager mode with the cache, or set step_cache to off to compile.")


def describe(spec: PipelineSpec) -> str:
    """What the chosen step cache does (one line; '' when off)."""
    if spec.step_cache == "off":
        return ""
    kind = spec.step_cache
    threshold = spec.cache_threshold or CACHE_THRESHOLDS.get(kind)
    said = f" (threshold {threshold:g}: higher skips more, and changes the image more)" if threshold else ""
    what = "attention and feed-forward outputs" if spec.family.taylorseer_modules else "attention outputs"
    return (f"step_cache {kind}: {_WHAT[kind].format(what=what)}{said}. Faster, not the same pixels as without "
            f"it; diffusers' {kind} hook, the same image as plain diffusers with it.")
