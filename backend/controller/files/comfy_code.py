"""What the controller reads from ComfyUI's own installed code, in ComfyUI's process: its package folder (the
tokenizers it bundles) and its FLUX.1 key map (for widths diffusers' converter does not read)."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path

from ...families.base import count
from ...protocol.errors import ModelError


def comfy_package_dir() -> Path | None:
    """ComfyUI's `comfy` package folder (its bundled tokenizers live there), without importing it."""
    spec = importlib.util.find_spec("comfy")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def flux1_key_map(shapes: Mapping[str, tuple]) -> tuple[tuple, ...]:
    """ComfyUI's own FLUX.1 key map (diffusers key -> BFL key, slice, transform), inverted by the worker: for
    widths diffusers' converter does not read. Needs ComfyUI (`comfy.utils`), present in ComfyUI's process."""
    try:
        import comfy.utils
    except ImportError:
        raise ModelError("diffusion_model: this FLUX.1 file is not 3072 wide, which diffusers' converter needs; "
                         "reading other widths uses ComfyUI's own key map, and ComfyUI is not importable here. "
                         "Run it from ComfyUI.") from None
    key_map = comfy.utils.flux_to_diffusers({"depth": count(shapes, "double_blocks."),
                                             "depth_single_blocks": count(shapes, "single_blocks."),
                                             "hidden_size": shapes["img_in.weight"][0]})
    entries = []
    for target, src in sorted(key_map.items()):
        if isinstance(src, str):
            src = (src, None)
        name, offset = src[0], src[1]
        transform = src[2] if len(src) > 2 else None
        if name not in shapes:
            continue
        if transform not in (None, comfy.utils.swap_scale_shift):
            raise ModelError(f"diffusion_model: ComfyUI's FLUX.1 key map uses a transform ({transform}) ComfyUI-TPU "
                             "does not know; this ComfyUI version is not supported for FLUX.1 files of this width.")
        dim, start, length = offset if offset is not None else (-1, 0, 0)
        entries.append((target, name, dim, start, length, "swap_scale_shift" if transform else ""))
    return tuple(entries)
