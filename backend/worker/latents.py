"""ComfyUI's LATENT on the worker: taken from what the pipeline hands its VAE to decode, handed in as what its
VAE would have encoded.

ComfyUI's LATENT is the VAE's own latent space, unscaled: KSampler hands it back so and VAE Decode decodes it as
it is. Each diffusers pipeline scales, shifts and packs its latents its own way (FLUX.1, SD3, Z-Image: shift
and scale; SDXL: scale; Qwen-Image: mean and std per channel; FLUX.1 and Qwen-Image pack 2×2 tokens) and undoes
it right before `vae.decode`. So the argument of `vae.decode` is the LATENT, and the pipeline's own code does
the conversion for every family. Coming in, the family's image-to-image pipeline gets a grey image of the size
and its `vae.encode` returns the LATENT: the pipeline scales and packs it its own way. FLUX.2's LATENT packs
2×2 latent pixels into channels normalised by the VAE's batch-norm statistics (ComfyUI's FLUX.2 VAE does that
inside), done here as diffusers' FLUX.2 pipeline does it for its image latents.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from ..families import Pipeline
from ..protocol.errors import Interrupted, ModelError

PLAUSIBLE = 1e3  # larger than any VAE's latent values (FLUX, SD3, SDXL, Wan: within tens): beyond, blame the input


class _Stopped(Exception):
    """Raised in place of the VAE decode when only the latent is wanted."""


@contextlib.contextmanager
def _replaced(module: Any, name: str, method: Any) -> Iterator[None]:
    """`module.name` is `method` for the duration (an instance attribute over the class's method)."""
    had = name in module.__dict__
    original = module.__dict__.get(name)
    setattr(module, name, method)
    try:
        yield
    finally:
        if had:
            setattr(module, name, original)
        else:
            delattr(module, name)


@contextlib.contextmanager
def captured(pipe: Any, into: list[torch.Tensor], decode: bool) -> Iterator[None]:
    """Records what the pipeline call in the block hands `vae.decode` (on the CPU, float32) into `into`; without
    `decode` the call stops right there (the block ends normally, the VAE never runs)."""
    vae = pipe.vae
    dtype, decode_with = vae.dtype, vae.decode

    def record(z: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        into.append(z.detach().float().cpu())
        if not decode:
            raise _Stopped
        return decode_with(z, *args, **kwargs)

    with _replaced(vae, "decode", record):
        try:
            yield
        except _Stopped:
            if vae.dtype != dtype:  # SDXL upcasts a float16 VAE just before decoding
                vae.to(dtype)
            if hasattr(pipe, "maybe_free_model_hooks"):  # a modular pipeline has no offload hooks to free
                pipe.maybe_free_model_hooks()  # what the call does after its decode (model offload)


@contextlib.contextmanager
def encoded_as(pipe: Any, latent: np.ndarray) -> Iterator[None]:
    """The pipeline call in the block finds `latent` (one image's LATENT) where it encodes its image."""
    vae = pipe.vae
    z = torch.from_numpy(np.ascontiguousarray(latent))[None]

    def encode(x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        return SimpleNamespace(latents=z.to(device=x.device, dtype=x.dtype))  # what retrieve_latents reads

    with _replaced(vae, "encode", encode):
        yield


def decode(pipe: Any, family: Pipeline, latent: np.ndarray, stop: Callable[[], bool] | None = None,
           say: Callable[[str], None] | None = None) -> np.ndarray:
    """ComfyUI's LATENT decoded as the pipeline decodes (its VAE, its image processor): images [B, H, W, C]
    float32 in 0..1. VAE Decode (TPU). Image by image, as Sample decodes, so the peak is one image's whatever
    the batch (the controller's pixel budget is one image's); `stop()` is asked between images, `say` told
    which image decodes."""
    vae = pipe.vae
    z = torch.from_numpy(np.ascontiguousarray(latent))
    if family.latent_patch > 1:  # FLUX.2: ComfyUI's packing and batch norm undone, as its pipeline does
        bn = vae.bn
        std = torch.sqrt(bn.running_var.detach().float().cpu().view(1, -1, 1, 1) + vae.config.batch_norm_eps)
        z = _flux2_packing()._unpatchify_latents(z * std + bn.running_mean.detach().float().cpu().view(1, -1, 1, 1))
    upcast = vae.dtype == torch.float16 and vae.config.get("force_upcast", False)  # as SDXL's pipeline does
    out = []
    with torch.inference_mode():
        if upcast:
            vae.to(torch.float32)
        try:
            for i in range(len(z)):
                if stop is not None and stop():
                    raise Interrupted(Interrupted.DEFAULT)
                if say is not None and len(z) > 1:
                    say(f"VAE: decoding image {i + 1}/{len(z)}…")
                image = vae.decode(z[i:i + 1].to(pipe._execution_device, vae.dtype), return_dict=False)[0]
                if not bool(torch.isfinite(image).all()):  # postprocess would save them black
                    raise ModelError(_not_finite(latent, i, vae.dtype))
                if image.ndim == 5:  # Qwen-Image's Wan VAE: one frame
                    image = image[:, :, 0]
                out.append(np.asarray(pipe.image_processor.postprocess(image, output_type="np"), dtype=np.float32))
                del image
        finally:
            if upcast:
                vae.to(torch.float16)
    pixels = np.concatenate(out)
    return np.ascontiguousarray(pixels[..., :3]) if family.alpha else pixels  # ComfyUI's IMAGE: RGB


def _not_finite(latent: np.ndarray, index: int, dtype: torch.dtype) -> str:
    """Why VAE Decode refuses image `index`: its latent's largest value, the input it came through and the fix."""
    largest = float(np.abs(latent[index]).max())
    return (f"samples: image {index + 1} of the latent decodes to values that are not numbers (NaN or infinity) in "
            f"{str(dtype).replace('torch.', '')}, which would be saved as a black image, so VAE Decode (TPU) failed "
            f"instead. Its largest value is {largest:.3g} (a VAE's latents are within about ±{PLAUSIBLE:g}): check "
            "the nodes that made it (a LoadLatent file, a latent math node); a latent of ordinary values decoding "
            "so points at the VAE's weights instead.")


def _flux2_packing() -> type:
    """Diffusers' FLUX.2 pipeline, whose static helpers pack and unpack 2x2 latent pixels: the LATENT layout of
    every family with latent_patch 2 (FLUX.2, and FLUX 3 on the same VAE, whose modular pipeline has no such
    helpers of its own)."""
    from diffusers import Flux2Pipeline

    return Flux2Pipeline


def comfy_layout(pipe: Any, family: Pipeline, z: torch.Tensor) -> np.ndarray:
    """The VAE's latents as ComfyUI's LATENT lays them out (FLUX.2: packed 2×2 and batch-normalised)."""
    if family.latent_patch > 1:
        bn = pipe.vae.bn
        mean = bn.running_mean.detach().float().cpu().view(1, -1, 1, 1)
        std = torch.sqrt(bn.running_var.detach().float().cpu().view(1, -1, 1, 1) + pipe.vae.config.batch_norm_eps)
        z = (_flux2_packing()._patchify_latents(z) - mean) / std
    return z.numpy()
