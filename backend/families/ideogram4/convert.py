"""The Ideogram 4 family's key conversions (torch; the worker reads them through families.conversions, the controller
never): its transformer's layout."""

from __future__ import annotations

from collections.abc import Callable


def ideogram4_transformer(sd: dict, config: dict) -> dict:
    """An Ideogram 4 transformer file in ComfyUI's layout (ideogram4_*.safetensors, both the conditional and the
    unconditional one; comfy/ldm/ideogram4/model.py) in the names of diffusers' Ideogram4Transformer2DModel, which
    has no single-file converter in diffusers 0.42.1. The two differ only in each block's attention: ComfyUI fuses
    the query, key and value rows in `attention.qkv` (its forward views them as [3, heads, head size]) and calls
    the output `attention.o` (diffusers: `to_q`, `to_k`, `to_v`, `to_out.0`); every other name is the same. The
    rows are split with `chunk`, which keeps ComfyUI's quantized rows quantized (worker.quantized.RowSplitMode)."""
    out = {}
    for key, value in sd.items():
        if ".attention.qkv." in key:
            for name, rows in zip(("to_q", "to_k", "to_v"), value.chunk(3, dim=0), strict=True):
                out[key.replace(".qkv.", f".{name}.")] = rows
        else:
            out[key.replace(".attention.o.", ".attention.to_out.0.")] = value
    return out


# The denoiser layouts (families' `layout`, the family id here) this family's converters read
DENOISER_CONVERTERS: dict[str, Callable[[dict, dict], dict]] = {"ideogram4": ideogram4_transformer}
