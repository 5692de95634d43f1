"""Diffusers' modular pipelines (`diffusers.modular_pipelines`) in the worker, next to DiffusionPipeline classes.

A family declares one with `Pipeline.modular` (backend/families/base.py: its blocks class, index file, workflow,
the sub-blocks it leaves out, the state values it returns, whether guidance lives in a guider). This module is all
that differs for the worker: how such a folder loads (the declared blocks made into a pipeline from the folder's
modular_model_index.json, each weighted component announced as it loads) and how artists' files become one (the
components loading.load_files read from them, handed to the same blocks), which arguments the call takes (the
blocks' inputs, not a `__call__` signature), and how its outputs read (`state.values`, turned into the
`.images` / `.frames` / `.audio` that the rest of the worker reads of a DiffusionPipeline's output).

Runs inside a worker process.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import itertools
import weakref
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from ..families import Pipeline
from ..protocol.spec import listed_components, read_json
from ..protocol.units import format_bytes

# the from_pretrained arguments each loaded pipeline's components took (load's `extra`), for those loaded later
_EXTRA: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# the FileSource of each pipeline made of artists' files (worker/modular_files.py), whose folder is gone after loading
_FILES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# each pipeline's call arguments (`parameters`), with the blocks they were read from
_PARAMETERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _declared(family: Pipeline) -> Any:
    if family.modular is None:
        raise ValueError(f"{family.class_name} is not a modular pipeline (its family declares no `modular`)")
    return family.modular


def load(model_path: str, family: Pipeline, dtype: Any, status: Callable[[str], None],
         extra: dict[str, dict] | None = None, source: Any = None) -> Any:
    """The modular pipeline in `model_path`, on the CPU: the family's blocks (its workflow, without the sub-blocks
    it leaves out) made into a pipeline from the folder's index, then each weighted component the index lists
    loaded from its subfolder, announced through `status`. The from_config parts (scheduler, image processor,
    guider) come from the blocks' own specs. A component that fails raises an OSError naming it. `extra`: further
    from_pretrained arguments by component (parallel.load_kwargs: Context Parallel's config), kept for the
    components a later task loads (for_task). `source`: artists' files instead of the folder (a FileSource:
    worker/modular_files.py)."""
    if source is not None:
        from .modular_files import load_files

        return load_files(source, family, dtype, status, extra)
    modular = _declared(family)
    pipe = _blocks(modular).init_pipeline(model_path)
    _EXTRA[pipe] = extra or {}
    _load(pipe, model_path, family, _components(pipe, modular.workflow if modular.tasks else ""), dtype, status)
    return pipe


def _blocks(modular: Any) -> Any:
    """The family's blocks: its workflow of them (unless its tasks pick one per call), without those it leaves out."""
    blocks = getattr(importlib.import_module("diffusers.modular_pipelines"), modular.blocks)()
    if modular.workflow and not modular.tasks:
        blocks = blocks.get_workflow(modular.workflow)
    for name in modular.without:
        blocks.sub_blocks.pop(name, None)
    return blocks


def own_files(source: Any) -> bool:
    """Whether artists' files (a FileSource) make a modular pipeline from a configs folder that is itself modular
    (modular_model_index.json: MiniMax H3, worker/modular_files.py: `load` with `source`), rather than from a
    model_index.json naming the modular class (FLUX 3: worker/loading.py's load_files, then `from_files`)."""
    return source is not None and not (source.config_dir / "model_index.json").is_file()


def from_files(root: Path, index: dict, family: Pipeline, loaded: dict[str, Any]) -> Any:
    """The modular pipeline that artists' files make (loading.load_files): the family's blocks made into a pipeline
    without a folder index, given the weighted components read from the files (`loaded`), and the light ones the
    pack's index lists (a tokenizer or processor: ComfyUI's vocabulary with the pack's settings) read by their class
    from the laid-out folder `root`. The from_config parts (scheduler, image processor, guider) are the blocks'
    own, as for a diffusers folder, whose index lists none of them."""
    pipe = _blocks(_declared(family)).init_pipeline()
    light = {}
    for name, (library, class_name) in listed_components(index).items():
        if name not in loaded:
            light[name] = getattr(importlib.import_module(library), class_name).from_pretrained(
                str(root / name), local_files_only=True, use_safetensors=True)  # a tokenizer, a processor
    pipe.update_components(**{k: v for k, v in loaded.items() if v is not None}, **light)
    return pipe


