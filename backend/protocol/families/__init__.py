"""The model families the pack runs, one module each: adding a family is adding a module here (listed in
`_MODULES`), its configs under backend/configs and its test fixtures.

`FAMILIES` holds them by id ("flux1"), `PIPELINES` each diffusers pipeline class they run ("FluxPipeline")
with how it runs (what `PipelineSpec.family` gives).
"""

from __future__ import annotations

from dataclasses import replace

from . import flux1, flux2, qwenimage, sd3, sdxl, wan, zimage
from .base import Configs, ControlNets, Embeddings, ModelFamily, Pipeline, Shapes, TextSlot

_MODULES = (flux1, flux2, sd3, sdxl, qwenimage, zimage, wan)

FAMILIES: dict[str, ModelFamily] = {m.FAMILY.id: m.FAMILY for m in _MODULES}
FROM_FILES: list[ModelFamily] = [f for f in FAMILIES.values() if f.files]  # the families whose artists' files load
PIPELINES: dict[str, Pipeline] = {p.class_name: replace(p, family=f.id) for f in FAMILIES.values()
                                  for p in f.pipelines}


def family_of(pipeline: Pipeline) -> ModelFamily:
    return FAMILIES[pipeline.family]


def recognise(shapes: Shapes) -> ModelFamily | None:
    """The family whose denoiser the shapes (key prefix removed) hold, None when they hold none."""
    return next((f for f in FAMILIES.values() if f.recognises(shapes)), None)


def names(families=None, last: str = " or ") -> str:
    """'FLUX.1, FLUX.2, SD3/SD3.5, SDXL, Qwen-Image or Wan': the families (all by default), for messages."""
    return _listed([f.name for f in (FAMILIES.values() if families is None else families)], last)


def _listed(items: list[str], last: str = " and ") -> str:
    return ", ".join(items[:-1]) + last + items[-1] if len(items) > 1 else "".join(items)


def conditioned_names() -> str:
    """'FLUX.1, SD3 and SDXL': the families Sample's CONDITIONING inputs map onto, each by its text-to-image
    pipeline's name (FLUX.1's tools share FLUX.1's text encoders)."""
    first = {}
    for p in PIPELINES.values():
        if p.embeddings:
            first.setdefault(p.family, p.name)
    return _listed(list(first.values()))


def single_file_names() -> str:
    """'FLUX.1, SD3/SD3.5 and SDXL': the families whose all-in-one checkpoints diffusers reads."""
    return names([f for f in FAMILIES.values() if f.single_file], " and ")


def text_encoders_needed() -> str:
    """'FLUX.1: CLIP-L and T5-XXL; ...': the text encoders each published model reads, for tooltips."""
    from .text_encoders import KINDS

    return "; ".join(
        f"{c.name or f.name}: " + _listed([KINDS[s.kind].short + (" (optional)" if s.optional else "")
                                           for s in c.text_encoders])
        for f in FROM_FILES for c in f.configs)


__all__ = ["FAMILIES", "FROM_FILES", "PIPELINES", "Configs", "ControlNets", "Embeddings", "ModelFamily", "Pipeline", "TextSlot", "conditioned_names", "family_of", "names",
           "recognise", "single_file_names", "text_encoders_needed"]
