"""Loads a diffusers pipeline one component at a time, so the UI can say which part is loading (in a worker).

`DiffusionPipeline.from_pretrained` loads every component in one call and offers no per-component hook. Its
public way to take over is to pass components already loaded: the weighted ones (transformer, text encoders,
VAE) are loaded here one by one, each announced with its size on disk, with the arguments diffusers would give
them plus per-component extras (tensor-parallel configs); `from_pretrained` then adds the light parts.

Artists' files (ComfyUI's folders, a `FileSource` in the spec) take the same road: a temporary folder is laid
out like a diffusers pipeline from the pack's configs (with the sizes the controller read from the files) and
symlinks to the files that diffusers and transformers read as they are; the files in ComfyUI's own layouts go
through diffusers' single-file converters (or ComfyUI's key map, or the family's converter, where diffusers has
none for the file), the all-in-one checkpoints (SD3, SDXL, FLUX.1, LTX-2.3) through the pipeline's single-file
loader or the family's parts, and a modular pipeline's parts to its blocks.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..families import FAMILIES, PIPELINES, family_table, text_encoders
from ..protocol import settings
from ..protocol.spec import CONFIG_FILES, DENOISERS, FileComponent, FileSource, listed_components, read_json
from ..protocol.units import format_bytes
from . import modular, quantized
from .storage import in_dtype, keep_float32, load_stored

_WEIGHT_LIBRARIES = ("diffusers", "transformers")
HF_LAYOUTS = ("hf", "hf-no-final-norm")  # text encoders in transformers' own layout
# ... in transformers' classes under ComfyUI's names: the text encoder kinds declare them (families/text_encoders.py)
RENAMED = text_encoders.RENAMED
# the parts of an all-in-one checkpoint the pipeline's own loader reads: the denoisers of the families whose
# all-in-one files diffusers reads (their layout is the family id), LDM VAEs and CLIP/T5 text encoders
CHECKPOINT_NATIVE = (*(f.id for f in FAMILIES.values() if f.single_file), "ldm-vae", "hf", "openclip")


def safetensors_only() -> bool | None:
    """`use_safetensors` for every from_pretrained call: True (refuse pickle weights) unless the operator
    started ComfyUI with COMFYUI_TPU_ALLOW_PICKLE=1; then None (safetensors when present, else pickle)."""
    return None if settings.ALLOW_PICKLE.on() else True


def from_linked_file(cls: type, path: str, config: dict, dtype: Any) -> Any:
    """A diffusers or transformers model of class `cls` from one .safetensors file whose keys are the class's
    own (a ControlNet in diffusers' layout, Redux's image encoder and embedder), on the CPU in `dtype`: its
    from_pretrained reads a temporary folder of `config` and a link to the file."""
    weights = "model.safetensors" if cls.__module__.startswith("transformers") else "diffusion_pytorch_model.safetensors"
    with tempfile.TemporaryDirectory(prefix="comfyui-tpu-file-") as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(config))
        os.symlink(path, Path(tmp) / weights)
        return cls.from_pretrained(tmp, dtype=dtype, local_files_only=True, use_safetensors=safetensors_only())


@dataclass(frozen=True)
class Component:
    """One weighted component of a pipeline folder."""

    name: str  # the subfolder and the pipeline's attribute, e.g. "text_encoder_2"
    cls: type  # its torch module class, from diffusers or transformers
    size_bytes: int  # weights on disk
    file: str = ""  # the artist's file it is read from (files only)

    def describe(self) -> str:
        where = f", {Path(self.file).name}" if self.file else ""
        return f"{self.name} ({self.cls.__name__}, {format_bytes(self.size_bytes)}{where})"


def _weighted(index: dict, own: bool = False) -> list[tuple[str, type]]:
    """(name, torch module class) of a model_index's weighted components in order; `own`: LTX-2's "ltx2" ones too."""
    import torch

    found = []
    for name, (library, class_name) in listed_components(index).items():
        module = library if library in _WEIGHT_LIBRARIES else f"diffusers.pipelines.{library}" if own else None
        cls = getattr(importlib.import_module(module), class_name, None) if module else None
        if isinstance(cls, type) and issubclass(cls, torch.nn.Module):
            found.append((name, cls))  # tokenizers, schedulers, processors: diffusers loads those
    return found


def weighted_components(model_path: str) -> list[Component]:
    """The components of the folder that hold weights, in model_index.json order (reads the folder and
    imports their classes)."""
    root = Path(model_path)
    found = []
    for name, cls in _weighted(read_json(root / "model_index.json")):
        folder = root / name
        size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else 0
        found.append(Component(name, cls, size))
    return found


def load_pipeline(model_path: str, dtype: Any, status: Callable[[str], None],
                  extra_kwargs: dict[str, dict] | None = None, variant: str = "", storage: Any = None) -> Any:
    """The pipeline in `model_path`, loaded on the CPU, announcing each component through `status`:
    `extra_kwargs[name]` is added to component `name`'s from_pretrained call; `variant` names weights that
    the folder holds only as a variant (`*.fp16.safetensors`); `storage` (an fp8 dtype) reads the denoiser
    straight into fp8 storage (worker.storage.load_stored). A component that fails to load raises an
    OSError naming it."""
    common = {"dtype": dtype, "local_files_only": True, "use_safetensors": safetensors_only(),
              "variant": variant or None}
    parts = weighted_components(model_path)
    loaded: dict[str, Any] = {}
    for i, part in enumerate(parts, 1):
        status(f"loading {part.describe()} · component {i} of {len(parts)}")
        extra = (extra_kwargs or {}).get(part.name, {})
        try:
            loaded[part.name] = (_stored(part.cls, Path(model_path) / part.name, part.name, dtype, storage, extra, variant)
                                 or part.cls.from_pretrained(model_path, subfolder=part.name, **common, **extra))
        except OSError as e:
            raise OSError(f"component '{part.name}': {e}") from e
    status("loading tokenizers and scheduler, building the pipeline")
    return pipeline_class(read_json(Path(model_path) / "model_index.json")).from_pretrained(model_path, **loaded,
                                                                                          **common)


def _stored(cls: type, folder: Path, name: str, dtype: Any, storage: Any, extra: dict, variant: str = "") -> Any:
    """The denoiser read straight into fp8 storage, or None where it is loaded whole and cast after (no fp8
    storage, another component, tensor parallel: diffusers reads each rank's slices, pickle weights)."""
    if storage is None or name not in DENOISERS or extra:
        return None
    return load_stored(cls, folder, storage, dtype, variant)


# ---- artists' files


def load_files(source: FileSource, dtype: Any, status: Callable[[str], None],
               extra_kwargs: dict[str, dict] | None = None, storage: Any = None) -> Any:
    """The pipeline made of the files of `source`, loaded on the CPU, announcing each component:
    `extra_kwargs` as for load_pipeline: a transformer that diffusers reads with `from_pretrained` gets its
    tensor-parallel config there (each rank reads its slices); one read through a converter is loaded whole
    and then sharded with the same config; `storage` as for load_pipeline (denoisers in diffusers' layout)."""
    from safetensors import SafetensorError

    for note in source.notes:
        status(note)
    with tempfile.TemporaryDirectory(prefix="comfyui-tpu-files-") as tmp:
        root = _lay_out(source, Path(tmp))
        index = read_json(root / "model_index.json")
        checkpoint = source.component("checkpoint")
        parts = [(name, cls, source.component(name)) for name, cls in _weighted(index, own=True)]
        ours = [(n, c, f) for n, c, f in parts if f is not None and not _left_to_checkpoint(f, checkpoint)]
        loaded: dict[str, Any] = {name: None for name in _absent(index)}
        total = len(ours) + (1 if checkpoint else 0)
        for i, (name, cls, part) in enumerate(ours, 1):
            status(f"loading {Component(name, cls, part.size_bytes, part.path).describe()} · component {i} of {total}")
            try:
                extra = (extra_kwargs or {}).get(name, {})
                loaded[name] = ((_symlinked(part) and _stored(cls, root / name, name, dtype, storage, extra))
                                or _load_file_component(root, name, cls, part, dtype, extra))
                if part.quant == "comfy-quant" and (n := quantized.count(loaded[name])):
                    status(f"{name}: {n} layers kept quantized (comfy-kitchen), each dequantized as it runs")
                elif part.quant == "comfy-quant" and quantized.sharded(extra):
                    status(f"{name}: dequantized at load by comfy-kitchen for Shard TP, then sharded")
            except (OSError, ValueError, KeyError, RuntimeError, SafetensorError) as e:  # it names no file
                raise OSError(f"component '{name}' from '{Path(part.path).name}': {type(e).__name__}: {e}") from e
        if checkpoint is not None:
            rest = [n for n, _, f in parts if n not in loaded]
            status(f"loading {', '.join(rest)} from {Path(checkpoint.path).name} "
                   f"({format_bytes(checkpoint.size_bytes)}) · component {total} of {total}")
            pipe = _load_checkpoint(root, index, checkpoint, loaded, dtype)
            for name in rest:  # extras (TP) for parts the checkpoint loader read whole
                _shard_after_load(getattr(pipe, name, None), (extra_kwargs or {}).get(name, {}))
            return pipe
        status("loading tokenizers and scheduler, building the pipeline")
        if (family := PIPELINES.get(index["_class_name"])) is not None and family.modular is not None:
            return modular.from_files(root, index, family, loaded)  # the family's blocks, given the parts
        return pipeline_class(index).from_pretrained(str(root), **loaded, dtype=dtype, local_files_only=True,
                                                 use_safetensors=True)


def pipeline_class(index: dict) -> type:
    """The pipeline class a model_index names. Its own from_pretrained, not DiffusionPipeline's: the generic one
    knows only the required components, so a component the class declares optional (Wan's transformer and
    transformer_2) passed in already loaded would be ignored and read again from the folder."""
    import diffusers

    return getattr(diffusers, index["_class_name"])


def _left_to_checkpoint(part: FileComponent, checkpoint: FileComponent | None) -> bool:
    """A part of the all-in-one checkpoint that the pipeline's single-file loader reads as it is."""
    return checkpoint is not None and part.path == checkpoint.path and part.layout in CHECKPOINT_NATIVE and not part.quant


def _absent(index: dict) -> list[str]:
    """Optional components the model_index leaves out ([null, null]): passed as None (SD3 without T5)."""
    return [k for k, v in index.items() if not k.startswith("_") and v == [None, None]]


def _lay_out(source: FileSource, root: Path) -> Path:
    """A diffusers-style folder for `source`: model_index.json, scheduler and component configs (published
    configs with the files' sizes), tokenizer folders (ComfyUI's bundled vocabularies with the pack's
    settings), and symlinks to the files that from_pretrained reads as they are."""
    configs = source.config_dir
    (root / "model_index.json").write_text(json.dumps(source.index()))
    for folder in sorted(p for p in configs.iterdir() if p.is_dir()):
        target = root / folder.name
        target.mkdir()
        file = next((f for f in CONFIG_FILES if (folder / f).is_file()), None)  # what source.config reads
        if file:
            (target / file).write_text(json.dumps(source.config(folder.name)))
    for part in source.components:
        if part.layout == "tokenizer":
            _tokenizer_folder(Path(part.path), configs / part.name, root / part.name)
        elif part.layout == "tekken":
            _tekken_tokenizer(Path(part.path), configs / part.name, root / part.name)
        elif part.layout == "spiece":
            _spiece_tokenizer(Path(part.path), configs / part.name, root / part.name)
        elif part.layout in family_table("TOKENIZERS"):  # a family's own (LTX-2's Gemma, from its spiece_model)
            family_table("TOKENIZERS")[part.layout](Path(part.path), configs / part.name, root / part.name)
        elif _symlinked(part):
            name = "diffusion_pytorch_model.safetensors" if part.layout == "diffusers" else "model.safetensors"
            (root / part.name).mkdir(exist_ok=True)
            os.symlink(part.path, root / part.name / name)
    return root


def _symlinked(part: FileComponent) -> bool:
    """Files from_pretrained reads as they are (diffusers' or transformers' keys, no prefix, no scales)."""
    return (part.layout == "diffusers" or part.layout in HF_LAYOUTS) and not part.prefix and not part.quant


def _tokenizer_folder(comfy_folder: Path, shipped: Path, target: Path) -> None:
    """ComfyUI's bundled tokenizer files, with the pack's files of that folder over them where it ships any
    (tokenizer_config.json: maximum length, padding token, added tokens and chat template of the published
    model; a processor's preprocessor_config.json)."""
    target.mkdir(parents=True, exist_ok=True)
    ours = {f.name for f in shipped.iterdir() if f.is_file()} if shipped.is_dir() else set()
    if "tokenizer_config.json" in ours:
        ours.add("special_tokens_map.json")
    for file in comfy_folder.iterdir():
        if file.name not in ours:
            os.symlink(file, target / file.name)
    for file in sorted(f for f in shipped.iterdir() if f.is_file()) if shipped.is_dir() else ():
        shutil.copy(file, target / file.name)


def _tekken_tokenizer(te_file: Path, shipped: Path, target: Path) -> None:
    """Mistral's tokenizer from the `tekken_model` tensor that Comfy-Org's FLUX.2 text-encoder files carry
    (the tekken.json file's bytes), with the pack's settings and chat template."""
    from safetensors import safe_open
    from transformers.integrations.mistral.tokenizer import MistralConverter

    target.mkdir(parents=True, exist_ok=True)
    with safe_open(str(te_file), "pt") as f:
        data = f.get_tensor("tekken_model").numpy().tobytes()
    (target / "tekken.json").write_bytes(data)
    MistralConverter(vocab_file=str(target / "tekken.json")).converted().save(str(target / "tokenizer.json"))
    (target / "tekken.json").unlink()
    shutil.copy(shipped / "tokenizer_config.json", target / "tokenizer_config.json")


def _spiece_tokenizer(te_file: Path, shipped: Path, target: Path) -> None:
    """UMT5's tokenizer from the `spiece_model` tensor that Comfy-Org's umt5_xxl files carry (a SentencePiece
    model's bytes, which ComfyUI reads with sentencepiece, one of its requirements): transformers' T5 tokenizer
    made of its pieces and scores and its normalization table, what transformers' own converter takes from it
    (that converter needs protobuf, which neither ComfyUI nor the pack installs), with the pack's settings."""
    import sentencepiece
    from safetensors import safe_open
    from transformers import T5TokenizerFast

    with safe_open(str(te_file), "pt") as f:
        data = f.get_tensor("spiece_model").numpy().tobytes()
    sp = sentencepiece.SentencePieceProcessor(model_proto=data)
    if (sp.pad_id(), sp.eos_id(), sp.unk_id()) != (0, 1, 2):  # what T5's tokenizer assumes (UMT5's are)
        raise ValueError(f"its SentencePiece model numbers pad, end and unknown {sp.pad_id()}, {sp.eos_id()}, "
                         f"{sp.unk_id()}, not UMT5's 0, 1, 2")
    normalizer = protobuf_field(protobuf_field(data, 3) or b"", 2)  # normalizer_spec.precompiled_charsmap
    vocab = [(sp.id_to_piece(i), sp.get_score(i)) for i in range(sp.get_piece_size())]
    tokenizer = T5TokenizerFast(vocab=vocab, extra_ids=0, _spm_precompiled_charsmap=normalizer or None)
    target.mkdir(parents=True, exist_ok=True)
    tokenizer.backend_tokenizer.save(str(target / "tokenizer.json"))
    shutil.copy(shipped / "tokenizer_config.json", target / "tokenizer_config.json")


def protobuf_field(message: bytes, number: int) -> bytes | None:
    """The first length-delimited field `number` of a protobuf message, read by its wire format (varint keys;
    wire types 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32); None when it has none."""

    def varint(i: int) -> tuple[int, int]:
        value = shift = 0
        while True:
            byte = message[i]
            value, shift, i = value | (byte & 0x7F) << shift, shift + 7, i + 1
            if byte < 0x80:
                return value, i

    i = 0
    while i < len(message):
        key, i = varint(i)
        field, wire = key >> 3, key & 7
        if wire == 2:
            size, i = varint(i)
            if field == number:
                return message[i:i + size]
            i += size
        elif wire in (0, 1, 5):
            i = varint(i)[1] if wire == 0 else i + (8 if wire == 1 else 4)
        else:
            raise ValueError(f"not a protobuf message (wire type {wire})")
    return None


def _state_dict(part: FileComponent, dtype: Any, cls: type | None = None) -> dict:
    """The tensors of `part` (under its prefix, the prefix removed; under any of several "a|b" prefixes, the names
    kept whole), ComfyUI's scaled fp8 and quantized layers dequantized (comfy-kitchen's dequantize: what the parts
    that keep no quantized layer read); ComfyUI's names as class `cls` names them where its layout says (RENAMED)."""
    from safetensors import safe_open

    sd, prefixes, strip = {}, tuple(part.prefix.split("|")), 0 if "|" in part.prefix else len(part.prefix)
    for path in (part.path, *part.more):  # a part in two files: LTX-2.5's connectors
        if part.quant == "comfy-quant":
            sd.update(quantized.dequantized(*quantized.state_dict(path, part.prefix, dtype)))
            continue
        with safe_open(path, "pt") as f:
            sd.update({k[strip:]: f.get_tensor(k) for k in f.keys() if k.startswith(prefixes)})
    if part.quant == "scaled-fp8":
        sd = dequantize_scaled_fp8(sd, dtype)
    return RENAMED[part.layout](sd, cls.__name__) if cls is not None and part.layout in RENAMED else sd


def dequantize_scaled_fp8(sd: dict, dtype: Any) -> dict:
    """ComfyUI's "scaled fp8" weights as plain ones: each fp8 weight times its scale (`.scale_weight`, or
    `.weight_scale` in the newer layout), as ComfyUI's own fp8 layers compute them; input scales and the
    `scaled_fp8` marker dropped. diffusers and transformers know neither and would load wrong weights."""
    import torch

    sd = dict(sd)
    sd.pop("scaled_fp8", None)
    for key in [k for k in sd if k.endswith((".scale_weight", ".weight_scale"))]:
        weight_key = key.rsplit(".", 1)[0] + ".weight"
        scale = sd.pop(key).to(torch.float32)
        weight = sd[weight_key].to(torch.float32)
        if scale.numel() > 1:
            scale = scale.reshape(-1, *([1] * (weight.ndim - 1)))
        sd[weight_key] = (weight * scale).to(dtype)
    for key in [k for k in sd if k.endswith((".scale_input", ".input_scale"))]:
        sd.pop(key)
    return sd


def invert_key_map(sd: dict, key_map: tuple[tuple, ...]) -> dict:
    """diffusers' keys from a file in ComfyUI's layout, by ComfyUI's own key map (diffusers key -> ComfyUI key,
    slice, transform): each diffusers tensor is the named slice of the ComfyUI tensor, with scale and shift
    swapped back where ComfyUI swaps them (the swap is its own inverse)."""
    import torch

    out = {}
    for target, name, dim, start, length, transform in key_map:
        weight = sd[name]
        if dim >= 0:
            weight = weight.narrow(dim, start, length)
        if transform == "swap_scale_shift":
            shift, scale = weight.chunk(2, dim=0)
            weight = torch.cat([scale, shift], dim=0)
        out[target] = weight.contiguous()
    return out


def _load_file_component(root: Path, name: str, cls: type, part: FileComponent, dtype: Any, extra: dict) -> Any:
    """One component from an artist's file, on the CPU in `dtype` (fp8 weights upcast)."""
    file_args = {"dtype": dtype, "local_files_only": True}
    if _symlinked(part):  # from_pretrained reads it through the folder (tensor parallel: each rank its slices)
        model = cls.from_pretrained(str(root), subfolder=name, use_safetensors=True, **file_args, **extra)
        return _finish_text_encoder(model, part)
    if part.quant == "comfy-quant" and (part.layout in HF_LAYOUTS or part.layout not in family_table("VAE_CONVERTERS")):
        return _quantized_component(root, name, cls, part, dtype, extra)
    if part.layout in HF_LAYOUTS or part.layout in RENAMED:  # in a checkpoint, scaled fp8, ComfyUI's names
        config = cls.config_class.from_dict(read_json(root / name / "config.json"))
        model = cls.from_pretrained(None, config=config, state_dict=_state_dict(part, dtype, cls),
                                    use_safetensors=True, **file_args)
        return _finish_text_encoder(model, part)
    if part.layout in family_table("VAE_CONVERTERS"):  # converted in float32, then cast
        import torch
        sd = {k: v.to(torch.float32) for k, v in _state_dict(part, torch.float32).items()}
        return _converted(root, name, cls, sd, dtype, family_table("VAE_CONVERTERS")[part.layout])
    if part.quant == "gguf":
        from diffusers import GGUFQuantizationConfig

        model = cls.from_single_file(part.path, config=str(root), subfolder=name,
                                     quantization_config=GGUFQuantizationConfig(compute_dtype=dtype), **file_args)
        return _shard_after_load(model, extra)
    sd = _state_dict(part, dtype)
    if part.layout == "flux1-comfy-map":
        sd = invert_key_map(sd, part.key_map)
    elif part.layout == "sdxl":  # diffusers' UNet converter looks for the checkpoint prefix
        sd = {f"model.diffusion_model.{k}": v for k, v in sd.items()}
    sd = family_table("RENAMES").get(part.layout, dict)(sd)  # names diffusers' converter misses (LTX-2.3's)
    convert = family_table("DENOISER_CONVERTERS").get(part.layout)  # the family's own, where diffusers has none
    model = (_converted(root, name, cls, sd, dtype, convert) if convert
             else cls.from_single_file(sd, config=str(root), subfolder=name, **file_args))
    return _shard_after_load(model, extra)


def _quantized_component(root: Path, name: str, cls: type, part: FileComponent, dtype: Any, extra: dict) -> Any:
    """A component from one of ComfyUI's quantized files, its layers kept as comfy-kitchen QuantizedTensors and
    dequantized one at a time as they run (worker/quantized.py). A denoiser goes through diffusers' own
    single-file converter, whose splits of fused weights keep the rows quantized; a text encoder in
    transformers' layout is built without weights (its computed buffers real) and given the tensors."""
    import torch
    from accelerate import init_empty_weights

    sd, extras = quantized.state_dict(part.path, part.prefix, dtype)
    if quantized.sharded(extra):  # Shard TP slices plain weights only
        sd, extras = quantized.dequantized(sd, extras), {}
    if part.layout in HF_LAYOUTS or part.layout in RENAMED:
        config = cls.config_class.from_dict(read_json(root / name / "config.json"))
        with init_empty_weights(include_buffers=False):
            model = cls(config)
        base = f"{getattr(cls, 'base_model_prefix', '')}."
        if part.layout in RENAMED:
            sd = RENAMED[part.layout](sd, cls.__name__)
        elif base != "." and not set(sd) & set(model.state_dict()):  # ComfyUI's files keep the "model." prefix
            sd = {k[len(base):] if k.startswith(base) else k: v for k, v in sd.items()}
        model.load_state_dict(sd, strict=False, assign=True)
        model.tie_weights()  # a tied lm_head, absent from ComfyUI's files (Gemma's, Qwen3-VL-4B's)
        missing = [k for k, t in model.state_dict().items() if t.is_meta and not text_encoders.may_lack(part.layout, k)]
        if missing:
            raise ValueError(f"the file lacks {len(missing)} tensors of {cls.__name__} (first: '{missing[0]}')")
        model = _finish_text_encoder(model.eval(), part)
    else:
        if part.layout == "flux1-comfy-map":
            sd = invert_key_map(sd, part.key_map)
        sd = family_table("RENAMES").get(part.layout, dict)(sd)
        with quantized.RowSplitMode():
            model = (_converted(root, name, cls, sd, dtype, family_table("DENOISER_CONVERTERS")[part.layout])
                     if part.layout in family_table("DENOISER_CONVERTERS") else
                     cls.from_single_file(sd, config=str(root), subfolder=name, dtype=dtype, local_files_only=True))
        model = _shard_after_load(model, extra)
    with torch.no_grad():
        quantized.finish(model, extras)
    return model


def _finish_text_encoder(model: Any, part: FileComponent) -> Any:
    """What a text encoder read from ComfyUI's layout needs beyond its weights: a CLIP-L without a projection
    (FLUX's clip_l file, used by SD3) projects by the identity, as diffusers' single-file loader sets it; a
    Mistral pruned to fewer layers than published ends without the final norm, as ComfyUI runs it."""
    import torch

    projection = getattr(model, "text_projection", None)
    if isinstance(projection, torch.nn.Linear) and not _has_key(part, "text_projection.weight"):
        with torch.no_grad():
            projection.weight.copy_(torch.eye(*projection.weight.shape, dtype=projection.weight.dtype))
    return text_encoders.without_final_norm(model, part.layout)


def _has_key(part: FileComponent, key: str) -> bool:
    from safetensors import safe_open

    with safe_open(part.path, "pt") as f:
        return part.prefix + key in set(f.keys())


def _converted(root: Path, name: str, cls: type, sd: dict, dtype: Any, convert: Callable[[dict, dict], dict]) -> Any:
    """Component `name` from a layout diffusers' single-file loader does not map (FLUX.2's, Qwen-Image's, Wan's, MiniMax H3's
    VAEs, LTX-2's connectors and vocoder, Ideogram 4's transformer): its family's `convert`, which may complete the config
    from the file (MiniMax H3's latent statistics) before the class is built from it; a strict load, cast as from_pretrained casts."""
    from accelerate import init_empty_weights

    config = dict(cls.load_config(str(root), subfolder=name))
    converted = convert(sd, config)
    with init_empty_weights(include_buffers=False):
        model = cls.from_config(config)
    model.load_state_dict(converted, strict=True, assign=True)
    return in_dtype(model, dtype)


def _shard_after_load(model: Any, extra: dict) -> Any:
    """A converter's model with its float32 modules as from_pretrained keeps them; TP: each rank shards its copy."""
    config = extra.get("parallel_config")
    if keep_float32(model) is not None and config is not None:
        # from_single_file records the whole model on the CPU as a device map ({"": cpu}); nothing was placed by
        # accelerate (no hooks), but enable_parallelism refuses any device map
        if set(map(str, (getattr(model, "hf_device_map", None) or {"": "cpu"}).values())) == {"cpu"}:
            model.hf_device_map = None
        model.enable_parallelism(config=config)
    return model


def _load_checkpoint(root: Path, index: dict, checkpoint: FileComponent, loaded: dict, dtype: Any) -> Any:
    """An SD3, SDXL or FLUX.1 all-in-one checkpoint through the pipeline's own single-file loader (configs
    and tokenizers from `root`), with the parts loaded separately passed in."""
    pipe = pipeline_class(index).from_single_file(checkpoint.path, config=str(root), local_files_only=True, dtype=dtype, **loaded)
    t5 = getattr(pipe, "text_encoder_3", None) if "text_encoder_3" not in loaded else None
    if t5 is not None:  # diffusers leaves T5's embed_tokens untied (on the meta device) in single files
        t5.tie_weights()
    for module in pipe.components.values():  # it also leaves the text encoders it builds in training mode
        if hasattr(module, "eval"):
            module.eval()
    return pipe