def _components(pipe: Any, workflow: str) -> set[str]:
    """The components the blocks load from the folder: all of them, or those of one workflow."""
    names = {n for n, spec in pipe._component_specs.items() if spec.default_creation_method == "from_pretrained"}
    if workflow:
        names &= {spec.name for spec in pipe.blocks.get_workflow(workflow).expected_components}
    return names


def _load(pipe: Any, model_path: str, family: Pipeline, wanted: set[str], dtype: Any,
          status: Callable[[str], None]) -> None:
    """Loads the `wanted` components the folder's index lists, each announced through `status`."""
    listed = listed_components(read_json(Path(model_path) / _declared(family).index))
    names = [n for n in pipe._component_specs if n in wanted and n in listed]
    for i, name in enumerate(names, 1):
        folder = Path(model_path) / name
        size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else 0
        status(f"loading {name} ({listed[name][1]}, {format_bytes(size)}) · component {i} of {len(names)}")
        try:
            # the folder it is in, whatever folder the index was saved from
            pipe.load_components(names=[name], dtype=dtype, pretrained_model_name_or_path=model_path,
                                 **_EXTRA.get(pipe, {}).get(name, {}))
        except (OSError, ValueError) as e:
            raise OSError(f"component '{name}': {e}") from e


def for_task(pipe: Any, family: Pipeline, kind: str, status: Callable[[str], None]) -> Any:
    """The pipeline that runs task `kind` (worker/images.py): the loaded one, with the components of the task's
    workflow that were not loaded yet (MiniMax H3's transformer_ref, the first time a request has reference
    images) loaded now, in the dtype and on the device of the denoiser it already has."""
    workflow = dict(_declared(family).tasks).get(kind)
    if not workflow:
        return pipe
    missing = {n for n in _components(pipe, workflow) if getattr(pipe, n, None) is None}
    if missing and pipe in _FILES:  # its files were all loaded up front (the controller refuses this first)
        raise ValueError(f"{family.name} {workflow} needs {', '.join(sorted(missing))}, which the chosen files do "
                         f"not hold ({', '.join(Path(c.path).name for c in _FILES[pipe].components)})")
    if missing:
        loaded = next(m for m in pipe.components.values() if isinstance(m, torch.nn.Module))
        dtype, where = getattr(pipe, "transformer", loaded).dtype, getattr(pipe, "transformer", loaded).device
        status(f"{family.name} {workflow}: loading its own components ({', '.join(sorted(missing))})")
        _load(pipe, pipe._pretrained_model_name_or_path, family, missing, dtype, status)
        for name in missing:
            module = getattr(pipe, name)
            if isinstance(module, torch.nn.Module):
                module.requires_grad_(False).to(where)
            if (split := _EXTRA.get(pipe, {}).get(name, {}).get("parallel_config")) is not None:
                from .parallel import check_even_split  # as the load did for the first partition

                cp = split.context_parallel_config
                check_even_split(module, cp.ulysses_degree * cp.ring_degree, family.cp_packed)
    return pipe


def parameters(pipe: Any, family: Pipeline) -> Collection[str]:
    """The arguments the call takes, by name: a modular pipeline's blocks' inputs (and the guidance, where its
    guider takes it), else the pipeline's `__call__` signature. A modular pipeline's are read once per pipeline and
    set of sub-blocks: diffusers recomputes `input_names` over every nested block on each read (about 5 ms on the
    CPU for MiniMax H3's blocks), and a worker call reads them several times (seen as ~4 % of a small video)."""
    if family.modular is None:
        return inspect.signature(pipe.__call__).parameters
    blocks = pipe.blocks
    key = (id(blocks), tuple(blocks.sub_blocks))
    kept = _PARAMETERS.get(pipe)
    if kept is not None and kept[0] == key:
        return kept[1]
    names = {*blocks.input_names, "callback_on_step_end"}  # the step callback: call() runs it
    if family.modular.guider:
        names.add(family.guidance_arg)
    _PARAMETERS[pipe] = (key, frozenset(names))
    return _PARAMETERS[pipe][1]


