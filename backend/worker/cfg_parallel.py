"""CFG Parallel: the two classifier-free-guidance passes of each denoising step on two ranks.

diffusers has no CFG parallelism of its own (its `_modeling_parallel.py` lists it as to do), so this is ours,
kept small and in this one place. Pipelines run CFG in one of two ways (`protocol.families.Pipeline.cfg_passes`):

- "batch" (SD3, SDXL, Z-Image, LTX-2): one denoiser call on a doubled batch ([uncond, cond]; Z-Image: [cond, uncond],
  as lists of per-image tensors; a ControlNet's residuals with it; LTX-2's video and audio latents both, and both
  predictions it returns are gathered). Each rank runs its half of the batch and the halves
  are gathered, so both ranks hold the whole prediction and take the same guidance and scheduler step. Half a batch is not bit-identical to the doubled batch (batched matmuls differ in the last bits): images
  match one worker within 1e-4 in float32 (seen: about 1e-5).
- "branches" (FLUX.1 true CFG, Qwen-Image, FLUX.2 klein base, Wan): a call under `cache_context("cond")`, then one under
  `cache_context("uncond")`; FLUX.1 Kontext's true CFG makes the same two calls in the same order without naming
  them (`Pipeline.unnamed_branches`), so there the call's place in the step names it. Rank 0 computes cond, rank 1
  uncond. Rank 1's cond call returns a placeholder, filled in place when the two exchange their predictions
  during the uncond call (the pipelines do not read the prediction in between; FLUX.2's and Kontext's slice of
  it is a view; Qwen-Image 2.1's prediction is longer or shorter than its input, and only its tail is read and
  exchanged: `_tail`). Same arithmetic as one worker: bit-identical.

The split wraps the denoiser's `__call__` (not `forward`), so a compiled denoiser's graph holds no collective, and
offload hooks and diffusers' own parallel hooks stay inside. The pipeline decides per call whether it runs two
passes (guidance, negative prompt); `two_passes` says the same beforehand, and a step that ends with half an
exchange fails loudly instead of returning a wrong image.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Any

# The denoiser arguments that carry a ControlNet's residuals: a list (tuple) of tensors, each on the doubled batch
CONTROLNET_RESIDUALS = ("down_block_additional_residuals", "block_controlnet_hidden_states")


def two_passes(pipe: Any, passes: str, kwargs: dict, cfg_above: float = 1.0,
               distilled_key: str = "is_distilled") -> bool:
    """Whether the pipeline call with `kwargs` runs the denoiser twice per step (as the pipeline decides it:
    guidance above `cfg_above`, and not a model its config's `distilled_key` marks distilled: Pipeline's)."""
    if passes == "batch":  # SD3, SDXL, Z-Image, LTX-2 (either guidance): do_classifier_free_guidance
        return max(kwargs.get("guidance_scale", 0), kwargs.get("audio_guidance_scale", 0)) > cfg_above
    if passes != "branches" or not (named_branches(pipe) or _unnamed(pipe)):
        return False  # (FLUX.1's image-to-image and inpainting pipelines run true CFG without naming the branches)
    if "true_cfg_scale" in kwargs:  # FLUX.1, Qwen-Image: true CFG needs a negative prompt (or its embeddings)
        negative = kwargs.get("negative_prompt") is not None or kwargs.get("negative_prompt_embeds") is not None
        return kwargs["true_cfg_scale"] > 1 and negative
    # Wan, Krea 2 (any guidance above 0); FLUX.2 klein's distilled models run one pass
    distilled = bool(distilled_key and getattr(pipe.config, distilled_key, False))
    return kwargs.get("guidance_scale", 0) > cfg_above and not distilled


def _unnamed(pipe: Any) -> bool:
    """Its true CFG calls the denoiser for the prompt, then the negative prompt, without naming them
    (Pipeline.unnamed_branches): the first call of a step is "cond", the next "uncond"."""
    from ..families import PIPELINES

    own = PIPELINES.get(type(pipe).__name__)
    return bool(own and own.unnamed_branches)


def named_branches(pipe: Any) -> bool:
    """The pipeline names its CFG passes (cache_context "cond" / "uncond")."""
    return "cache_context" in _call_source(type(pipe))


@functools.cache
def _call_source(cls: type) -> str:
    """The pipeline class's __call__ source: the branches can be split where it names them (cache_context)."""
    return inspect.getsource(cls.__call__)


def _tail(sample: Any, latents: Any) -> Any:
    """What the two ranks exchange of a prediction: all of it where it is shaped like the denoiser's input (every
    family but one); else its last tokens, as many as both the input and the output have. Qwen-Image 2.1's
    transformer returns its joint sequence (the prompt's tokens first, their number differing between prompt and
    negative prompt) at the first step and the target image's tokens alone after it (KV cache), and its pipeline
    keeps the last latent-many: that tail has the same length on both ranks."""
    if sample.shape == latents.shape:
        return sample
    return sample[:, sample.shape[1] - min(sample.shape[1], latents.shape[1]):]


def _sample(out: Any) -> Any:
    return out[0] if isinstance(out, tuple) else out.sample


def _like(out: Any, sample: Any) -> Any:
    """`out` (a tuple or a diffusers output) carrying `sample` instead."""
    return (sample, *out[1:]) if isinstance(out, tuple) else type(out)(sample=sample)


def _output(sample: Any, return_dict: bool) -> Any:
    if not return_dict:
        return (sample,)
    from diffusers.models.modeling_outputs import Transformer2DModelOutput

    return Transformer2DModelOutput(sample=sample)


