"""Step caching (Sampling Options, worker side): diffusers' own cache hooks on the denoiser, applied with
`enable_cache`, which skip or approximate transformer work on steps whose input barely changed.

- first block (`FirstBlockCacheConfig`): runs the first block every step and skips the others when its output
  changed less than the threshold since the last full step, reusing their cached residual. Data-dependent: where
  one denoiser pass is split over ranks (Shard TP, Context Parallel) each rank would decide from its own shard,
  so the decision's two sums are all-reduced over those ranks first and every rank takes the same one.
- taylorseer (`TaylorSeerCacheConfig`): full steps at a fixed interval, Taylor-extrapolated outputs between them
  (each block's attention; FLUX.1's and Qwen-Image's feed-forwards too: the pipeline's `taylorseer_modules`).
- magcache (`MagCacheConfig`): skips by the model's known magnitude ratios (diffusers ships FLUX.1's).
The last two decide by the step number alone, so every rank decides alike by construction. A model of two
experts (Wan 2.2 A14B) gets the hook on each: the low-noise expert starts from its own first step (its first
steps are full ones), as its outputs are its own. CFG Parallel ranks
each run one branch under its own cache context, as one process does; Data Parallel replicas draw their own images.

The hooks' state is emptied before every pipeline call (a cancelled call leaves it half-way).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ..protocol.spec import CACHE_THRESHOLDS, PipelineSpec
from .compiler import experts


def config(kind: str, threshold: float, steps: int, taylorseer_modules: tuple[str, ...] = ()) -> Any:
    """diffusers' config for a cache kind; threshold 0 = the kind's default (CACHE_THRESHOLDS); the modules
    TaylorSeer extrapolates (the pipeline's `taylorseer_modules`, () = diffusers' default)."""
    from diffusers import FirstBlockCacheConfig, MagCacheConfig, TaylorSeerCacheConfig

    if kind == "first block":
        return FirstBlockCacheConfig(threshold=threshold or CACHE_THRESHOLDS[kind])
    if kind == "magcache":
        from diffusers.hooks.mag_cache import FLUX_MAG_RATIOS

        return MagCacheConfig(threshold=threshold or CACHE_THRESHOLDS[kind], num_inference_steps=steps,
                              mag_ratios=FLUX_MAG_RATIOS)
    if kind == "taylorseer":
        return TaylorSeerCacheConfig(cache_identifiers=list(taylorseer_modules) or None)
    raise ValueError(f"unknown step cache '{kind}'")


@functools.cache
def _names_its_calls(cls: type) -> bool:
    """Whether the pipeline class runs its denoiser under cache contexts, which the hooks keep their state by."""
    return "cache_context(" in inspect.getsource(cls.__call__)


class StepCache:
    """The cache hook configured on the loaded denoiser: set up again when the kind, threshold or (MagCache) step
    count changes, taken off when caching is off."""

    def __init__(self, status: Callable[[str], None]):
        self.status = status
        self.modules: tuple[Any, ...] = ()
        self.key: tuple | None = None

    def forget(self) -> None:
        self.modules, self.key = (), None

    @contextlib.contextmanager
    def call(self, pipe: Any, spec: PipelineSpec, steps: int, peers: Any = None) -> Iterator[None]:
        """One pipeline call with `spec`'s step cache. `peers`: the process group of the ranks that run one
        denoiser pass together (Shard TP, Context Parallel), or None."""
        modules = experts(pipe)
        kind = spec.step_cache
        if kind != "off" and not _names_its_calls(type(pipe)):
            self.status(f"step caching is off for this Sample: diffusers' {type(pipe).__name__} does not run its "
                        "denoiser under the cache contexts its cache hooks need.")
            kind = "off"
        key = (kind, spec.cache_threshold, steps if kind == "magcache" else 0)
        if modules != self.modules or key != self.key:
            self.modules, self.key = modules, None
            for module in modules:  # each expert its own hook and state (one takes over from the other)
                if getattr(module, "is_cache_enabled", False):  # the SDXL UNet has no cache hooks (no CacheMixin)
                    module.disable_cache()
                if kind != "off":
                    module.enable_cache(config(kind, spec.cache_threshold, steps, spec.family.taylorseer_modules))
                    if kind == "first block" and peers is not None:
                        _agree(module, peers)
            self.key = key
        if kind != "off":
            for module in modules:
                module._reset_stateful_cache()
        yield


def _agree(module: Any, peers: Any) -> None:
    """First block cache decided by all `peers` together: the relative change of the first block's residual from
    the sums over every rank's share (the same value one process computes from the whole sequence)."""
    from diffusers.hooks.first_block_cache import _FBC_LEADER_BLOCK_HOOK

    for sub in module.modules():
        registry = getattr(sub, "_diffusers_hook", None)
        hook = registry.get_hook(_FBC_LEADER_BLOCK_HOOK) if registry is not None else None
        if hook is not None:
            hook._should_compute_remaining_blocks = functools.partial(_agreed, hook, peers)


def _agreed(hook: Any, peers: Any, residual: torch.Tensor) -> bool:
    import torch.distributed as dist

    previous = hook.state_manager.get_state().head_block_residual
    if previous is None:  # the first step of a call: every rank computes
        return True
    sums = torch.stack([(residual - previous).abs().sum(), previous.abs().sum()]).to("cpu", torch.float64)
    dist.all_reduce(sums, group=peers)
    return bool(sums[0] / sums[1] > hook.threshold)
