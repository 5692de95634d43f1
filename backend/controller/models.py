"""Finding diffusers model folders and checking them before any worker loads them (controller side).

Reads JSON and lists files, never imports torch.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ..families import PIPELINES, Pipeline
from ..protocol import settings
from ..protocol.errors import ModelError
from ..protocol.spec import INDEX_FILES, PipelineSpec, index_file, listed_components, read_index, read_json
from .files import headers


@dataclass(frozen=True)
class ModelInfo:
    path: str  # absolute
    class_name: str
    family: Pipeline
    size_factor: int  # width and height must be multiples of this
    variant: str = ""  # the weights variant the folder holds only (diffusers' `variant`)
    max_side: int | None = None  # the largest side its transformer's position embedding covers


def info_of(spec: PipelineSpec) -> ModelInfo:
    """What inspect_model found, rebuilt from the pipeline description (configs only, no weights)."""
    return ModelInfo(spec.model_path, spec.class_name, spec.family, spec.size_factor, spec.variant,
                     model_max_side(spec.component_config("transformer"), spec.size_factor))


# ---- the Hugging Face hub cache (`hf download` without --local-dir), listed under repo ids


def hub_cache_dir() -> Path:
    """Where huggingface_hub keeps downloads: HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(home).expanduser() / "hub"


def hub_snapshot(repo_dir: Path) -> Path | None:
    """The snapshot of a cached repo that `main` points at (else the newest), if it is a diffusers pipeline."""
    snapshots = repo_dir / "snapshots"
    try:
        main = (repo_dir / "refs" / "main").read_text().strip()
    except OSError:
        main = ""
    candidates = [snapshots / main] if main else []
    if snapshots.is_dir():
        candidates += sorted(snapshots.iterdir(), key=lambda p: p.stat().st_mtime, reverse=True)
    return next((c for c in candidates if index_file(c) is not None), None)


def hub_models(cache: Path | None = None) -> dict[str, Path]:
    """Diffusers pipelines in the hub cache: repo id ("org/name") -> snapshot folder."""
    cache = cache or hub_cache_dir()
    found = {}
    if cache.is_dir():
        for repo_dir in sorted(cache.glob("models--*")):
            snapshot = hub_snapshot(repo_dir)
            if snapshot is not None:
                found[repo_dir.name[len("models--"):].replace("--", "/")] = snapshot
    return found


def find_models(roots: Iterable[str], max_depth: int = 3) -> list[str]:
    """Diffusers folders (holding model_index.json, or a modular pipeline's index) under each root, as paths
    relative to that root."""
    found: list[str] = []
    for root in roots:
        base = Path(root)
        if not base.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(base, followlinks=True):
            rel = Path(dirpath).relative_to(base)
            if any(n in filenames for n in INDEX_FILES):
                found.append(rel.as_posix())
                dirnames.clear()  # components of a pipeline are not pipelines
            elif len(rel.parts) >= max_depth:
                dirnames.clear()
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
    return sorted(set(found))


