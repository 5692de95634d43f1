"""A modular pipeline (`Pipeline.modular`) made of artists' files (ComfyUI's folders, a `FileSource`): the one thing
that differs from worker/modular.py's `load` is where each weighted component comes from. The family's blocks are
made into a pipeline from a temporary folder laid out as worker/loading.py lays one out for a DiffusionPipeline (the
pack's configs with the files' sizes, ComfyUI's tokenizers, the index under the modular name), the light
components (tokenizer, processor, schedulers) load from it, and each weighted one from its file:

- a denoiser in its family's layout through the family's `load_transformer` (convert.py: MiniMax H3's full and
  pruned files), ComfyUI's quantized layers kept quantized (worker/quantized.py), tensor parallelism or Context
  Parallel set up after, as for any converted denoiser;
- a VAE and a text encoder as worker/loading.py reads them (a VAE through its family's converter,
  convert.VAE_CONVERTERS, which completes its config from the file; ComfyUI's Qwen3-VL names, quantized layers).

Runs inside a worker process.
"""

from __future__ import annotations

import importlib
import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..families import FAMILIES, Pipeline, conversions
from ..families.text_encoders import TOKENIZER_LAYOUTS
from ..protocol.spec import FileComponent, FileSource
from ..protocol.units import format_bytes
from . import loading, modular, quantized
from .storage import in_dtype


def load_files(source: FileSource, family: Pipeline, dtype: Any, status: Callable[[str], None],
               extra: dict[str, dict] | None = None) -> Any:
    """The modular pipeline of `family` made of the files of `source`, on the CPU, each weighted component
    announced through `status`; a component that fails raises an OSError naming it and its file."""
    declared = family.modular
    for note in source.notes:
        status(note)
    with tempfile.TemporaryDirectory(prefix="comfyui-tpu-files-") as tmp:
        root = loading._lay_out(source, Path(tmp))
        (root / "model_index.json").unlink()
        (root / declared.index).write_text(json.dumps(source.index()))
        blocks = getattr(importlib.import_module("diffusers.modular_pipelines"), declared.blocks)()
        if declared.workflow and not declared.tasks:
            blocks = blocks.get_workflow(declared.workflow)
        for name in declared.without:
            blocks.sub_blocks.pop(name, None)
        pipe = blocks.init_pipeline(str(root))
        modular._EXTRA[pipe], modular._FILES[pipe] = extra or {}, source
        # every component the files hold (MiniMax H3's ref2va file: `transformer_ref`, which the later task runs;
        # the folder is gone by then), and the workflow's light ones; no model without its file
        workflow = modular._components(pipe, declared.workflow if declared.tasks else "")
        names = [n for n, spec in pipe._component_specs.items()
                 if (source.component(n) is not None and n in modular._components(pipe, ""))
                 or (n in workflow and not _a_model(spec.type_hint))]
        files = {n: p for n in names if (p := source.component(n)) is not None and p.layout not in TOKENIZER_LAYOUTS}
        light = [n for n in names if n not in files]  # from the folder: tokenizers, processor, schedulers
        weighted = list(files.items())
        denoiser = next((p.layout for p in source.components if p.layout in FAMILIES), None)
        finish = getattr(conversions(denoiser), "FINISH", {}) if denoiser else {}  # the family's after-load steps
        loaded = {}
        for i, (name, part) in enumerate(weighted, 1):
            cls = pipe._component_specs[name].type_hint
            status(f"loading {name} ({cls.__name__}, {format_bytes(part.size_bytes)}, {Path(part.path).name}) · "
                   f"component {i} of {len(weighted)}")
            try:
                loaded[name] = _component(root, name, cls, part, dtype, (extra or {}).get(name, {}))
                loaded[name] = finish[name](loaded[name]) if name in finish else loaded[name]
                if part.quant == "comfy-quant" and (n := quantized.count(loaded[name])):
                    status(f"{name}: {n} layers kept quantized (comfy-kitchen), each dequantized as it runs")
            except (OSError, ValueError, KeyError, RuntimeError) as e:
                raise OSError(f"component '{name}' from '{Path(part.path).name}': {type(e).__name__}: {e}") from e
        status(f"loading {', '.join(light)}")
        pipe.load_components(names=light, pretrained_model_name_or_path=str(root))
        pipe.update_components(**loaded)
    return pipe


def _a_model(cls: Any) -> bool:
    return isinstance(cls, type) and issubclass(cls, torch.nn.Module)


def _component(root: Path, name: str, cls: type, part: FileComponent, dtype: Any, extra: dict) -> Any:
    """One weighted component from its file (see the module's docstring)."""
    family = conversions(part.layout) if part.layout in FAMILIES else None
    if family is not None and hasattr(family, "load_transformer"):
        config = dict(cls.load_config(str(root), subfolder=name))
        if part.quant == "comfy-quant" and not quantized.sharded(extra):  # kept quantized, as worker/loading.py
            sd, extras = quantized.state_dict(part.path, part.prefix, dtype)
            sd.update(_float32_as_stored(part, sd))
            with quantized.RowSplitMode():  # diffusers' converter splits the fused qkv and swaps fc1's halves
                model = family.load_transformer(cls, sd, config)
            with torch.no_grad():
                quantized.finish(model, extras)
        else:
            model = family.load_transformer(cls, loading._state_dict(part, dtype), config)
        return loading._shard_after_load(in_dtype(model, dtype), extra)  # quantized layers as they are
    return loading._load_file_component(root, name, cls, part, dtype, extra)


def _float32_as_stored(part: FileComponent, sd: dict) -> dict:
    """The file's float32 tensors that quantized.state_dict gave in the compute dtype, read again as stored: the
    parts diffusers and ComfyUI keep in float32 (MiniMax H3's patch projections, output heads, a pruned file's curve
    table) keep their precision; in_dtype casts the rest."""
    from safetensors import safe_open

    with safe_open(part.path, "pt") as f:
        return {k[len(part.prefix):]: f.get_tensor(k) for k in f.keys() if k.startswith(part.prefix)
                and not isinstance(sd.get(k[len(part.prefix):]), quantized._qt_type())
                and k[len(part.prefix):] in sd and f.get_slice(k).get_dtype() == "F32"}
