"""fp8 storage of the loaded denoiser (worker side): diffusers' own `enable_layerwise_casting`.

Applied once, right after loading and before the weights go to the device, so the device only ever holds the
fp8 copy. diffusers keeps the layers it should not round (norms, embedders, the input and output projections:
its `_skip_layerwise_casting_patterns`) in the compute dtype and casts every other layer's weights to the
compute dtype while it runs.
"""

from __future__ import annotations

from typing import Any

import torch

from ..protocol.spec import PipelineSpec
from .compiler import denoiser


def keep_in_storage_dtype(pipe: Any, spec: PipelineSpec, compute: torch.dtype) -> None:
    """The denoiser of `pipe` (and its second expert, Wan 2.2 A14B's transformer_2) stored in `spec.storage` (an
    fp8 dtype) and computed in `compute`; nothing without fp8 storage."""
    if not spec.storage:
        return
    storage = getattr(torch, spec.storage)
    for module in (denoiser(pipe)[1], getattr(pipe, "transformer_2", None)):
        if module is None:
            continue
        module.enable_layerwise_casting(storage_dtype=storage, compute_dtype=compute)
        with torch.no_grad():  # the layers left in the compute dtype may still view the loader's mapping of the
            for param in module.parameters():  # file, which would keep its pages in host memory: own copies
                if param.dtype != storage and not hasattr(param, "to_local"):
                    param.data = param.data.clone()


def compute_dtype_of(module: torch.nn.Module) -> torch.dtype | None:
    """The dtype a layer computes in when its weights are stored in another one (layerwise casting), else None."""
    registry = getattr(module, "_diffusers_hook", None)
    hook = registry.get_hook("layerwise_casting") if registry is not None else None
    return hook.compute_dtype if hook is not None else None


def compute_dtype_of_model(module: torch.nn.Module) -> torch.dtype:
    """The dtype a model computes in: its layers' compute dtype under layerwise casting, else its weights'."""
    for sub in module.modules():
        if (dtype := compute_dtype_of(sub)) is not None:
            return dtype
    return next(module.parameters()).dtype