def resolve_model_path(name: str, roots: Iterable[str]) -> Path:
    """Resolves a model name (relative to ComfyUI's diffusers folders, or a repo id of the Hugging Face hub
    cache) to its folder. A symlink inside a diffusers folder is the user's choice and is followed, as ComfyUI
    does; `..` is refused, and absolute paths unless COMFYUI_TPU_ALLOW_ABSOLUTE_PATHS=1.
    """
    roots = [Path(r).absolute() for r in roots]
    name = name.strip()
    if "\x00" in name:
        raise ModelError(f"model_path: {name!r} contains a NUL character, which no file name can hold; type the "
                         "folder name again without it.")
    if not name:
        raise ModelError("model: no model was chosen. Pick one from the list, or type a folder name in model_path.")
    candidate = Path(name)
    if candidate.is_absolute():
        if not settings.ALLOW_ABSOLUTE_PATHS.on():
            raise ModelError(
                f"model_path: '{name}' is an absolute path, which is refused by default. Put the model under "
                f"ComfyUI's diffusers folder ({', '.join(map(str, roots)) or 'models/diffusers'}) and give its "
                f"name, or start ComfyUI with {settings.ALLOW_ABSOLUTE_PATHS.name}=1 to allow absolute paths.")
        path = candidate.resolve()
        if path.is_dir():
            return path
        raise ModelError(f"model_path: the folder '{name}' does not exist. Check the path.")
    if ".." in candidate.parts:
        raise ModelError(f"model_path: '{name}' points outside ComfyUI's diffusers folders; "
                         "give a folder name inside them (no '..').")
    for root in roots:
        path = root / candidate
        if path.is_dir():
            return path
    cached = hub_models().get(candidate.as_posix())
    if cached is not None:
        return cached
    where = ", ".join(map(str, roots)) or "(no diffusers folder configured)"
    raise ModelError(
        f"model: '{name}' was not found in ComfyUI's diffusers folders ({where}). Put the diffusers model "
        "folder (the one holding model_index.json) there, or fix the name.")


def inspect_model(path: Path, allow_pickle: bool = False) -> ModelInfo:
    """Checks a folder is a loadable diffusers pipeline we support, without loading weights.

    Pickle-only weights are refused unless `allow_pickle` or COMFYUI_TPU_ALLOW_PICKLE=1."""
    allow_pickle = allow_pickle or settings.ALLOW_PICKLE.on()
    found = index_file(path)
    if found is None:
        raise ModelError(
            f"model: the folder '{path.name}' has no model_index.json (nor {', '.join(INDEX_FILES[1:])}), so it "
            "is not a diffusers pipeline folder. Choose the top folder of a model saved with save_pretrained (or "
            "downloaded from the Hugging Face Hub), which holds model_index.json.")
    index = read_json(found)
    class_name = index.get("_class_name", "")
    family = PIPELINES.get(class_name)
    if family is None:
        raise ModelError(
            f"model: '{path.name}' is a {class_name or 'unknown'} pipeline, which ComfyUI-TPU does not support. "
            f"Supported: {', '.join(sorted(PIPELINES))}.")
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
                f"with {settings.ALLOW_PICKLE.name}=1.")
    if missing := [c for c in family.sound if c not in listed_components(index)]:
        raise ModelError(f"model: '{path.name}' ({family.name}) makes the video's sound with its "
                         f"{' and '.join(family.sound)}, and its model_index.json lists no {' and no '.join(missing)}. "
                         f"The folder is incomplete: fetch the model again with every component "
                         f"({', '.join(c + '/' for c in family.sound)} beside vae/).")
    factor = vae_scale(read_json(path / "vae" / "config.json", {})) * family.size_multiple_of_vae
    return ModelInfo(str(path), class_name, family, factor, detect_variant(path, index))


_PLAIN = re.compile(r"^[^.]+(-\d{5}-of-\d{5})?\.safetensors$|\.safetensors\.index\.json$")
_VARIANT = re.compile(r"^[^.]+\.(\w+)(-\d{5}-of-\d{5})?\.safetensors$|\.safetensors\.index\.(\w+)\.json$")


def detect_variant(path: Path, index: dict) -> str:
    """The variant ("fp16", "bf16", ...) of a folder whose components hold only variant weights
    (`diffusion_pytorch_model.fp16.safetensors`, as `save_pretrained(variant=...)` and some Hub repositories
    leave them); "" when every component has plain weights."""
    variants: set[str] = set()
    for component in listed_components(index):
        folder = path / component
        names = [p.name for p in folder.iterdir()] if folder.is_dir() else []
        if not names or any(_PLAIN.search(n) for n in names):
            continue
        for n in names:
            m = _VARIANT.search(n)
            if m:
                variants.add(m.group(1) or m.group(3))
    if len(variants) > 1:
        raise ModelError(f"model: '{path.name}' holds only variant weights of several kinds "
                         f"({', '.join(sorted(variants))}) and no plain ones; keep one variant.")
    return variants.pop() if variants else ""


