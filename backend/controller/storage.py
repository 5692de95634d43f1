"""fp8 storage of the denoiser's weights: which dtype they are kept in on the device, decided once per request.

The worker keeps them there with diffusers' own `enable_layerwise_casting` (each layer's weights cast to the
compute dtype while it runs, and back). An artist's fp8 file keeps its fp8 weights when the dtype is 'auto'; the
dtype choice 'float8_e4m3fn' stores any model's denoiser in fp8 and computes in bfloat16.
"""

from __future__ import annotations

from pathlib import Path

from ..protocol.errors import CompileError, ModelError
from ..protocol.spec import DENOISERS, PipelineSpec
from .files import headers

FP8_CHOICE = "float8_e4m3fn"  # the dtype choice that asks for fp8 storage (DTYPE_CHOICES)
FP8_COMPUTE = "bfloat16"  # what that choice computes in
_FILE_FP8 = {"F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}  # safetensors dtype -> torch dtype name


def compute_dtype(spec: PipelineSpec) -> str:
    """The dtype name the weights compute in for a dtype choice ('auto' stays 'auto': the device decides)."""
    return FP8_COMPUTE if spec.dtype == FP8_CHOICE else spec.dtype


def file_fp8(spec: PipelineSpec) -> str:
    """The fp8 dtype the denoiser's matrices have in the artist's file ("" when it is not a plain fp8 file):
    read from the safetensors header, no weight read."""
    part = next((spec.source.component(n) for n in DENOISERS if spec.source and spec.source.component(n)), None)
    if part is None or part.quant or not part.path.endswith(".safetensors"):
        return ""
    header = headers.read_header(Path(part.path))
    matrices = [d for k, d in header.dtypes.items()
                if k.startswith(part.prefix) and k.endswith(".weight") and len(header.shapes[k]) >= 2]
    found = {_FILE_FP8[d] for d in matrices if d in _FILE_FP8}
    return found.pop() if len(found) == 1 and len(matrices) > 0 else ""


def resolve_storage(spec: PipelineSpec) -> PipelineSpec:
    """`spec` with `storage` set: the file's fp8 dtype ('auto' on an fp8 file, except in compiled mode, where the
    weights are upcast as before), or fp8 for the 'float8_e4m3fn' choice (refused where it cannot run)."""
    found = file_fp8(spec)
    if spec.dtype != FP8_CHOICE:
        keep = found if spec.dtype == "auto" and spec.mode != "compiled" else ""
        return spec.with_changes(storage=keep)
    if spec.mode == "compiled":
        raise CompileError("dtype: float8_e4m3fn (fp8 storage) cannot be compiled: diffusers' layerwise casting "
                           "changes each layer's weights between fp8 and bfloat16 inside its call, which "
                           "torch.compile cannot trace into one graph. Choose an eager mode, or dtype auto or "
                           "bfloat16 to compile.")
    quantized = next((c for c in (spec.source.components if spec.source else ())
                      if c.name in DENOISERS and c.quant), None)
    if quantized is not None:
        how = {"gguf": "GGUF", "comfy-quant": "ComfyUI's quantized format (int8, nvfp4, ...)"}.get(
            quantized.quant, "ComfyUI's scaled fp8 (weights with per-layer scales)")
        raise ModelError(f"dtype: float8_e4m3fn storage needs plain weights; '{Path(quantized.path).name}' is "
                         f"{how}, which would be rounded a second time. Choose dtype auto for this file.")
    if spec.offload == "sequential":
        raise ModelError("dtype: float8_e4m3fn storage cannot be combined with offload 'sequential' (both move "
                         "each layer's weights around its call); choose offload 'none' or 'model' — fp8 weights "
                         "take half the memory, so they may fit without offload.")
    return spec.with_changes(storage=found or FP8_CHOICE)


def stored_bytes(spec: PipelineSpec, parts: dict[str, int], one_byte: dict[str, int]) -> dict[str, int]:
    """`parts` (bytes per component in the compute dtype) with the denoiser at its stored size under fp8
    storage: `one_byte` counts every float at one byte (the few layers diffusers keeps in the compute dtype,
    norms and embedders, are a fraction of a per cent of a DiT)."""
    if not spec.storage:
        return parts
    return {n: one_byte.get(n, b) if n in DENOISERS else b for n, b in parts.items()}


def describe(spec: PipelineSpec) -> str:
    """One line for the loader's text ('' without fp8 storage)."""
    if not spec.storage:
        return ""
    return (f"the denoiser's weights stay in {spec.storage} (half of bfloat16's memory) and each layer computes "
            f"in {compute_dtype(spec) if spec.dtype != 'auto' else 'the device dtype'} (diffusers' layerwise "
            "casting)")
