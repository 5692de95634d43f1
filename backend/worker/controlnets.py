"""ControlNets in the worker (Apply ControlNet): loaded beside the pipeline, never into it, and run by the family's
ControlNet pipeline made from the loaded one with `from_pipe` (the same modules: nothing of the image model is
copied or reloaded; LoRAs, a compiled denoiser and the prompt cache carry over).

The ControlNet runs eager on every rank, whole: under Shard TP the transformer is sharded and the ControlNet
replicated (its residuals are added to hidden states every TP rank holds whole); each Data Parallel replica has its
own; under CFG Parallel its residuals are split with the denoiser's batch (cfg_parallel.py). Strength, start, end
and the control image are call arguments: changing them never reloads, and never recompiles a compiled denoiser.
The control image is fitted to the size being made as ComfyUI's ControlNets fit it (comfy.utils.common_upscale
with 'nearest-exact' and a centre crop).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..families import ControlNets
from ..protocol.spec import ControlNetRef, PipelineSpec, control_key
from . import images
from .loading import from_linked_file, safetensors_only


def fit_control(image: np.ndarray, width: int, height: int) -> np.ndarray:
    """One IMAGE [H, W, C] as float32 RGB [1, height, width, 3], as ComfyUI resizes a control image: the centre
    cropped to the output's aspect ratio, then scaled with 'nearest-exact'; grey expanded, alpha dropped."""
    t = torch.from_numpy(np.ascontiguousarray(image, dtype=np.float32)).permute(2, 0, 1)[None]
    t = t.expand(-1, 3, -1, -1) if t.shape[1] == 1 else t[:, :3]
    old_h, old_w = t.shape[2:]
    old_aspect, new_aspect = old_w / old_h, width / height
    x = round((old_w - old_w * (new_aspect / old_aspect)) / 2) if old_aspect > new_aspect else 0
    y = round((old_h - old_h * (old_aspect / new_aspect)) / 2) if old_aspect < new_aspect else 0
    t = t[:, :, y:old_h - y, x:old_w - x]
    if t.shape[2:] != (height, width):
        t = torch.nn.functional.interpolate(t, size=(height, width), mode="nearest-exact")
    return t.permute(0, 2, 3, 1).contiguous().numpy()


def _class(name: str) -> type:
    import diffusers
    import diffusers.models.controlnets as controlnet_models

    return getattr(diffusers, name, None) or getattr(controlnet_models, name)


def load_controlnet(ref: ControlNetRef, dtype: Any, kind: ControlNets) -> Any:
    """The ControlNet of `ref` on the CPU in `dtype`: a diffusers folder as it is; a single file through a folder
    laid out from its config (read from its tensors by the controller) and a link to the file, or, for the kinds
    diffusers' single-file loader converts (Z-Image's), through from_single_file with that config."""
    cls = _class(ref.model)
    if Path(ref.path).is_dir():
        return cls.from_pretrained(ref.path, dtype=dtype, local_files_only=True, use_safetensors=safetensors_only())
    config = {"_class_name": ref.model, **json.loads(ref.config)}
    if not kind.single_file:
        return from_linked_file(cls, ref.path, config, dtype)
    with tempfile.TemporaryDirectory(prefix="comfyui-tpu-controlnet-") as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(config))
        return cls.from_single_file(ref.path, config=tmp, dtype=dtype, local_files_only=True)