def vae_scale(vae_config: dict) -> int:
    """The VAE's downscale: what it says (Wan's `scale_factor_spatial`: 16 for Wan 2.2 5B's), LTX-2's (patch size
    x 2 per scaling block: 32), else 2 per down block after the first (AutoencoderKL), else 8."""
    if isinstance(vae_config.get("scale_factor_spatial"), int):
        return vae_config["scale_factor_spatial"]
    if isinstance(vae_config.get("spatial_compression_ratio"), int):  # LTX-2's, where it says so
        return vae_config["spatial_compression_ratio"]
    if "spatio_temporal_scaling" in vae_config:  # LTX-2's video VAE: patches, then a halving per scaling block
        return vae_config.get("patch_size", 1) * 2 ** sum(bool(x) for x in vae_config["spatio_temporal_scaling"])
    blocks = vae_config.get("block_out_channels")
    return 2 ** (len(blocks) - 1) if blocks else 8


def model_max_side(transformer_config: dict, size_factor: int) -> int | None:
    """The largest side the model can make, where its transformer has a fixed-size position embedding (SD3's
    pos_embed_max_size, in patches; Wan's rotary table, rope_max_seq_len positions per axis): None where it has no
    such limit."""
    config = transformer_config if isinstance(transformer_config, dict) else {}
    patches = config.get("pos_embed_max_size") or config.get("rope_max_seq_len")  # Wan: its rotary table's length
    return patches * size_factor if isinstance(patches, int) and patches > 0 else None


