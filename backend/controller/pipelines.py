"""Describing a pipeline for Load TPU Pipeline (a diffusers folder) and Load TPU Pipeline (Files) (an artist's
files), what the loaders say next to themselves, the models and files they list, and the parts chained onto a
description (LoRAs, ControlNets, FLUX.1 Redux). No weight is read: configs and safetensors headers only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np

from ..families import Pipeline
from ..families.text_encoders import TOKENIZER_LAYOUTS
from ..protocol.errors import ModelError, OptionError
from ..protocol.spec import DTYPE_CHOICES, OFFLOAD_CHOICES, PipelineSpec
from ..protocol.units import format_bytes
from . import controlnets, devices, loras, models, offload, redux, storage
from .files import assemble, listing


def _check_choices(dtype: str, device_choice: str, offload: str) -> str:
    """The user's dtype, device and offload checked; the device kind they resolve to."""
    if dtype not in DTYPE_CHOICES:
        raise OptionError(f"dtype: '{dtype}' is not one of {', '.join(DTYPE_CHOICES)}.")
    if offload not in OFFLOAD_CHOICES:
        raise OptionError(f"offload: '{offload}' is not one of {', '.join(OFFLOAD_CHOICES)}.")
    kind = devices.resolve_kind(device_choice)
    if dtype == "float16" and kind == "tpu":
        raise OptionError("dtype: float16 is not a good fit for TPUs; choose 'auto' (bfloat16) instead.")
    return kind


def _check_modular_offload(family: Pipeline, offload: str, name: str) -> None:
    """CPU offload refused for a modular pipeline (from its folder or its files), naming what works."""
    if family.modular is not None and offload in ("model", "sequential"):
        raise OptionError(f"offload: '{offload}' is not available for {family.name} ('{name}'): diffusers' "
                          "modular pipelines have no CPU offload hooks (no enable_model_cpu_offload). Use offload "
                          "'none' (or 'auto', which keeps the weights on the device), or Data Parallel on more chips.")


def make_spec(model: str, roots: Iterable[str], dtype: str = "auto", device_choice: str = "auto",
              offload: str = "none", allow_pickle: bool = False) -> PipelineSpec:
    """Checks the user's choices and the model folder (no weights read) and describes the pipeline."""
    kind = _check_choices(dtype, device_choice, offload)
    path = models.resolve_model_path(model, roots)
    info = models.inspect_model(path, allow_pickle=allow_pickle)
    _check_modular_offload(info.family, offload, path.name)
    return storage.resolve_storage(PipelineSpec(
        model_path=info.path, class_name=info.class_name, size_factor=info.size_factor, dtype=dtype,
        device=device_choice, offload=offload, kind=kind, variant=info.variant))


def make_file_spec(choice: assemble.FileChoice, roots: Mapping[str, Iterable[str]], dtype: str = "auto",
                   device_choice: str = "auto", offload: str = "none") -> PipelineSpec:
    """Checks the user's choices and the chosen files (their headers; no weights read) and describes the
    pipeline they make. `roots`: ComfyUI's folders per role (listing.ROLE_FOLDERS)."""
    kind = _check_choices(dtype, device_choice, offload)
    class_name, main, source = assemble.describe_files(choice, roots)
    if kind == "tpu" and any(c.quant == "gguf" for c in source.components):
        gguf = next(c for c in source.components if c.quant == "gguf")
        raise ModelError(f"diffusion_model: '{Path(gguf.path).name}' is a GGUF file; diffusers computes GGUF "
                         "weights with CUDA or CPU kernels, which TorchTPU does not have. On a TPU use the "
                         ".safetensors version (bf16, fp16 or fp8: fp8 is upcast on load).")
    spec = PipelineSpec(model_path=main, class_name=class_name, size_factor=0, dtype=dtype, device=device_choice,
                        offload=offload, kind=kind, source=source)
    _check_modular_offload(spec.family, offload, Path(main).name)
    factor = models.vae_scale(spec.component_config("vae")) * spec.family.size_multiple_of_vae
    return storage.resolve_storage(spec.with_changes(size_factor=factor))


