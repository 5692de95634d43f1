"""Tiny random-weight diffusers pipelines, built fully offline: the tools' entry to every family's tiny.py.

The test-suite and the benchmarks need real pipeline folders (``model_index.json``, safetensors weights,
tokenizers, scheduler configs) that load through the very same ``DiffusionPipeline.from_pretrained`` path as
the production checkpoints, yet weigh a few megabytes and run in milliseconds on a CPU. Nothing here touches
the Hugging Face Hub: the models are built from small configs and the tokenizers from vocabularies that are
generated in memory, so the folders can be produced on a machine without internet access.

Every family keeps the structural constants the production code depends on (VAE spatial factor 8, 2x2
latent packing, attention heads divisible by 2 for tensor parallelism, the real pipeline class and component
classes), so code exercised against these folders takes the same branches it takes on the real checkpoints.
"""

from __future__ import annotations

import inspect
import json
import os
import pathlib
import shutil
import tempfile
import zlib
from collections.abc import Callable, Iterable
from typing import Any

import torch

from .families import FAMILIES as _FAMILIES
from .families import tiny_builders
from .families.tiny_parts import Seeder
from .protocol.spec import index_file

_MODULES = {f.id: tiny_builders(f.id) for f in _FAMILIES.values()}
_BUILDERS: dict[str, Callable[[Seeder, str], Any]] = {n: b for m in _MODULES.values() for n, b in m.BUILDERS.items()}
_SIZES_OF: dict[str, tuple[str, ...]] = {n: m.SIZES for m in _MODULES.values() for n in m.BUILDERS}
# The tiny pipelines by the name of their folder (tiny-<name>): the first of each family (tests/test_families.py
# checks there is one a family), then further pipelines of a family (Wan 2.1 image to video, Wan 2.2 A14B's experts)
FAMILIES: tuple[str, ...] = tuple(f.tiny[0] for f in _FAMILIES.values() if f.tiny)
MORE: tuple[str, ...] = tuple(n for f in _FAMILIES.values() for n in f.tiny[1:])
SIZES: tuple[str, ...] = ("tiny", "small")
_SIZED_FAMILIES: tuple[str, ...] = tuple(n for n, s in _SIZES_OF.items() if len(s) > 1)
# name -> (tiny pipeline it fits, diffusers class, changes to the config taken from the pipeline's denoiser)
CONTROLNETS: dict[str, tuple[str, str, dict[str, Any]]] = {
    name: (next(iter(m.BUILDERS)), cls, changes) for m in _MODULES.values()
    for name, (cls, changes) in getattr(m, "CONTROLNETS", {}).items()}


def build_tiny_pipeline(
    family: str, out_dir: str | os.PathLike, seed: int = 0, size: str = "tiny"
) -> pathlib.Path:
    """Builds and saves one pipeline folder (model_index.json + safetensors + tokenizers). Deterministic for a seed.

    size="tiny": smallest that runs; size="small": same family but wider/deeper so that one 256x256, 4-step call
    takes >= 0.3 s on one CPU thread (used by benchmarks; "flux" and "zimage" only — ValueError for others).
    The global torch RNG state of the caller is left untouched (weights are drawn inside ``fork_rng``).
    """
    if family not in _BUILDERS:
        raise ValueError(f"unknown family {family!r}; expected one of {FAMILIES + MORE}")
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; expected one of {SIZES}")
    if size != "tiny" and family not in _SIZED_FAMILIES:
        raise ValueError(f"size={size!r} exists only for {_SIZED_FAMILIES}, not {family!r}")
    out = pathlib.Path(out_dir)
    if out.exists() and any(out.iterdir()) and index_file(out) is None:
        raise FileExistsError(f"{out} exists and is not a pipeline folder; refusing to replace it")
    with torch.random.fork_rng(devices=[]):
        pipe = _BUILDERS[family](Seeder(seed), size)
    return save_pipeline(pipe, out)


def save_pipeline(pipe: Any, out: pathlib.Path) -> pathlib.Path:
    """Saves `pipe` (safetensors) as the folder `out`, replacing it. It is saved into a staging folder and
    renamed into place, so an interrupted save never leaves a folder with model_index.json but missing
    weights (build_all would then skip it forever)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    staging.chmod(0o755)  # mkdtemp makes it owner-only; the folder may be served to other users
    try:
        pipe.save_pretrained(str(staging), safe_serialization=True)  # a modular pipeline's takes a str only
        _portable_modular_index(staging)
        if out.exists():
            shutil.rmtree(out)
        os.replace(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def _portable_modular_index(folder: pathlib.Path) -> None:
    """A modular pipeline's save names the folder it was saved in (here the staging one) in every entry of its
    modular_model_index.json; with none named, its components load from whatever folder holds it (as moved)."""
    path = folder / "modular_model_index.json"
    if not path.is_file():
        return
    index = json.loads(path.read_text())
    for value in index.values():
        if isinstance(value, list) and len(value) == 3 and isinstance(value[2], dict):
            value[2]["pretrained_model_name_or_path"] = None
    path.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")


def build_all(
    root: str | os.PathLike, families: Iterable[str] = FAMILIES + MORE, size: str = "tiny"
) -> dict[str, pathlib.Path]:
    """Builds each family (and MORE) into root/<name> where name is f"tiny-{family}" (or f"small-{family}"); skips
    folders that already hold model_index.json.

    Skipping makes it cheap to call from session-scoped fixtures and benchmark setup that share a cache dir.
    With the default ``families`` and a size other than "tiny", only the families that have that size are
    built; naming an unsupported family explicitly raises ValueError.
    """
    root = pathlib.Path(root)
    if families == FAMILIES + MORE and size != "tiny":
        families = [f for f in FAMILIES if f in _SIZED_FAMILIES]
    built: dict[str, pathlib.Path] = {}
    for family in families:
        folder = root / f"{size}-{family}"
        if index_file(folder) is None:
            build_tiny_pipeline(family, folder, size=size)
        built[family] = folder
    return built


def build_tiny_controlnet(name: str, pipeline: str | os.PathLike, out_dir: str | os.PathLike, seed: int = 0) -> pathlib.Path:
    """Saves ControlNet `name` (a key of CONTROLNETS) for the pipeline folder `pipeline` (a tiny or small one of its
    family) as a diffusers folder `out_dir` (config.json + diffusion_pytorch_model.safetensors, the layout its
    published files have).
    Every weight is drawn at random (diffusers zero-initialises a new ControlNet's output layers, which would leave
    the image unchanged). Deterministic for a seed; skipped when the folder exists."""
    import diffusers

    _, class_name, changes = CONTROLNETS[name]
    out = pathlib.Path(out_dir)
    if (out / "config.json").is_file():
        return out
    cls = getattr(diffusers, class_name)
    base = pathlib.Path(pipeline)
    denoiser = "unet" if (base / "unet").is_dir() else "transformer"
    config = json.loads((base / denoiser / "config.json").read_text())
    wanted = inspect.signature(cls.__init__).parameters
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63))
        model = cls(**{**{k: v for k, v in config.items() if k in wanted}, **changes}).eval()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * (0.5 / (p[0].numel() ** 0.5) if p.ndim > 1 else 0.02))
    model.save_pretrained(out)
    return out
