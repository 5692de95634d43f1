"""The FLUX.2 family's key conversions (torch; the worker reads them through families.conversions, the controller
never): its LoRA layouts that diffusers does not read as they are, and its VAE's layout."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..lora_keys import up_down_as_a_b


def flux2_native(sd: dict, pipe_cls: Any) -> dict:
    """FLUX.2 files with ComfyUI/BFL names ('diffusion_model.…lora_up/lora_down' with .alpha): diffusers sends
    them to its kohya converter, which drops them (only 'lora_A/lora_B' take its BFL path), and that BFL path maps
    final_layer.adaLN_modulation.1 to norm_out.linear without the (shift, scale) → (scale, shift) swap its own
    single-file converter applies. Fold alpha into up, rename, and swap."""
    from diffusers.loaders.lora_conversion_utils import swap_scale_shift

    out = up_down_as_a_b(sd)
    for k in [k for k in out if "final_layer.adaLN_modulation.1" in k and k.endswith(".lora_B.weight")]:
        out[k] = swap_scale_shift(out[k])
    return out


# The LoRA layouts diffusers does not read as they are, by name: whether a file's keys are in that layout,
# and the rewrite it needs before diffusers' load_lora_weights reads it
LORA_FORMATS: dict[str, tuple[Callable[[list[str]], bool], Callable[[dict, Any], dict]]] = {
    "bfl-flux2": (lambda keys: any(k.startswith("diffusion_model.") for k in keys), flux2_native),
}


def flux2_vae(sd: dict, config: dict) -> dict:
    """FLUX.2's VAE: the LDM layout (diffusers' converter) plus the batch-norm statistics of its latents."""
    from diffusers.loaders.single_file_utils import convert_ldm_vae_checkpoint

    converted = convert_ldm_vae_checkpoint(sd, config)
    converted.update({k: v for k, v in sd.items() if k.startswith("bn.")})
    return converted


# The VAE layouts (families/vaes.py) this family's converters read, by loader layout
VAE_CONVERTERS: dict[str, Callable[[dict, dict], dict]] = {"flux2-vae": flux2_vae}
