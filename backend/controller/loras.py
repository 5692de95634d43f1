"""LoRAs on a pipeline description: each one checked against the pipeline it is added to (a finite strength, an
offload that keeps weights on the device, weights that are not GGUF-quantized, a readable LoRA file, an expert
choice the model has), and added after the ones it has. The worker writes them into the weights in place (worker/lora.py)."""

from __future__ import annotations

import math
from pathlib import Path

from ..protocol.errors import ModelError
from ..protocol.spec import LORA_EXPERTS, LoraRef, PipelineSpec
from . import models


def check(spec: PipelineSpec, lora: LoraRef) -> None:
    """A LoRA that can be written into this pipeline; raises an InputError naming the input and the fix."""
    for name, value in (("strength", lora.strength), ("strength_text_encoder", lora.te_strength)):
        if not (isinstance(value, (int, float)) and math.isfinite(value)):
            raise ModelError(f"{name}: {value!r} is not a number a LoRA can be applied with ('{lora.name}'); "
                             "give a finite value such as 1.0 (0 turns the LoRA off).")
    if spec.offload == "sequential":
        raise ModelError(f"lora_name: '{lora.name}' cannot be applied with offload 'sequential', which keeps the "
                         "weights off the device between layers (offload 'auto' picks it for a model too big for "
                         "the chip); choose offload 'model' or 'none' in the Load TPU Pipeline node.")
    gguf = next((c for c in spec.source.components if c.quant == "gguf"), None) if spec.source else None
    if gguf is not None:
        raise ModelError(f"lora_name: '{lora.name}' cannot be applied to '{Path(gguf.path).name}', a GGUF file whose "
                         "weights stay quantized; use the safetensors version of the model to apply LoRAs.")
    if lora.experts not in LORA_EXPERTS:
        raise ModelError(f"experts: '{lora.experts}' is not one of {', '.join(LORA_EXPERTS)}.")
    if lora.experts != "both" and not is_pair(spec):
        raise ModelError(f"experts: '{lora.experts}' picks one expert of a model of two (Wan 2.2 A14B's high-noise "
                         f"and low-noise diffusion models), but '{spec.name}' has one denoiser; choose 'both' for "
                         f"'{lora.name}'.")
    models.check_lora(lora.path)


def is_pair(spec: PipelineSpec) -> bool:
    """A model of two experts (Wan 2.2 A14B: `transformer` high noise, `transformer_2` low noise)."""
    return any(spec.model_index().get("transformer_2") or ())  # a one-denoiser WanPipeline saves [null, null]


def add(spec: PipelineSpec, path: str, strength: float = 1.0, te_strength: float = 1.0,
        experts: str = "both") -> tuple[PipelineSpec, str]:
    """`spec` with one more LoRA (applied after the ones it has), checked; and the LoRAs, for the node's text.
    Never reloads the model: the worker rewrites the touched weights in place."""
    lora = LoraRef(str(Path(path).resolve()), strength, te_strength, experts)
    check(spec, lora)
    spec = spec.with_changes(loras=(*spec.loras, lora))
    pair = is_pair(spec)
    lines = [f"{i}. {x.name}: strength {x.strength:g}, text encoder {x.te_strength:g}"
             + (f", experts: {x.experts}" if pair else "") for i, x in enumerate(spec.loras, 1)]
    return spec, "LoRAs (applied in this order):\n" + "\n".join(lines)
