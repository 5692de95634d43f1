"""The SDXL family's key conversions (torch; the worker reads them through families.conversions, the controller
never): its LoRA layouts that diffusers does not read as they are."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_SDXL_COMFY = {"diffusion_model.": "lora_unet_", "text_encoders.clip_l.transformer.": "lora_te1_",
               "text_encoders.clip_g.transformer.": "lora_te2_"}


def sdxl_comfy(sd: dict, pipe_cls: Any) -> dict:
    """SDXL LoRAs saved by ComfyUI ('diffusion_model.…', 'text_encoders.clip_l/clip_g.transformer.…'): diffusers'
    SDXL loader converts only when every key has a kohya prefix; rename to kohya names (lora_unet_, lora_te1_,
    lora_te2_, the module path with underscores)."""
    out = {}
    for k, v in sd.items():
        old = next((p for p in _SDXL_COMFY if k.startswith(p)), None)
        if old is None:
            out[k] = v
            continue
        rest = k[len(old):]
        module, sep, suffix = rest.partition(".lora_")
        if not sep:  # <module>.alpha
            module, _, suffix = rest.rpartition(".")
            sep = "."
        out[f"{_SDXL_COMFY[old]}{module.replace('.', '_')}{sep}{suffix}"] = v
    return out


# The LoRA layouts diffusers does not read as they are, by name: whether a file's keys are in that layout,
# and the rewrite it needs before diffusers' load_lora_weights reads it
LORA_FORMATS: dict[str, tuple[Callable[[list[str]], bool], Callable[[dict, Any], dict]]] = {
    "comfyui-sdxl": (lambda keys: any(k.startswith(tuple(_SDXL_COMFY)) for k in keys), sdxl_comfy),
}
