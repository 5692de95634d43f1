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

from ..protocol.messages import pickle_allowed
from ..protocol.spec import listed_components, read_json

_WEIGHT_LIBRARIES = ("diffusers", "transformers")


def safetensors_only() -> bool | None:
    """`use_safetensors` for every from_pretrained call: True (refuse pickle weights) unless the operator
    started ComfyUI with COMFYUI_TPU_ALLOW_PICKLE=1; then None (safetensors when present, else pickle)."""
    return None if pickle_allowed() else True


@dataclass(frozen=True)
class Component:
    """One weighted component of a pipeline folder."""

    name: str  # the subfolder and the pipeline's attribute, e.g. "text_encoder_2"
    cls: type  # its torch module class, from diffusers or transformers
    size_bytes: int  # weights on disk

    def describe(self) -> str:
        return f"{self.name} ({self.cls.__name__}, {format_bytes(self.size_bytes)})"


def format_bytes(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def weighted_components(model_path: str) -> list[Component]:
    """The components of the folder that hold weights, in model_index.json order (reads the folder and
    imports their classes)."""
    import torch

    root = Path(model_path)
    found = []
    for name, (library, class_name) in listed_components(read_json(root / "model_index.json")).items():
        cls = getattr(importlib.import_module(library), class_name, None) if library in _WEIGHT_LIBRARIES else None
        if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
            continue  # tokenizers, schedulers, processors, pipeline-specific classes: diffusers loads those
        folder = root / name
        size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else 0
        found.append(Component(name, cls, size))
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
        try:
            loaded[part.name] = part.cls.from_pretrained(model_path, subfolder=part.name, **common,
                                                         **(extra_kwargs or {}).get(part.name, {}))
        except OSError as e:
            raise OSError(f"component '{part.name}': {e}") from e
    status("loading tokenizers and scheduler, building the pipeline")
    return DiffusionPipeline.from_pretrained(model_path, **loaded, **common)

