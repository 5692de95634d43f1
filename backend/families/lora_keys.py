"""LoRA key renamings that several families' converters (families/<id>/convert.py) share."""

from __future__ import annotations


def up_down_as_a_b(sd: dict) -> dict:
    """ComfyUI's and kohya's 'lora_down/lora_up' pairs as peft's 'lora_A/lora_B', alpha / rank folded into
    lora_B (what ComfyUI applies) and the .alpha entries dropped; other keys kept."""
    out = {}
    for k, v in sd.items():
        if k.endswith(".lora_down.weight"):
            base = k[: -len(".lora_down.weight")]
            alpha = sd.get(base + ".alpha")
            out[base + ".lora_A.weight"] = v
            out[base + ".lora_B.weight"] = sd[base + ".lora_up.weight"] * (
                float(alpha) / v.shape[0] if alpha is not None else 1.0)
        elif not k.endswith((".lora_up.weight", ".alpha")):
            out[k] = v
    return out
