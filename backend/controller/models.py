"""Finding diffusers model folders and checking them before any worker loads them (controller side).

Reads JSON and lists files, never imports torch.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ..protocol.errors import ModelError
from ..protocol.messages import ENV_ALLOW_PICKLE, pickle_allowed
from ..protocol.spec import FAMILIES, Family, PipelineSpec, listed_components, read_json

ALLOW_ABSOLUTE_ENV = "COMFYUI_TPU_ALLOW_ABSOLUTE_PATHS"


@dataclass(frozen=True)
class ModelInfo:
    path: str  # absolute, resolved
    class_name: str
    family: Family
    size_factor: int  # width and height must be multiples of this


def info_of(spec: PipelineSpec) -> ModelInfo:
    """What inspect_model found, rebuilt from the pipeline description (no file read)."""
    return ModelInfo(spec.model_path, spec.class_name, spec.family, spec.size_factor)


def find_models(roots: Iterable[str], max_depth: int = 3) -> list[str]:
    """Diffusers folders (holding model_index.json) under each root, as paths relative to that root."""
    found: list[str] = []
    for root in roots:
        base = Path(root)
        if not base.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(base, followlinks=True):
            rel = Path(dirpath).relative_to(base)
            if "model_index.json" in filenames:
                found.append(rel.as_posix())
                dirnames.clear()  # components of a pipeline are not pipelines
            elif len(rel.parts) >= max_depth:
                dirnames.clear()
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
    return sorted(set(found))


def resolve_model_path(name: str, roots: Iterable[str]) -> Path:
    """Resolves a model name (relative to ComfyUI's diffusers folders) to a folder inside one of them.

    `..` escapes are refused; absolute paths only when COMFYUI_TPU_ALLOW_ABSOLUTE_PATHS=1.
    """
    roots = [Path(r).resolve() for r in roots]
    name = name.strip()
    if "\x00" in name:
        raise ModelError(f"model_path: {name!r} contains a NUL character, which no file name can hold; type the "
                         "folder name again without it.")
    if not name:
        raise ModelError("model: no model was chosen. Pick one from the list, or type a folder name in model_path.")
    candidate = Path(name)
    if candidate.is_absolute():
        if os.environ.get(ALLOW_ABSOLUTE_ENV) != "1":
            raise ModelError(
                f"model_path: '{name}' is an absolute path, which is refused by default. Put the model under "
                f"ComfyUI's diffusers folder ({', '.join(map(str, roots)) or 'models/diffusers'}) and give its "
                f"name, or start ComfyUI with {ALLOW_ABSOLUTE_ENV}=1 to allow absolute paths.")
        path = candidate.resolve()
        if path.is_dir():
            return path
        raise ModelError(f"model_path: the folder '{name}' does not exist. Check the path.")
    for root in roots:
        path = (root / candidate).resolve()
        if path != root and root not in path.parents:
            raise ModelError(f"model_path: '{name}' points outside ComfyUI's diffusers folders; "
                             "give a folder name inside them (no '..').")
        if path.is_dir():
            return path
    where = ", ".join(map(str, roots)) or "(no diffusers folder configured)"
    raise ModelError(
        f"model: '{name}' was not found in ComfyUI's diffusers folders ({where}). Put the diffusers model "
        "folder (the one holding model_index.json) there, or fix the name.")


def inspect_model(path: Path, allow_pickle: bool = False) -> ModelInfo:
    """Checks a folder is a loadable diffusers pipeline we support, without loading weights.

    Pickle-only weights are refused unless `allow_pickle` or COMFYUI_TPU_ALLOW_PICKLE=1."""
    allow_pickle = allow_pickle or pickle_allowed()
    index_file = path / "model_index.json"
    if not index_file.is_file():
        raise ModelError(
            f"model: the folder '{path.name}' has no model_index.json, so it is not a diffusers pipeline "
            "folder. Choose the top folder of a model saved with save_pretrained (or downloaded from the "
            "Hugging Face Hub), which holds model_index.json.")
    index = read_json(index_file)
    class_name = index.get("_class_name", "")
    family = FAMILIES.get(class_name)
    if family is None:
        raise ModelError(
            f"model: '{path.name}' is a {class_name or 'unknown'} pipeline, which ComfyUI-TPU does not support. "
            f"Supported: {', '.join(sorted(FAMILIES))}.")
    for component in listed_components(index):
        comp_dir = path / component
        if not comp_dir.is_dir():
            raise ModelError(f"model: '{path.name}' lists the component '{component}' but the folder "
                             f"'{component}/' is missing. The download is incomplete: fetch the model again.")
        weights = [p.name for p in comp_dir.iterdir() if p.suffix in (".safetensors", ".bin", ".pt", ".pth")]
        if weights and not any(w.endswith(".safetensors") for w in weights) and not allow_pickle:
            raise ModelError(
                f"model: '{path.name}/{component}' has only pickle weights ({', '.join(sorted(weights)[:3])}), "
                "which can run arbitrary code when loaded and are refused. Convert them to .safetensors "
                "(or download the safetensors variant of the model), or, for models you trust, start ComfyUI "
                f"with {ENV_ALLOW_PICKLE}=1.")
    return ModelInfo(str(path), class_name, family, _vae_scale(path) * family.size_multiple_of_vae)


def _vae_scale(path: Path) -> int:
    cfg = path / "vae" / "config.json"
    if cfg.is_file():
        blocks = read_json(cfg).get("block_out_channels")
        if blocks:
            return 2 ** (len(blocks) - 1)
    return 8


def _model_max_side(path: Path, size_factor: int) -> int | None:
    """The largest side the model can make, where its transformer has a fixed-size position embedding (SD3's
    pos_embed_max_size, in patches): None where it has no such limit."""
    try:
        config = read_json(path / "transformer" / "config.json")
    except (OSError, ValueError):
        return None
    patches = config.get("pos_embed_max_size") if isinstance(config, dict) else None
    return patches * size_factor if isinstance(patches, int) and patches > 0 else None


def check_size(info: ModelInfo, width: int, height: int, max_side: int = 8192) -> None:
    """Width/height must be positive multiples of the pipeline's factor and not absurdly large."""
    f = info.size_factor
    model_max = _model_max_side(Path(info.path), f)
    for name, value in (("width", width), ("height", height)):
        if value <= 0 or value > max_side:
            raise ModelError(f"{name}: {value} is out of range; use a value between {f} and {max_side}.")
        if model_max is not None and value > model_max:
            raise ModelError(f"{name}: {value} is more than '{Path(info.path).name}' can make: its "
                             f"transformer's position embedding covers at most {model_max} pixels per side; "
                             f"use at most {model_max}.")
        if value % f:
            lo, hi = (value // f) * f, (value // f + 1) * f
            near = f"{lo} or {hi}" if lo else str(hi)
            raise ModelError(f"{name}: {value} is not a multiple of {f}, which {info.family.name} needs; "
                             f"use {near}.")


def check_lora(path: str) -> str:
    """A LoRA file ready to apply: an existing .safetensors file whose tensors include LoRA layers (reads only
    its header). Returns its absolute path; raises ModelError naming the file and the fix."""
    file = Path(path)
    name = file.name
    if not file.is_file():
        raise ModelError(f"lora_name: '{name}' was not found ({path}). Put the LoRA in ComfyUI's models/loras "
                         "folder and pick it from the list (press R to refresh it).")
    if file.suffix != ".safetensors":
        raise ModelError(f"lora_name: '{name}' is a pickle file, which can run code when loaded and is refused. Use "
                         "the .safetensors version of this LoRA (most LoRAs are published as .safetensors), or "
                         "convert it.")
    try:
        with open(file, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            if size > 100 * 2**20:
                raise ValueError(f"a header of {size} bytes")
            header = json.loads(f.read(size))
        keys = [k for k in header if k != "__metadata__"]
    except (OSError, ValueError, struct.error) as e:
        raise ModelError(f"lora_name: '{name}' cannot be read as safetensors ({e}); the file is damaged or "
                         "incomplete: download it again.") from None
    if not any("lora" in k.lower() for k in keys):
        raise ModelError(f"lora_name: '{name}' holds no LoRA weights ({len(keys)} tensors, none named like a LoRA "
                         "layer); it is probably a full model or another kind of file. Pick a LoRA file.")
    return str(file.resolve())
