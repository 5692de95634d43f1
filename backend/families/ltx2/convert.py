"""The LTX-2 family's key conversions (torch; the worker reads them through families.conversions, the controller
never): the LoRA layout that diffusers does not read as it is."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..lora_keys import up_down_as_a_b

_NATIVE = ("diffusion_model.", "text_embedding_projection.")


def up_down(keys: list[str]) -> bool:
    """ComfyUI's LoraSave (and kohya-style extractors): 'diffusion_model.<native>.lora_down/lora_up' (with .alpha
    where the trainer kept one). Lightricks' own files ('….lora_A/lora_B') diffusers reads as they are."""
    return any(k.startswith(_NATIVE) and k.endswith(".lora_down.weight") for k in keys)


def ltx2_up_down(sd: dict, pipe_cls: Any) -> dict:
    """diffusers 0.42.1's LTX-2 converter renames the native module names but keeps 'lora_down/lora_up', which
    its peft loader then finds no rank in (an IndexError in get_peft_kwargs): rename them to lora_A / lora_B, with
    alpha / rank folded into lora_B (what ComfyUI applies), and drop the .alpha entries."""
    return up_down_as_a_b(sd)


# The LoRA layouts diffusers does not read as they are, by name: whether a file's keys are in that layout,
# and the rewrite it needs before diffusers' load_lora_weights reads it
LORA_FORMATS: dict[str, tuple[Callable[[list[str]], bool], Callable[[dict, Any], dict]]] = {
    "comfy-ltx2": (up_down, ltx2_up_down),
}
