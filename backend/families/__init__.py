"""The model families the pack runs, one folder each: adding a family is adding a folder here, plus its tests and
a workflow. The registry finds the folders (every sub-package whose `__init__` declares `FAMILY`).

A family folder holds:
- `__init__.py`: its declaration (`FAMILY`, a `ModelFamily`), torch-free: both processes read it;
- `convert.py` (where it has any): its key conversions (LoRA formats, VAE and denoiser converters), torch: the
  worker reads it through `conversions()`, the controller never (tests/test_families.py holds it to that);
- `tiny.py`: its tiny random-weight builders for the tests, `tpu-check` and `make-tiny-models` (torch);
- `configs/<model>/`: the configs of its published models (diffusers' layout, read by both sides).

`FAMILIES` holds them by id ("flux1"), `PIPELINES` each diffusers pipeline class they run ("FluxPipeline")
with how it runs (what `PipelineSpec.family` gives).
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import ModuleType

from .base import Configs, ControlNets, Embeddings, ModelFamily, Modular, Pipeline, Shapes, TextSlot, count

_HERE = Path(__file__).resolve().parent
_MODULES: tuple[ModuleType, ...] = tuple(sorted(
    (m for m in (importlib.import_module(f"{__name__}.{i.name}") for i in pkgutil.iter_modules(__path__) if i.ispkg)
     if hasattr(m, "FAMILY")), key=lambda m: (m.FAMILY.order, m.FAMILY.id)))

FAMILIES: dict[str, ModelFamily] = {m.FAMILY.id: m.FAMILY for m in _MODULES}
# the configs folders of every family by name ("wan22-ti2v-5b" -> backend/families/wan/configs/wan22-ti2v-5b)
CONFIGS: dict[str, Path] = {d.name: d for m in _MODULES for d in sorted((_HERE / m.__name__.rsplit(".", 1)[1]
                                                                         / "configs").glob("*")) if d.is_dir()}
FROM_FILES: list[ModelFamily] = [f for f in FAMILIES.values() if f.files]  # the families whose artists' files load
PIPELINES: dict[str, Pipeline] = {p.class_name: replace(p, family=f.id) for f in FAMILIES.values()
                                  for p in f.pipelines}


def config_dir(folder: str) -> Path:
    """The folder of a published model's configs (`Configs.folder`), in the family folder that owns it."""
    try:
        return CONFIGS[folder]
    except KeyError:
        raise KeyError(f"no family ships the configs {folder!r} (known: {', '.join(CONFIGS)})") from None


def conversions(family_id: str) -> ModuleType | None:
    """The family's `convert` module (torch; for the worker and the tools), None where it has none."""
    module = next(m for m in _MODULES if m.FAMILY.id == family_id).__name__ + ".convert"
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name != module:
            raise
        return None


@functools.cache
def family_table(name: str) -> dict[str, Callable]:
    """Every family's table `name` of its convert.py (torch; worker only), by loader layout: VAE_CONVERTERS
    ("wan22-vae": Wan's), DENOISER_CONVERTERS ("ideogram4": where diffusers has none), RENAMES (names diffusers'
    single-file converter misses), TOKENIZERS (made from a tensor of the text encoder's file)."""
    return {layout: fn for f in FAMILIES.values() for layout, fn in getattr(conversions(f.id), name, {}).items()}


def module(family_id: str, name: str) -> ModuleType:
    """A module of the family's own folder that its declaration names (Pipeline.audio_module, latent_upscale;
    torch, worker only), so that the worker's generic code names no family."""
    return importlib.import_module(next(m for m in _MODULES if m.FAMILY.id == family_id).__name__ + "." + name)


def tiny_builders(family_id: str) -> ModuleType:
    """The family's `tiny` module (torch): its tiny random-weight pipelines."""
    return importlib.import_module(next(m for m in _MODULES if m.FAMILY.id == family_id).__name__ + ".tiny")


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


def true_cfg_names() -> str:
    """'FLUX.1 and FLUX.1 Kontext': the pipelines with a true CFG scale of their own (Sampling Options)."""
    return _listed([p.name for p in PIPELINES.values() if p.true_cfg])


def pipeline_names(holds: Callable[[Pipeline], bool], last: str = " and ",
                   label: Callable[[Pipeline], str] | None = None) -> str:
    """The pipelines `holds` is true of, each name once, in the registry's order: a list a message or tooltip
    shows, made from the declarations so that a new family joins it."""
    return _listed(list(dict.fromkeys((label or (lambda p: p.name))(p) for p in PIPELINES.values() if holds(p))),
                   last)


def family_names(holds: Callable[[Pipeline], bool], last: str = " and ", every: bool = False) -> str:
    """The families with a pipeline `holds` is true of (`every`: all of whose pipelines it is true of)."""
    test = all if every else any
    return names([f for f in FAMILIES.values() if test(holds(p) for p in PIPELINES.values() if p.family == f.id)],
                 last)


def inpainting_names(last: str = " and ") -> str:
    """'FLUX.1, FLUX.1 Fill, ..., Z-Image': the pipelines with an inpainting pipeline (Sample's image and mask)."""
    return pipeline_names(lambda p: p.inpaint is not None, last)


def reference_names(last: str = " and ") -> str:
    """'FLUX.1 Kontext, FLUX.2, ...': the pipelines that take Sample's image as a reference image."""
    return pipeline_names(lambda p: p.references, last)


def cfg_parallel_names(last: str = " and ") -> str:
    """'FLUX.1 with true CFG, ..., SD3, SDXL, ...': the pipelines that run two denoiser passes per step, which CFG
    Parallel splits ("models": two models, as Ideogram 4 runs them, it does not; the ones with a true CFG scale only when it is on; a distilled_key marks base models)."""
    return pipeline_names(lambda p: p.cfg_passes in ("batch", "branches"), last, lambda p: p.name + (
        " with true CFG" if p.true_cfg else " base models" if p.distilled_key else ""))


def context_parallel_names(last: str = " and ", split: bool = True) -> str:
    """'FLUX.1, FLUX.2, Qwen-Image and Wan': the families whose transformers diffusers ships a context-parallel
    plan for (`split=False`: the ones it ships none for)."""
    return family_names(lambda p: p.cp_plan == split, last, every=not split)


def shard_tp_names(last: str = " and ", split: bool = True) -> str:
    """'FLUX.1, FLUX.2 and Qwen-Image': the families with a tensor-parallel plan (`split=False`: without)."""
    return family_names(lambda p: p.tp_plan == split, last, every=not split)


def controlnet_names(last: str = " and ") -> str:
    """'FLUX.1, SD3/SD3.5, SDXL, Qwen-Image and Z-Image': the families that take ControlNets (Apply ControlNet)."""
    return family_names(lambda p: bool(p.controlnets), last)


def step_cache_names(kind: str, last: str = " and ") -> str:
    """'FLUX.1, Qwen-Image and Wan': the pipelines a step cache kind (Sampling Options) suits."""
    return pipeline_names(lambda p: kind in p.step_caches, last)


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


__all__ = ["CONFIGS", "FAMILIES", "FROM_FILES", "PIPELINES", "Configs", "config_dir", "conversions", "family_table", "tiny_builders", "ControlNets", "Embeddings", "ModelFamily", "Modular", "Pipeline", "TextSlot", "conditioned_names", "family_of", "names",
           "recognise", "single_file_names", "true_cfg_names", "text_encoders_needed", "pipeline_names", "family_names",
           "inpainting_names", "reference_names", "cfg_parallel_names", "context_parallel_names", "shard_tp_names",
           "controlnet_names", "step_cache_names", "count"]
