"""fp8 storage of the loaded denoiser (worker side): diffusers' own layerwise casting (`apply_layerwise_casting`,
what `enable_layerwise_casting` calls).

Each cast layer's weights are kept in the storage dtype and cast to the compute dtype while it runs. A denoiser read
from safetensors files in diffusers' layout (a model folder, an artist's file in diffusers' layout) is read straight
into that storage, a few tensors at a time, so the worker never holds its bfloat16 copy nor the file's pages: the
peak while loading is about the stored size. Any other (tensor parallel, single-file layouts, pickle weights) is
loaded whole by diffusers and then cast, before the weights go to the device, so the device only ever holds the
stored copy.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from ..protocol.spec import PipelineSpec
from .compiler import experts

_CHUNK_ELEMENTS = 32 * 2**20  # tensor elements mapped at once while reading into storage (64 MB in bfloat16)


def skip_patterns(module: torch.nn.Module) -> tuple[str, ...]:
    """The layers left in the compute dtype: diffusers' own choice (its default patterns, the model's
    `_skip_layerwise_casting_patterns` and float32 modules) less 'norm'. Only linear, convolution and embedding
    layers are ever cast, so 'norm' only keeps the AdaLN modulation projections inside norm-named modules (a
    quarter of FLUX.1's weights, 6 GB of it in bfloat16) out of fp8; ComfyUI stores them in fp8, and fp8 files
    hold them in fp8 (Qwen-Image's, named img_mod, diffusers casts already)."""
    from diffusers.hooks.layerwise_casting import DEFAULT_SKIP_MODULES_PATTERN

    found = (*DEFAULT_SKIP_MODULES_PATTERN, *(getattr(module, "_skip_layerwise_casting_patterns", None) or ()),
             *(getattr(module, "_keep_in_fp32_modules", None) or ()))
    return tuple(sorted({p for p in found if p != "norm"}))


def keep_float32(model: Any) -> Any:
    """`model` (a module, or None) with the parameters of the modules its class keeps in float32
    (`_keep_in_fp32_modules`: FLUX 3's QK norms) in float32, as diffusers' from_pretrained keeps them in any compute
    dtype; its from_single_file (0.42.1) keeps them only in float16, so a converted file would run them in bfloat16
    where the diffusers folder runs them in float32. Quantized and GGUF tensors are left as they are."""
    keep32 = set(getattr(model, "_keep_in_fp32_modules", None) or ())
    for name, param in model.named_parameters() if keep32 else ():
        if keep32 & set(name.split(".")) and type(param.data) is torch.Tensor and param.is_floating_point():
            param.data = param.data.to(torch.float32)
    return model


def in_dtype(model: Any, dtype: Any) -> Any:
    """`model` computing in `dtype`, cast as diffusers' from_pretrained casts it: whole where its class keeps nothing
    in float32; else parameter by parameter, its `_keep_in_fp32_modules` (matched on the parts of the names, as
    diffusers matches them: MiniMax H3's patch projections, time embedder, output heads, most of its audio VAE) left
    in float32, its buffers as built and comfy-kitchen's quantized weights as they are."""
    keep = set(getattr(model, "_keep_in_fp32_modules", None) or ())
    if not keep:
        return model.to(dtype).eval()
    for name, param in model.named_parameters():
        if type(param.data).__name__ != "QuantizedTensor" and param.is_floating_point():
            param.data = param.data.to(torch.float32 if keep & set(name.split(".")) else dtype)
    return model.eval()


def cast_layerwise(module: torch.nn.Module, storage: torch.dtype, compute: torch.dtype) -> None:
    """diffusers' layerwise casting of `module` with the pack's skip patterns (what every fp8 denoiser gets)."""
    from diffusers.hooks import apply_layerwise_casting

    apply_layerwise_casting(module, storage_dtype=storage, compute_dtype=compute,
                            skip_modules_pattern=skip_patterns(module))


def keep_in_storage_dtype(pipe: Any, spec: PipelineSpec, compute: torch.dtype) -> None:
    """The denoiser of `pipe` (and its second model: compiler.experts) stored in `spec.storage` (an
    fp8 dtype) and computed in `compute`; nothing without fp8 storage, or for a denoiser read into storage already
    (load_stored)."""
    if not spec.storage:
        return
    storage = getattr(torch, spec.storage)
    for module in experts(pipe):
        if any(compute_dtype_of(sub) is not None for sub in module.modules()):
            continue
        cast_layerwise(module, storage, compute)
        with torch.no_grad():  # the layers left in the compute dtype may still view the loader's mapping of the
            for param in module.parameters():  # file, which would keep its pages in host memory: own copies
                if param.dtype != storage and not hasattr(param, "to_local"):
                    param.data = param.data.clone()


def return_freed_blocks() -> None:
    """CPU workers with fp8 storage: glibc hands every block of 1 MiB or more back to the system as it is freed.
    Layerwise casting allocates each layer's weights anew on every call (in the compute dtype to run, in fp8 after);
    glibc by default raises its mmap threshold as the first such block is freed, keeps the later ones in its heap,
    and the worker's RSS grew back to about the bfloat16 size (wide-flux's transformer: 546 MB held after two calls
    for 268 MB stored; 283 MB with this). On a TPU or GPU the device's own allocator reuses the blocks."""
    import ctypes
    import ctypes.util
    import sys

    if not sys.platform.startswith("linux"):
        return
    mallopt = getattr(ctypes.CDLL(ctypes.util.find_library("c")), "mallopt", None)
    if mallopt is not None:  # glibc; M_MMAP_THRESHOLD is -3, and setting it ends the dynamic threshold
        mallopt(-3, 1 << 20)


def load_stored(cls: type, folder: Path, storage: torch.dtype, compute: torch.dtype, variant: str = "") -> Any:
    """Model class `cls` from the diffusers-layout `folder` (config.json and safetensors weights), its cast layers
    read into `storage` tensor by tensor: an empty model, diffusers' layerwise casting on it, then each tensor
    rounded as diffusers' load in `compute` followed by the cast would round it. None when the folder has no
    safetensors weights (the caller loads it whole)."""
    from accelerate import init_empty_weights

    files = _weight_files(folder, variant)
    if not files:
        return None
    with init_empty_weights():
        model = cls.from_config(cls.load_config(str(folder)))
    cast_layerwise(model, storage, compute)
    keep32 = set(getattr(model, "_keep_in_fp32_modules", None) or ())
    empty = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    for name, tensor in file_tensors(files):
        if name not in empty:
            continue  # as diffusers: keys the model does not have are left out
        value = tensor
        if tensor.is_floating_point():
            value = tensor.to(torch.float32 if keep32 & set(name.split(".")) else compute)
            if empty[name].dtype == storage:
                value = value.to(storage)
        if value.data_ptr() == tensor.data_ptr():  # never keep a view of the file's mapping (all of its pages)
            value = value.clone()
        owner, _, attr = name.rpartition(".")
        sub = model.get_submodule(owner)
        if attr in sub._parameters:
            sub._parameters[attr] = torch.nn.Parameter(value, requires_grad=False)
        else:
            sub._buffers[attr] = value
    missing = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if missing:
        raise OSError(f"{folder}: the weights lack {len(missing)} tensors of {cls.__name__} (first: {missing[0]})")
    if not keep32:  # as diffusers' from_pretrained: the buffers made by the model itself in the compute dtype
        for sub in model.modules():
            for attr, buffer in sub._buffers.items():
                if buffer is not None and buffer.is_floating_point() and buffer.dtype != compute:
                    sub._buffers[attr] = buffer.to(compute)
    model.register_to_config(_name_or_path=str(folder))
    return model.eval()


def _weight_files(folder: Path, variant: str) -> list[Path]:
    """The safetensors files of a diffusers model folder (sharded ones through their index), [] when none."""
    stem = "diffusion_pytorch_model" + (f".{variant}" if variant else "")
    index = folder / f"{stem}.safetensors.index.json"
    if index.is_file():
        return [folder / f for f in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    single = folder / f"{stem}.safetensors"
    return [single] if single.is_file() else []


def file_tensors(files: list[Path], wanted: Callable[[str], bool] | None = None
                 ) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors of `files` (those whose name is `wanted`), read through a fresh mapping every _CHUNK_ELEMENTS:
    safetensors maps a whole file and its tensors view that mapping, whose pages stay in memory until the file is
    closed and no view is left. A caller that keeps a tensor keeps its own copy."""
    from safetensors import safe_open

    for file in files:
        with safe_open(str(file), "pt") as f:
            sizes = {k: math.prod(f.get_slice(k).get_shape()) for k in f.keys()
                     if wanted is None or wanted(k)}
        chunks: list[list[str]] = [[]]
        for key, size in sizes.items():
            if chunks[-1] and sum(sizes[k] for k in chunks[-1]) + size > _CHUNK_ELEMENTS:
                chunks.append([])
            chunks[-1].append(key)
        for keys in chunks:
            with safe_open(str(file), "pt") as f:
                for key in keys:
                    yield key, f.get_tensor(key)


def compute_dtype_of(module: torch.nn.Module) -> torch.dtype | None:
    """The dtype a layer computes in when its weights are stored in another one (layerwise casting), else None."""
    registry = getattr(module, "_diffusers_hook", None)
    hook = registry.get_hook("layerwise_casting") if registry is not None else None
    return hook.compute_dtype if hook is not None else None


def compute_dtype_of_model(module: torch.nn.Module) -> torch.dtype:
    """The dtype a model computes in: its layers' compute dtype under layerwise casting, else its weights'."""
    for sub in module.modules():
        if (dtype := compute_dtype_of(sub)) is not None:
            return dtype
    return next(module.parameters()).dtype