class CFGParallel:
    """Splits the CFG passes of one denoiser (or of each expert of a pair: one runs per step, so they share the
    exchange) between this rank and its CFG peer (`group`, 2 ranks)."""

    def __init__(self, modules: tuple[Any, ...], passes: str, group: Any, rank: int):
        self.passes, self.group, self.rank = passes, group, rank
        self.active = False  # this call runs two passes (set per call by `call`)
        self.named = True  # the pipeline names its passes (else: the first call of a step is cond, the next uncond)
        self.branch: str | None = None  # the cache_context the pipeline is in
        self.cond: Any = None  # rank 0: its cond prediction, until the exchange
        self.placeholder: Any = None  # rank 1: what its cond call returned, until the exchange fills it
        self.exchanges = 0  # steps whose two passes this rank and its peer split (worker info: what ran split)
        self.modules = modules
        for module in modules:
            self._install(module)

    def splits(self, module: Any) -> bool:
        """Whether `module`'s calls go through this split."""
        return module in self.modules

    def _install(self, module: Any) -> None:
        """Makes `module` an instance of a subclass whose `__call__` (and `cache_context`) go through us."""
        base, split = type(module), self

        def __call__(module_self, *args, **kwargs):
            return split.run(lambda *a, **k: base.__call__(module_self, *a, **k), args, kwargs)

        attrs: dict[str, Any] = {"__call__": __call__, "__module__": base.__module__, "__qualname__": base.__qualname__}
        if self.passes == "branches":
            @contextlib.contextmanager
            def cache_context(module_self, name, *args, **kwargs):
                split.branch = name
                try:
                    with base.cache_context(module_self, name, *args, **kwargs):
                        yield
                finally:
                    split.branch = None

            attrs["cache_context"] = cache_context
        module.__class__ = type(base.__name__, (base,), attrs)

    @contextlib.contextmanager
    def call(self, active: bool, named: bool = True) -> Iterator[None]:
        """One pipeline call; `active` when it runs two passes per step (else both ranks run it whole); `named`
        when the pipeline names them (cache_context), else they come in order, cond then uncond."""
        self.active, self.named = active, named
        try:
            yield
        finally:
            self.active, self.named, self.branch, self.cond, self.placeholder = False, True, None, None, None

    def check_step(self) -> None:
        """At a step's end: an exchange left half done means the pipeline ran one branch only."""
        if self.cond is not None or self.placeholder is not None:
            raise RuntimeError("CFG Parallel: the pipeline ran a 'cond' pass without its 'uncond' pass in this step, "
                               "so the CFG peers could not exchange their predictions. Remove CFG Parallel for this "
                               "pipeline.")

    def run(self, call: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        if not self.active:
            return call(*args, **kwargs)
        if self.passes == "batch":
            return self._batch(call, args, kwargs)
        branch = self.branch
        if not self.named:  # the second call of a step is the one that finds an exchange half done
            branch = "uncond" if self.cond is not None or self.placeholder is not None else "cond"
        if branch in ("cond", "uncond"):
            return self._branches(call, args, kwargs, branch)
        return call(*args, **kwargs)

    def _gather(self, local: Any, count: bool = True) -> list[Any]:
        import torch
        import torch.distributed as dist

        self.exchanges += count

        local = local.contiguous()
        parts = [torch.empty_like(local) for _ in range(2)]
        dist.all_gather(parts, local, group=self.group)
        return parts

    def _batch(self, call: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        import torch

        first = args[0] if args else kwargs.get("hidden_states", kwargs.get("sample", kwargs.get("x")))
        n = len(first)  # a batched tensor, or Z-Image's list of per-image tensors
        if n % 2:  # not a CFG batch (e.g. SD3's skip-layer pass): computed whole on both ranks
            return call(*args, **kwargs)
        half = slice(self.rank * n // 2, (self.rank + 1) * n // 2)

        def cut(x: Any) -> Any:
            if (torch.is_tensor(x) and x.dim() > 0 and x.shape[0] == n) or (isinstance(x, list) and len(x) == n):
                return x[half]
            if isinstance(x, dict):
                return {k: cut(v) for k, v in x.items()}
            return x

        def cut_arg(name: str, x: Any) -> Any:
            if name in CONTROLNET_RESIDUALS and isinstance(x, (list, tuple)):  # one batched tensor per block
                return type(x)(cut(t) for t in x)
            return cut(x)

        out = call(*(cut(a) for a in args), **{k: cut_arg(k, v) for k, v in kwargs.items()})
        if isinstance(out, tuple) and len(out) > 1:  # every prediction it returns (LTX-2: the video's, the sound's)
            return tuple(torch.cat(self._gather(x, count=i == 0)) if torch.is_tensor(x) else x
                         for i, x in enumerate(out))
        sample = _sample(out)
        if isinstance(sample, list):  # same-sized images: gathered stacked, handed back as a list
            return _like(out, [*torch.cat(self._gather(torch.stack(sample))).unbind(0)])
        return _like(out, torch.cat(self._gather(sample)))

    def _branches(self, call: Callable[..., Any], args: tuple, kwargs: dict, branch: str) -> Any:
        import torch

        return_dict = kwargs.get("return_dict", True)
        latents = args[0] if args else kwargs["hidden_states"]
        if branch == "cond":
            if self.rank == 0:
                out = call(*args, **kwargs)
                self.cond = _tail(_sample(out), latents)
                return out
            self.placeholder = torch.empty_like(latents)  # a flow model predicts a velocity shaped like its input
            return _output(self.placeholder, return_dict)
        if self.rank == 1:
            out = call(*args, **kwargs)
            cond, uncond = self._gather(_tail(_sample(out), latents))
            self.placeholder[:, self.placeholder.shape[1] - cond.shape[1]:].copy_(cond)
            self.placeholder = None
            return out
        cond, uncond = self._gather(self.cond)
        self.cond = None
        return _output(uncond, return_dict)
