"""Offload 'auto': what it runs (none, model or sequential), from the weights' size in the chosen dtype (their
safetensors headers) and one device's memory, and why, for the node. Controller side: reads headers, never
weights.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..families import family_of, vaes
from ..families.text_encoders import KINDS
from ..protocol import quantized
from ..protocol.errors import CompileError, ModelError
from ..protocol.spec import PipelineSpec
from ..protocol.units import format_bytes
from . import capacity, controlnets, devices, models, redux, storage
from .components import Components
from .files import headers

OFFLOAD_HEADROOM = 0.8  # share of a device's memory the weights may fill: the rest is for activations (a few GB
# for a 1024x1024 FLUX image), the compiler's buffers and the runtime itself
_FLOAT_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


@dataclass(frozen=True)
class OffloadChoice:
    mode: str  # none | model | sequential
    reason: str  # what was chosen and why, for the node


def _per_device(parts: dict[str, int], degree: int, sharded: Sequence[str]) -> float:
    """Weights one device holds when the transformer (and the `sharded` text encoders) are split `degree` ways."""
    return sum(b / degree if n == "transformer" or n in sharded else b for n, b in parts.items())


def choose_offload(spec: PipelineSpec, model: Components | None = None) -> OffloadChoice:
    """What offload 'auto' runs, from the weights' size in the chosen dtype (safetensors headers; ControlNets
    and Redux included) and one device's memory (TorchTPU's HBM per device, CUDA's total memory): none when everything fits with room for
    activations, model when the largest component does, else sequential (with a note when Shard TP would fit).
    Under Shard TP always none: diffusers refuses offload on a sharded model. `model`: its components,
    where the caller has read them."""
    if spec.kind == "cpu":
        return OffloadChoice("none", "offload auto → none: on the CPU the weights stay in host memory anyway")
    memory = devices.device_memory_bytes(spec.kind)
    dtype = "bfloat16" if spec.dtype == "auto" else storage.compute_dtype(spec)
    float_bytes = _FLOAT_BYTES[dtype]
    pipeline = models.weight_bytes(spec, float_bytes)
    one_byte = models.weight_bytes(spec, 1) if spec.storage else {}
    parts = {**pipeline, **controlnets.weight_bytes(spec, float_bytes), **redux.weight_bytes(spec, float_bytes)}
    parts = dequantized_at_load(spec, parts, float_bytes)
    if spec.storage:  # fp8 storage: the denoiser counts at its stored size
        parts = storage.stored_bytes(spec, parts, one_byte)
        dtype = f"{dtype} ({spec.storage} denoiser)"
    if memory is None or not parts:
        return OffloadChoice("none", "offload auto → none (the device's memory or the model's size is unknown)")
    usable = memory * OFFLOAD_HEADROOM
    room = f"{format_bytes(usable)} of the {format_bytes(memory)} per device (the rest is kept for activations)"
    if spec.tp_degree > 1:
        per = _per_device(parts, spec.tp_degree, spec.sharded_encoders)
        more = "" if per <= usable else f", more than {room}: use a larger Shard TP degree"
        return OffloadChoice("none", f"offload auto → none (a sharded model cannot be offloaded): about "
                                     f"{format_bytes(per)} of weights per device in {dtype}{more}")
    total = sum(parts.values())
    what = f"the weights take {format_bytes(total)} in {dtype} ({', '.join(f'{n} {format_bytes(b)}' for n, b in parts.items())})"
    if total <= usable:
        return OffloadChoice("none", f"offload auto → none: {what}, within {room}")
    if spec.family.modular is not None:
        fix = "Use a device with more memory." if spec.storage or (spec.source and spec.source.quantized()) else \
            "Choose dtype float8_e4m3fn (the denoiser in fp8) if that fits, or use a device with more memory."
        raise ModelError(f"offload: auto cannot fit {spec.family.name} on one {spec.kind} device: {what}, more than "
                         f"{room}, and it is a diffusers modular pipeline, which has no CPU offload hooks to move "
                         f"parts off the device. {fix}")  # fp8 storage is refused for ComfyUI's quantized files
    biggest = max(parts, key=lambda n: parts[n])
    if parts[biggest] <= usable:
        return OffloadChoice("model", f"offload auto → model: {what}, more than {room}; the largest part "
                                      f"({biggest}, {format_bytes(parts[biggest])}) fits, so each part moves onto the "
                                      "device while it runs and waits in host memory otherwise")
    return OffloadChoice("sequential", f"offload auto → sequential: {what}; even {biggest} "
                                       f"({format_bytes(parts[biggest])}) is more than {room}, so the weights move onto "
                                       f"the device layer by layer (slow).{_tp_hint(spec, parts, usable, model)}")


def _check_sequential(spec: PipelineSpec, mode: str) -> None:
    """Sequential offload moves each layer's weights around its call, which comfy-kitchen's quantized tensors are
    not tested under: refused for ComfyUI's quantized files, with the way out. And for a family whose text encoder
    kind declares that accelerate's layer hooks fail on its tied embeddings (LTX-2's Gemma 3 and Gemma 4)."""
    if mode != "sequential":
        return
    encoder = str(spec.component_config("text_encoder").get("model_type", ""))
    if any(KINDS[kind].tied_embeddings_break_sequential_offload for kind in family_of(spec.family).text_kinds()):
        raise ModelError(f"offload: sequential offload cannot run {spec.family.name}'s {encoder} text encoder: "
                         "accelerate's layer-by-layer hooks fail on its tied embedding weights (a TypeError in its "
                         "first layer, plain diffusers' enable_sequential_cpu_offload included). Choose offload "
                         "'model' (each part moves onto the device while it runs), with dtype float8_e4m3fn where "
                         "the transformer does not fit in bfloat16, or a device with more memory.")
    quantized = spec.source.quantized() if spec.source else None
    if quantized is not None:
        raise ModelError(f"offload: sequential offload cannot run '{Path(quantized.path).name}', one of ComfyUI's "
                         "quantized files (its layers stay quantized and are dequantized as they run). Choose offload "
                         "'model' or 'none' (the file already takes about half of bfloat16's memory), or Shard TP "
                         "with the bf16 file.")


def dequantized_at_load(spec: PipelineSpec, parts: dict[str, int], float_bytes: int) -> dict[str, int]:
    """`parts` with the layers of ComfyUI's quantized files that the worker dequantizes at load counted at their
    dequantized size: those this device cannot keep quantized (a TPU: the 4-bit and block-scaled formats), every
    layer of a part its family's converter reads (plain weights in: MiniMax H3's int8 ConvRot video VAE, on any
    device) and of the sharded transformer under Shard TP (docs/quantized.md)."""
    out = dict(parts)
    for part in spec.source.components if spec.source else ():
        if part.quant != "comfy-quant" or part.name not in out:
            continue
        header = headers.read_header(Path(part.path))
        q = header.quantized
        if q is not None:
            kind = "tpu" if spec.mode == "compiled" else spec.kind  # compiled: the TPU's plain layers (aten only)
            mine = [p for p in q.layers if p.startswith(tuple(part.prefix.split("|")))]  # this part's, in its file
            whole = part.layout in vaes.CONVERTED or (spec.tp_degree > 1 and part.name == "transformer")
            layers = mine if whole else [p for p in q.dequantized_at_load(kind) if p in mine]
            out[part.name] += quantized.float_bytes(header.shapes, q, layers, float_bytes,
                                                    functools.partial(header.tensor_bytes, float_bytes=float_bytes))
    return out


def _tp_hint(spec: PipelineSpec, parts: dict[str, int], usable: float, model: Components | None) -> str:
    """The smallest Shard TP degree this host runs under which the weights would fit, as a suggestion."""
    if not spec.family.tp_plan:
        return ""
    model = model or Components(spec)
    shardable = model.shardable
    for d in capacity.host_capacity(spec.kind).tp_degrees(model.heads):
        if d == 1:
            continue
        if _per_device(parts, d, ()) <= usable:
            return f" Shard TP degree {d} would fit (about {format_bytes(_per_device(parts, d, ()))} per device) without offload."
        if shardable and _per_device(parts, d, shardable) <= usable:
            return (f" Shard TP degree {d} with shard_text_encoders on would fit (about "
                    f"{format_bytes(_per_device(parts, d, shardable))} per device) without offload.")
    return " It does not fit this host's devices even with Shard TP over all of them."


def resolve_offload(spec: PipelineSpec, model: Components | None = None) -> PipelineSpec:
    """`spec` with offload 'auto' turned into what it runs (none / model / sequential), once, before any worker
    sees it; other choices unchanged."""
    if spec.offload != "auto":
        _check_sequential(spec, spec.offload)
        return spec
    choice = choose_offload(spec, model)
    _check_sequential(spec, choice.mode)
    if choice.mode == "sequential" and spec.mode == "compiled":
        raise CompileError(f"offload: 'auto' has to choose 'sequential' here ({choice.reason.split(': ', 1)[1]}), "
                           "and sequential offload cannot be compiled. Use Shard TP, or an eager mode.")
    return spec.with_changes(offload=choice.mode)