class ControlNetPipelines:
    """The ControlNets the current spec names (loaded once each) and the ControlNet pipelines made from the loaded
    pipeline with them, until it is unloaded."""

    def __init__(self, status: Callable[[str], None]):
        self.status = status
        self.pipe: Any = None
        self.models: dict[tuple, Any] = {}
        self.derived: dict[tuple, Any] = {}

    def forget(self) -> None:
        self.pipe, self.models, self.derived = None, {}, {}

    @staticmethod
    def _key(ref: ControlNetRef) -> tuple:
        stat = os.stat(ref.path)
        return ref.path, stat.st_mtime_ns, ref.model, ref.config

    def for_task(self, pipe: Any, spec: PipelineSpec, task: str, device: Any) -> Any:
        """The ControlNet pipeline that runs `task` with the spec's ControlNets; None when it has none."""
        if pipe is not self.pipe:
            self.forget()
            self.pipe = pipe
        if not spec.controlnets:
            return None
        keys = [self._key(ref) for ref in spec.controlnets]
        for key in set(self.models) - set(keys):  # no longer chained: freed (and the pipelines made with it)
            del self.models[key]
            self.derived = {k: v for k, v in self.derived.items() if key not in k[1]}
        for key, ref in zip(keys, spec.controlnets, strict=True):
            if key not in self.models:
                self.status(f"loading ControlNet {ref.name} ({ref.model})")
                model = load_controlnet(ref, pipe.dtype, controlnet_kind(spec)).to(device).eval().requires_grad_(False)
                self.models[key] = model
        kind = controlnet_kind(spec)
        name = {images.TEXT: kind.text2img, images.IMG2IMG: kind.img2img, images.INPAINT: kind.inpaint}[task]
        at = (name, tuple(keys))
        if at not in self.derived:
            nets = [self.models[k] for k in keys]  # the same file chained twice: one module, run twice
            controlnet = nets[0] if len(nets) == 1 else _class(kind.multi)(nets)
            self.derived[at] = images.derive(pipe, name, controlnet=controlnet)
        return self.derived[at]


def controlnet_kind(spec: PipelineSpec) -> ControlNets:
    return next(k for k in spec.family.controlnets if k.model == spec.controlnets[0].model)


def add_inputs(spec: PipelineSpec, task: str, kwargs: dict, arrays: dict, index: int) -> None:
    """Puts the ControlNets' arguments into the call: image `index`'s control images (cycling through each
    control image batch) fitted to the call's size, and each ControlNet's strength, start, end and union mode; one
    value for one ControlNet, a list per ControlNet for several."""
    if not spec.controlnets:
        return
    kind = controlnet_kind(spec)
    width, height = kwargs["width"], kwargs["height"]
    refs = spec.controlnets
    pictures = []
    for i in range(len(refs)):
        batch = arrays[control_key(i)]
        pictures.append(fit_control(batch[index % len(batch)], width, height))
    several = len(refs) > 1

    def each(values: list) -> Any:
        return values if several else values[0]

    modes = [ref.mode if ref.mode >= 0 else None for ref in refs]
    if kind.mode_lists:  # SDXL union: a list of images and modes per ControlNet
        kwargs["control_image"] = each([[p] for p in pictures])
        kwargs["control_mode"] = each([[m] for m in modes])
    else:
        kwargs[kind.image_arg if task == images.TEXT else "control_image"] = each(pictures)
        if kind.modes and any(m is not None for m in modes):
            kwargs["control_mode"] = each(modes)
    kwargs["controlnet_conditioning_scale"] = each([ref.strength for ref in refs])
    if kind.steps_window:  # (Z-Image's pipelines apply it at every step: checked to be 0 and 1)
        kwargs["control_guidance_start"] = each([ref.start for ref in refs])
        kwargs["control_guidance_end"] = each([ref.end for ref in refs])


@contextlib.contextmanager
def seeded(spec: PipelineSpec, seed: int) -> Iterator[None]:
    """Around one call: torch's global RNG seeded with the image's seed where the ControlNet pipeline draws from it
    (its state outside the call untouched)."""
    if not spec.controlnets or not controlnet_kind(spec).global_rng:
        yield
        return
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def warmup_arrays(spec: PipelineSpec, width: int, height: int) -> dict[str, np.ndarray]:
    """Grey control images for a compile warm-up, so that it compiles the shapes the ControlNets' calls have."""
    return {control_key(i): np.full((1, height, width, 3), 0.5, np.float32) for i in range(len(spec.controlnets))}