def image_references(family: Pipeline, pictures: list) -> list:
    """PIL images as the blocks' reference inputs: each wrapped in the family's image reference class."""
    where, _, name = f"diffusers.modular_pipelines.{_declared(family).image_reference}".rpartition(".")
    wrap = getattr(importlib.import_module(where), name)
    return [wrap(picture) for picture in pictures]


def audio_references(family: Pipeline, waves: Any) -> list:
    """Waveforms [C, S] at the audio VAE's rate (the controller resampled them) as the blocks' reference sounds."""
    if not len(waves):
        return []
    where, _, name = f"diffusers.modular_pipelines.{_declared(family).audio_reference}".rpartition(".")
    wrap = getattr(importlib.import_module(where), name)
    return [wrap(audio=torch.from_numpy(wave.copy())) for wave in waves]


def call(pipe: Any, family: Pipeline, kwargs: dict) -> Any:
    """Runs the pipeline with the request's arguments; its outputs as a DiffusionPipeline's would read: `.images`
    (images), or `.frames` (a video's, [B, F, H, W, C]) and `.audio`. The guidance goes to a new guider of the
    loaded one's kind (the loaded one stays as it was). The step callback has no place in a modular call (its
    blocks take none): dropped. Latents asked (`output_type="latent"`: a rank whose peer sends the pixels) of blocks
    whose decode refuses them (Modular.decode) run without that sub-block and read back as the pixels."""
    modular = _declared(family)
    kwargs = dict(kwargs)
    callback = kwargs.pop("callback_on_step_end", None)
    own = pipe.guider if modular.guider else None
    undecoded = modular.decode and kwargs.get("output_type") == "latent"
    with contextlib.ExitStack() as restore:
        if undecoded:
            kwargs.pop("output_type")
            restore.enter_context(_without(pipe.blocks, modular.decode))
        if callback is not None:
            restore.enter_context(_after_each_step(pipe, callback))
        if own is not None:
            pipe.update_components(guider=own.new(guidance_scale=kwargs.pop(family.guidance_arg)))
            restore.callback(pipe.update_components, guider=own)
        state = pipe(**kwargs)
    pixels, *rest = modular.outputs
    out = {"frames" if family.frame_step else "images": state.get("latents" if undecoded else pixels)}
    out.update({name: state.get(name) for name in rest})
    return SimpleNamespace(**out)


@contextlib.contextmanager
def _without(blocks: Any, name: str) -> Iterator[None]:
    """The sequential blocks without their last sub-block `name` (the decode) for as long as the block runs."""
    taken = blocks.sub_blocks.pop(name)
    try:
        yield
    finally:
        blocks.sub_blocks[name] = taken


@contextlib.contextmanager
def _after_each_step(pipe: Any, callback: Callable) -> Iterator[None]:
    """Runs a DiffusionPipeline-style `callback_on_step_end(pipe, step, timestep, {})` after each step of the
    pipeline's scheduler (the denoise loop of every modular pipeline steps it once a step; MiniMax H3's audio
    scheduler steps beside it), for as long as the call runs."""
    scheduler, done = pipe.scheduler, itertools.count()
    step = scheduler.step

    def stepped(*args: Any, **kwargs: Any) -> Any:
        out = step(*args, **kwargs)
        callback(pipe, next(done), kwargs.get("timestep", args[1] if len(args) > 1 else None), {})
        return out

    scheduler.step = stepped
    try:
        yield
    finally:
        del scheduler.step  # the class's own again