def check_size(info: ModelInfo, width: int, height: int, max_side: int = 8192) -> None:
    """Width/height must be multiples of the pipeline's factor, from its smallest side (Pipeline.min_size_multiples)
    and not absurdly large."""
    f = info.size_factor
    model_max, least = info.max_side, f * info.family.min_size_multiples
    for name, value in (("width", width), ("height", height)):
        if 0 < value < least and not value % f:
            raise ModelError(f"{name}: {value} is less than {info.family.name} can make: its VAE needs at least "
                             f"{info.family.min_size_multiples} latent pixels a side, {least} pixels; use {least} or "
                             "more.")
        if value <= 0 or value > max_side:
            raise ModelError(f"{name}: {value} is out of range; use a value between {least} and {max_side}.")
        if model_max is not None and value > model_max:
            raise ModelError(f"{name}: {value} is more than '{Path(info.path).name}' can make: its "
                             f"transformer's position embedding covers at most {model_max} pixels per side; "
                             f"use at most {model_max}.")
        if value % f:
            lo, hi = (value // f) * f, (value // f + 1) * f
            near = f"{lo} or {hi}" if lo >= least else str(max(hi, least))
            raise ModelError(f"{name}: {value} is not a multiple of {f}, which {info.family.name} needs; "
                             f"use {near}.")


def check_frames(family: Pipeline, frames: int, transformer_config: dict | None = None) -> None:
    """A video pipeline makes 1 + k·frame_step frames (Sample Video), as many as its transformer's rotary table
    has positions for (Wan's rope_max_seq_len latent frames, in temporal patches); an image pipeline none
    (Sample)."""
    step = family.frame_step
    if not step:
        if frames:
            raise ModelError(f"pipeline: {family.name} makes images, not videos; use Sample (TPU) with it.")
        return
    if not frames:
        raise ModelError(f"pipeline: {family.name} makes videos; use Sample Video (TPU) with it.")
    first, (least, most) = family.frame_first, family.frames_range
    if frames < first or (frames - first) % step:
        lo = max(first, (frames - first) // step * step + first)
        near = f"{lo} or {lo + step}" if frames > first else str(first)
        raise ModelError(f"frames: {family.name} makes {first} + a multiple of {step} frames (its VAE packs {step} "
                         f"frames into one), not {frames}; use {near}.")
    if frames < least or (most and frames > most):
        low, high = first + -(-(least - first) // step) * step, first + (most - first) // step * step
        raise ModelError(f"frames: {family.name} makes {low} to {high} frames, not {frames}; use "
                         f"{low if frames < least else high}.")
    config = transformer_config or {}
    positions, patch = config.get("rope_max_seq_len"), config.get("patch_size") or [1]
    patch = patch[0] if isinstance(patch, (list, tuple)) else patch  # Wan: (t, h, w); others a number
    if isinstance(positions, int) and isinstance(patch, int) and (frames - first) // step + 1 > positions * patch:
        longest = (positions * patch - 1) * step + first
        raise ModelError(f"frames: {frames} is more than this {family.name} model can make: its transformer's rotary "
                         f"position table (rope_max_seq_len {positions}) covers {positions * patch} latent frames, "
                         f"so at most {longest} frames; use at most {longest}, or make the video in parts.")


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
        keys = list(headers.load(file, file.stat().st_size).shapes)
    except OSError as e:
        raise ModelError(f"lora_name: '{name}' cannot be read ({e.strerror}).") from None
    except headers.Unreadable as e:
        raise ModelError(f"lora_name: '{name}' cannot be read as safetensors ({e.what}); the file is damaged or "
                         "incomplete: download it again.") from None
    if not any("lora" in k.lower() for k in keys):
        raise ModelError(f"lora_name: '{name}' holds no LoRA weights ({len(keys)} tensors, none named like a LoRA "
                         "layer); it is probably a full model or another kind of file. Pick a LoRA file.")
    return str(file.resolve())


# ---- how much memory the weights take once loaded (offload 'auto'; reads file headers only)


def _safetensors_bytes(path: Path, float_bytes: int) -> int:
    """Bytes the tensors of one safetensors file take with floats at `float_bytes` each (others as stored)."""
    return headers.read_header(path).loaded_bytes(float_bytes)


def weight_bytes(spec: PipelineSpec, float_bytes: int) -> dict[str, int]:
    """Bytes each weighted component takes once loaded with floats of `float_bytes` bytes (2: bfloat16/float16,
    4: float32), in model_index.json order. Safetensors are counted from their headers (in a folder, a variant
    such as `*.fp16.safetensors` only when no plain file exists, as diffusers loads them); pickle and GGUF
    weights at their size on disk. No weight is read."""
    if spec.source is not None:  # artists' files: one entry per file (a checkpoint holds several parts)
        sizes = {}
        for part in spec.source.components:
            path = Path(part.path)
            try:
                size = _safetensors_bytes(path, float_bytes) if path.suffix == ".safetensors" else part.size_bytes
            except ModelError:
                size = part.size_bytes
            if size and not part.name.startswith("tokenizer"):
                sizes[part.name] = size
        return sizes
    root = Path(spec.model_path)
    index = read_index(root)
    sizes: dict[str, int] = {}
    modular = spec.family.modular
    for name in listed_components(index):
        if modular is not None and modular.components and name not in modular.components:
            continue  # in the folder, not loaded by this workflow (MiniMax H3's ref2va transformer under t2va)
        folder = root / name
        if not folder.is_dir():
            continue
        files = sorted(p for p in folder.iterdir() if p.suffix == ".safetensors")
        plain = [p for p in files if "." not in p.name[: -len(".safetensors")].split("-0")[0]]
        total = 0
        try:
            for path in plain or files:
                total += _safetensors_bytes(path, float_bytes)
            if not files:
                total = sum(p.stat().st_size for p in folder.iterdir() if p.suffix in (".bin", ".pt", ".pth"))
        except (OSError, ModelError):
            continue
        if total:
            sizes[name] = total
    return sizes
