"""The model families the pack runs, one module each: adding a family is adding a module here (listed in
`_MODULES`), its configs under backend/configs and its test fixtures.

`FAMILIES` holds them by id ("flux1"), `PIPELINES` each diffusers pipeline class they run ("FluxPipeline")
with how it runs (what `PipelineSpec.family` gives).
"""

from __future__ import annotations

from dataclasses import replace

from . import flux1, flux2, qwenimage, sd3, sdxl
from .base import Configs, ModelFamily, Pipeline, Shapes, TextSlot

_MODULES = (flux1, flux2, sd3, sdxl, qwenimage)

FAMILIES: dict[str, ModelFamily] = {m.FAMILY.id: m.FAMILY for m in _MODULES}
PIPELINES: dict[str, Pipeline] = {p.class_name: replace(p, family=f.id) for f in FAMILIES.values()
                                  for p in f.pipelines}


def family_of(pipeline: Pipeline) -> ModelFamily:
    return FAMILIES[pipeline.family]


def recognise(shapes: Shapes) -> ModelFamily | None:
    """The family whose denoiser the shapes (key prefix removed) hold, None when they hold none."""
    return next((f for f in FAMILIES.values() if f.recognises(shapes)), None)


def names(families=None) -> str:
    """'FLUX.1, FLUX.2, SD3/SD3.5, SDXL or Qwen-Image': the families, for messages."""
    found = [f.name for f in (families or FAMILIES.values())]
    return ", ".join(found[:-1]) + " or " + found[-1] if len(found) > 1 else "".join(found)


__all__ = ["FAMILIES", "PIPELINES", "Configs", "ModelFamily", "Pipeline", "TextSlot", "family_of", "names",
           "recognise"]
