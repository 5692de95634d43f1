"""Sampling Options: the prompt-embedding cache, batched calls, FLUX.1's true CFG scale and step caching
(step_cache.py); checked, and what they do, for the node.
"""

from __future__ import annotations

from .. import families
from ..protocol.errors import ParallelError
from ..protocol.spec import PipelineSpec
from . import sigmas as schedules
from . import step_cache as step_caching


def plan_sampling(spec: PipelineSpec, prompt_cache: bool, batched: bool, true_cfg_scale: float,
                  step_cache: str = "off", cache_threshold: float = 0.0,
                  sigmas: str = "") -> tuple[PipelineSpec, str]:
    """Sampling Options: the prompt-embedding cache, batched calls, FLUX.1's true CFG, step caching, a schedule of
    the artist's own (`sigmas`, ManualSigmas' text); checked, and what they do."""
    spec = spec.with_changes(prompt_cache=bool(prompt_cache), batched=bool(batched),
                             true_cfg_scale=float(true_cfg_scale), step_cache=step_cache,
                             cache_threshold=float(cache_threshold), sigmas=schedules.parse(sigmas))
    check_sampling(spec)
    lines = [("prompt_cache on: a prompt seen before on this model reuses its embeddings (no text encoder run, "
              "none moved to the chip under offload); the same pixels as without it."
              if spec.prompt_cache else "prompt_cache off: every image encodes its prompt again."),
             ("batched on: the images of one prompt go through the model in one call (faster where the chip has "
              "room); the pixels differ in the last bits from one call per image, and from one replica count to "
              "another." if spec.batched else
              "batched off: one call per image, so any image can be reproduced alone with any replica count.")]
    if spec.true_cfg_scale > 1:
        lines.append(f"true_cfg_scale {spec.true_cfg_scale:g}: {spec.family.name} runs true CFG against the negative prompt "
                     "(two passes per step; CFG Parallel splits them).")
    if cached := step_caching.describe(spec):
        lines.append(cached)
    if scheduled := schedules.describe(spec):
        lines.append(scheduled)
    return spec, "\n".join(lines)


MAX_TRUE_CFG = 30.0  # Sampling Options' true_cfg_scale widget maximum


def check_sampling(spec: PipelineSpec) -> None:
    step_caching.check(spec)
    schedules.check(spec)
    scale = spec.true_cfg_scale
    if not (isinstance(scale, (int, float)) and 1 <= scale <= MAX_TRUE_CFG):
        raise ParallelError(f"true_cfg_scale: {scale} is {'not a number' if scale != scale else 'out of range'}; use "
                            f"1 (off) up to {MAX_TRUE_CFG:g}, the widget's range.")
    if scale != 1 and not spec.family.true_cfg:
        raise ParallelError(
            f"true_cfg_scale: only {families.true_cfg_names()} have a true CFG scale of their own; for {spec.family.name} leave it at 1 "
            "and use the Sample node's guidance (for Qwen-Image that is its true CFG scale).")
