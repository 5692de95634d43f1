"""The Z-Image family's key conversions (torch; the worker reads them through families.conversions, the controller
never): its LoRA layouts that diffusers does not read as they are."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_ZIMAGE_NATIVE = (("final_layer.", "all_final_layer.2-1."), ("x_embedder.", "all_x_embedder.2-1."))


def zimage_native(sd: dict, pipe_cls: Any) -> dict:
    """Z-Image files in ComfyUI's own names ('diffusion_model.layers.N.attention.qkv.lora_up/lora_down', what
    ComfyUI's LoraSave and trainer write): diffusers' Z-Image converter splits a fused qkv only in the dotted
    'qkv.lora.down' spelling of sd-scripts, and knows neither 'final_layer.' nor 'x_embedder.'. Rename those to the
    spellings it reads; it then splits qkv (the down shared, the up by rows), maps 'out', and folds alpha."""
    out = {}
    for k, v in sd.items():
        if k.startswith("diffusion_model."):
            k = k[len("diffusion_model."):]
            for old, new in _ZIMAGE_NATIVE:
                k = new + k[len(old):] if k.startswith(old) else k
            if ".attention.qkv.lora_" in k:
                k = k.replace(".lora_down.", ".lora.down.").replace(".lora_up.", ".lora.up.")
            k = "diffusion_model." + k
        out[k] = v
    return out


# The LoRA layouts diffusers does not read as they are, by name: whether a file's keys are in that layout,
# and the rewrite it needs before diffusers' load_lora_weights reads it
LORA_FORMATS: dict[str, tuple[Callable[[list[str]], bool], Callable[[dict, Any], dict]]] = {
    "comfyui-zimage": (lambda keys: any(k.startswith("diffusion_model.") for k in keys), zimage_native),
}
