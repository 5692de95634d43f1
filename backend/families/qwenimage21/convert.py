"""The Qwen-Image 2.1 family's key conversions (torch; the worker reads them through families.conversions, the
controller never): its VAE's layout."""

from __future__ import annotations

from collections.abc import Callable


def qwenimage21_vae(sd: dict, config: dict) -> dict:
    """Qwen-Image 2.1's VAE (qwen_image_2.1_vae_bf16.safetensors: ComfyUI's Wan 2.2 layout) in the names of
    diffusers' AutoencoderKLQwenImage21, which has no single-file converter in diffusers 0.42.1. Its keys are Wan
    2.2's with a fifth level, which the Wan family's converter renames (diffusers' own for the middle, head and
    quant layers); its convolutions see one frame, so ComfyUI stores them 3D with a temporal kernel of 1 where
    diffusers' are 2D: that axis is dropped (a longer temporal kernel is not this VAE and raises)."""
    from ..wan.convert import convert_wan22_vae

    out = {}
    for key, value in convert_wan22_vae(sd).items():
        if value.ndim == 5:
            if value.shape[2] != 1:
                raise ValueError(f"tensor '{key}' has a temporal kernel of {value.shape[2]}; Qwen-Image 2.1's VAE "
                                 "has 1 (is this Wan 2.2's VAE?)")
            value = value.squeeze(2)
        out[key] = value
    return out


# The VAE layouts (families/vaes.py) this family's converters read, by loader layout
VAE_CONVERTERS: dict[str, Callable[[dict, dict], dict]] = {"qwenimage21-vae": qwenimage21_vae}
