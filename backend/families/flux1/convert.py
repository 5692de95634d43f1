"""The FLUX.1 family's key conversions (torch; the worker reads them through families.conversions, the controller
never): its LoRA layouts that diffusers does not read as they are."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def flux_kohya(sd: dict, pipe_cls: Any) -> dict:
    """Two gaps of diffusers' kohya/ComfyUI FLUX.1 converter (`_convert_sd_scripts_to_ai_toolkit`): it ignores
    the .alpha of final_layer ('# TODO: alphas.'), and it names the top-level modules (x_embedder,
    context_embedder, time_text_embed, norm_out, proj_out) without the 'transformer.' prefix, which
    load_lora_into_transformer then drops silently. Fold those alphas into lora_up, convert, add the prefix."""
    sd = dict(sd)
    for k in [k for k in sd if k.startswith("lora_unet_final_layer_") and k.endswith(".alpha")]:
        base = k[: -len(".alpha")]
        rank = sd[base + ".lora_down.weight"].shape[0]
        sd[base + ".lora_up.weight"] = sd[base + ".lora_up.weight"] * (float(sd.pop(k)) / rank)
    converted = pipe_cls.lora_state_dict(sd)
    converted = converted[0] if isinstance(converted, tuple) else converted
    return {k if k.startswith(("transformer.", "text_encoder.")) else f"transformer.{k}": v
            for k, v in converted.items()}


# The LoRA layouts diffusers does not read as they are, by name: whether a file's keys are in that layout,
# and the rewrite it needs before diffusers' load_lora_weights reads it
LORA_FORMATS: dict[str, tuple[Callable[[list[str]], bool], Callable[[dict, Any], dict]]] = {
    "kohya-flux1": (lambda keys: any(k.endswith(".lora_down.weight") for k in keys), flux_kohya),
}