def describe_files(spec: PipelineSpec) -> str:
    """What a pipeline made of files is and where each part comes from, for the text next to the loader."""
    lines = [f"{spec.family.name} ({spec.class_name})"]
    for part in spec.source.components if spec.source else ():
        if part.layout in (*TOKENIZER_LAYOUTS, "checkpoint"):
            continue
        how = {"scaled-fp8": ", scaled fp8: dequantized on load", "gguf": ", GGUF"}.get(part.quant, "")
        inside = " (in the checkpoint)" if part.prefix and part.name not in ("transformer", "unet") else ""
        lines.append(f"{part.name}: {Path(part.path).name}{inside}{how}")
    if kept := storage.describe(spec):
        lines.append(kept)
    if spec.offload == "auto":  # as next to Load TPU Pipeline: what auto chose and why
        lines.append(offload.choose_offload(spec).reason)
    return "\n".join([*lines, *(spec.source.notes if spec.source else ())])


def describe_pipeline(spec: PipelineSpec) -> str:
    """What Load TPU Pipeline says next to itself: where the pipeline runs, the layout it gets by default, and
    what offload 'auto' chose and why."""
    if spec.kind == "tpu":
        host = devices.tpu_host()
        lines = [f"{spec.name} ({spec.family.name}) on {host.describe()}, "
                 f"{format_bytes(host.hbm_bytes_per_device)} per device"]
        if note := devices.v7x_default_note(host):
            lines.append(note)
    elif spec.kind == "cuda":
        n = devices.cuda_count()
        lines = [f"{spec.name} ({spec.family.name}) on CUDA ({n} GPU{'s' if n != 1 else ''})"]
    else:
        lines = [f"{spec.name} ({spec.family.name}) on the CPU"]
    if kept := storage.describe(spec):
        lines.append(kept)
    if spec.offload == "auto":
        lines.append(offload.choose_offload(spec).reason)
    return "\n".join(lines)


def list_models(roots: Iterable[str]) -> list[str]:
    """Diffusers folders in ComfyUI's diffusers folders, then the pipelines of the Hugging Face hub cache under
    their repo ids."""
    found = models.find_models([str(Path(r)) for r in roots])
    return found + [repo for repo in models.hub_models() if repo not in found]


def list_files(roots: Mapping[str, Iterable[str]]) -> dict[str, list[str]]:
    """Per role (checkpoint, diffusion_model, text_encoder, vae), the files of ComfyUI's folders that fit it."""
    return listing.list_files(roots)


def with_lora(spec: PipelineSpec, path: str, strength: float = 1.0,
              te_strength: float = 1.0, experts: str = "both") -> tuple[PipelineSpec, str]:
    """`spec` with one more LoRA (applied after the ones it has; on a model of two experts, to `experts`),
    checked; and the LoRAs, for the node's text."""
    return loras.add(spec, path, strength, te_strength, experts)


def with_controlnet(spec: PipelineSpec, path: str, image: np.ndarray, strength: float = 1.0, start: float = 0.0,
                    end: float = 1.0, union_mode: str = "none") -> tuple[PipelineSpec, str]:
    """`spec` with one more ControlNet (a diffusers folder or single file) and its control image (IMAGE
    [B, H, W, C] in 0..1), checked; and the ControlNets, for the node's text."""
    return controlnets.add(spec, path, image, strength, start, end, union_mode)


def with_redux(spec: PipelineSpec, style_model: str, clip_vision: str, image: np.ndarray,
               prompt_embeds_scale: float = 1.0, pooled_prompt_embeds_scale: float = 1.0,
               text: str = redux.TEXT_CHOICES[0]) -> tuple[PipelineSpec, str]:
    """`spec` with one more Redux reference (a style model file, a SigLIP vision file, reference images IMAGE
    [B, H, W, C] in 0..1 and FluxPriorReduxPipeline's scales), checked; and what Redux does, for the node's text."""
    return redux.add(spec, style_model, clip_vision, image, prompt_embeds_scale, pooled_prompt_embeds_scale, text)
