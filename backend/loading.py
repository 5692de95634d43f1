"""Loads a diffusers pipeline one component at a time, so the UI can say which part is loading.

`DiffusionPipeline.from_pretrained` loads every component in one call and offers no per-component hook.
Its public way to take over is to pass components already loaded: the weighted ones (torch modules from
diffusers or transformers: transformer, text encoders, VAE) are loaded here one by one, each announced
with its size on disk, and `from_pretrained` then adds the light parts (tokenizers, scheduler, processors)
and builds the pipeline. Each component gets the same arguments diffusers would give it, plus any
per-component extras (tensor-parallel configs).

Runs inside a worker process.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .models import read_json, safetensors_only

_WEIGHT_LIBRARIES = ("diffusers", "transformers")


@dataclass(frozen=True)
class Component:
    """One weighted component of a pipeline folder."""

    name: str  # the subfolder and the pipeline's attribute, e.g. "text_encoder_2"
    library: str  # "diffusers" or "transformers"
    class_name: str
    size_bytes: int  # weights on disk

    def describe(self) -> str:
        return f"{self.name} ({self.class_name}, {format_bytes(self.size_bytes)})"


def format_bytes(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def weighted_components(model_path: str) -> list[Component]:
    """The components of the folder that hold weights, in model_index.json order (reads files only)."""
    root = Path(model_path)
    found = []
    for name, value in read_json(root / "model_index.json").items():
        if name.startswith("_") or not isinstance(value, list) or len(value) != 2 or None in value:
            continue
        library, class_name = value
        if library not in _WEIGHT_LIBRARIES or not _is_module_class(library, class_name):
            continue  # tokenizers, schedulers, processors, pipeline-specific classes: diffusers loads those
        folder = root / name
        size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else 0
        found.append(Component(name, library, class_name, size))
    return found


def load_pipeline(model_path: str, dtype: Any, status: Callable[[str], None],
                  extra_kwargs: dict[str, dict] | None = None) -> Any:
    """The pipeline in `model_path`, loaded on the CPU, announcing each component through `status`.

    `extra_kwargs[name]` is added to component `name`'s from_pretrained call. A component that fails to
    load raises an OSError naming it."""
    from diffusers import DiffusionPipeline

    common = {"dtype": dtype, "local_files_only": True, "use_safetensors": safetensors_only()}
    parts = weighted_components(model_path)
    loaded: dict[str, Any] = {}
    for i, part in enumerate(parts, 1):
        status(f"loading {part.describe()} · component {i} of {len(parts)}")
        cls = getattr(importlib.import_module(part.library), part.class_name)
        try:
            loaded[part.name] = cls.from_pretrained(model_path, subfolder=part.name, **common,
                                                    **(extra_kwargs or {}).get(part.name, {}))
        except OSError as e:
            raise OSError(f"component '{part.name}': {e}") from e
    status("loading tokenizers and scheduler, building the pipeline")
    return DiffusionPipeline.from_pretrained(model_path, **loaded, **common)


def _is_module_class(library: str, class_name: str) -> bool:
    import torch

    cls = getattr(importlib.import_module(library), class_name, None)
    return isinstance(cls, type) and issubclass(cls, torch.nn.Module)
