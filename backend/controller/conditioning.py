"""Sample's positive and negative CONDITIONING: ComfyUI's own text encodings instead of the prompt text (controller
side; numpy only).

ComfyUI's CONDITIONING is a list of [tensor, dict] entries. What CLIP Text Encode, CLIPTextEncodeFlux,
CLIPTextEncodeSD3, FluxGuidance, ConditioningConcat, ConditioningAverage and ConditioningZeroOut make is one
entry whose tensor is the pipeline's `prompt_embeds` and whose "pooled_output" is its `pooled_prompt_embeds`, in
diffusers' layout for FLUX.1, SD3 and SDXL (the mapping per family: `Pipeline.embeddings`). Each is checked here
(one entry, a float tensor of the family's widths, finite, bounded in length, no keys that need ComfyUI's own
sampler), zero-padded to the text length the pack's own text path gives (what compiled mode compiles for, so
prompts of any length up to it share one graph), and sent to the workers as arrays, like Sample's images.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import families
from ..families import Embeddings, config_dir
from ..protocol.errors import ModelError, SampleError
from ..protocol.spec import PipelineSpec, SampleRequest, read_json

ENTRY_KEYS = ("pooled_output", "guidance")  # what the mapped nodes put in an entry's dict
CONDITIONED = "positive CONDITIONING"  # the request's prompt when the embeddings replace the text
# keys of nodes whose meaning needs ComfyUI's own sampler: what each is, for the message
SAMPLER_KEYS = {
    "area": "area conditioning (Conditioning (Set Area))", "mask": "mask conditioning (Conditioning (Set Mask))",
    "strength": "a conditioning strength (Conditioning (Set Area/Mask))",
    "start_percent": "a timestep range (ConditioningSetTimestepRange)",
    "end_percent": "a timestep range (ConditioningSetTimestepRange)",
    "control": "a ControlNet from ComfyUI's Apply ControlNet (the pack's is Apply ControlNet (TPU), on the pipeline)",
    "gligen": "GLIGEN boxes",
    "reference_latents": "reference latents (ReferenceLatent)", "hooks": "hooks (Set CLIP Hooks)",
}
IGNORED_VALUES = {"strength": 1.0, "start_percent": 0.0, "end_percent": 1.0}  # these values change nothing


@dataclasses.dataclass(frozen=True)
class Conditioned:
    """A request whose text is replaced by embeddings: the request as the workers take it, the arrays, notes."""

    req: SampleRequest
    arrays: dict[str, np.ndarray]
    notes: tuple[str, ...]


def apply(spec: PipelineSpec, req: SampleRequest, positive: Sequence | None,
          negative: Sequence | None) -> Conditioned | None:
    """Checks Sample's CONDITIONING inputs against the model and the request (raising an InputError naming the
    input and the fix) and turns them into the workers' arrays; None when neither is connected.

    `positive` / `negative`: ComfyUI's CONDITIONING with its tensors as numpy arrays (nodes/comfy_bridge)."""
    if positive is None and negative is None:
        return None
    family = spec.family
    mapping = family.embeddings
    if mapping is None:
        which = "positive" if positive is not None else "negative"
        raise ModelError(f"{which}: {family.name} ('{spec.name}') takes no CONDITIONING: {_unmapped(family)} "
                         f"(CONDITIONING works with {families.conditioned_names()}). Disconnect {which} and write "
                         "the prompt in Sample's prompt instead.")
    if positive is None:
        raise SampleError("negative: a negative CONDITIONING needs a positive one; connect CLIP Text Encode to "
                          "positive too (or disconnect negative and use Sample's negative_prompt).")
    if req.prompt_per_line:
        raise SampleError("prompt_per_line: with a positive CONDITIONING there is one prompt, the conditioning's; "
                          "turn prompt_per_line off (batch_size still gives several images).")
    widths = mapping.widths(spec.component_config(families.family_of(family).denoiser))
    pos_embeds, pos_pooled, extras = _entry("positive", positive, widths, spec, mapping)
    notes = []
    if req.prompt.strip() or req.negative_prompt.strip():
        notes.append("prompt and negative_prompt are not used: the positive CONDITIONING replaces them")
    guidance = req.guidance
    if "guidance" in extras:
        if mapping.guidance:  # FLUX.1's embedded guidance
            guidance = float(extras["guidance"])
            notes.append(f"guidance {guidance:g} from the positive CONDITIONING (FluxGuidance); the guidance "
                         "widget is not used")
        else:
            notes.append(f"the positive CONDITIONING's guidance (FluxGuidance) is not used: {family.name} has no "
                         "guidance embedding; the guidance widget sets its CFG scale")
    arrays = {"prompt_embeds": pos_embeds, "pooled_prompt_embeds": pos_pooled}
    two_passes = family.cfg_passes == "batch" and guidance > family.cfg_above
    if negative is not None:
        neg_embeds, neg_pooled, _ = _entry("negative", negative, widths, spec, mapping)
        if not family.cfg_passes:
            notes.append(f"negative is not used: {family.name} runs one pass per step (diffusers' {family.class_name} "
                         "has no negative prompt)")
        elif family.cfg_passes == "branches" and spec.true_cfg_scale <= 1:
            notes.append(f"negative is not used: {family.name} runs one pass per step unless Sampling Options' "
                         "true_cfg_scale is above 1")
        elif family.cfg_passes == "batch" and not two_passes:
            notes.append(f"negative is not used: guidance {guidance:g} runs no classifier-free guidance")
        else:
            arrays |= {"negative_prompt_embeds": neg_embeds, "negative_pooled_prompt_embeds": neg_pooled}
    elif two_passes:
        raise SampleError(f"negative: {family.name} runs classifier-free guidance at guidance {guidance:g}, which "
                          "needs a negative CONDITIONING beside the positive one. Connect CLIP Text Encode (empty "
                          "text for none) or ConditioningZeroOut to negative, or set guidance to 1.")
    length = max(a.shape[1] for name, a in arrays.items() if name.endswith("prompt_embeds"))
    length = -(-length // mapping.length) * mapping.length  # the text path's length, or whole chunks of it
    for name in ("prompt_embeds", "negative_prompt_embeds"):
        if name in arrays:
            a = arrays[name]
            arrays[name] = np.pad(a, ((0, 0), (0, length - a.shape[1]), (0, 0)))
    return Conditioned(dataclasses.replace(req, prompt=CONDITIONED, negative_prompt="", guidance=guidance),
                       arrays, tuple(notes))


def comfy_encodes(clip_type: str, node: str) -> bool | None:
    """Whether the running ComfyUI has the encoder: `node` and CLIPLoader's `clip_type`; None outside ComfyUI."""
    mapping = getattr(sys.modules.get("nodes"), "NODE_CLASS_MAPPINGS", None)
    if not isinstance(mapping, dict) or "CLIPLoader" not in mapping:
        return None
    try:
        types = mapping["CLIPLoader"].INPUT_TYPES()["required"]["type"][0]
    except (AttributeError, KeyError, IndexError, TypeError):
        return None
    return node in mapping and clip_type in types


def _unmapped(family: families.Pipeline) -> str:
    """Why a family's CONDITIONING is not taken: the running ComfyUI has no encoder for it (0.3.75 has no
    Qwen3-VL one), or its encoding is not mapped onto the pipeline's prompt embeddings."""
    if family.comfy_encoder:
        clip_type, node = family.comfy_encoder
        how = f"its templates encode with CLIPLoader type '{clip_type}' and {node}"
        has = comfy_encodes(clip_type, node)
        if has is False:
            return (f"this ComfyUI has no text encoder for it ({how}, which a later ComfyUI brings), so no "
                    "CONDITIONING of it exists here to map")
        return f"{how}, whose encoding is not mapped onto its diffusers pipeline's prompt embeddings yet"
    return "ComfyUI's encoding for it does not map onto its diffusers pipeline's prompt embeddings here"


def _entry(name: str, conditioning: Sequence, widths: tuple[int, int], spec: PipelineSpec,
           mapping: Embeddings) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """One CONDITIONING's (embeddings [1, L, D], pooled [1, P] float32, its other keys), checked."""
    if not isinstance(conditioning, (list, tuple)) or not conditioning:
        raise SampleError(f"{name}: this is not a CONDITIONING with an entry; connect CLIP Text Encode's output.")
    if len(conditioning) > 1:
        raise SampleError(f"{name}: this CONDITIONING holds {len(conditioning)} entries (ConditioningCombine, or "
                          "area or timestep-range conditionings combined): Sample takes one encoding per input. "
                          "Use ConditioningConcat or ConditioningAverage to join encodings into one, or ComfyUI's "
                          "KSampler for combined conditionings.")
    entry = conditioning[0]
    if not isinstance(entry, (list, tuple)) or len(entry) != 2 or not isinstance(entry[1], dict):
        raise SampleError(f"{name}: this is not a CONDITIONING entry ([embeddings, options]); connect CLIP Text "
                          "Encode's output.")
    embeds, extras = np.asarray(entry[0]), dict(entry[1])
    for key, value in extras.items():
        if key in ENTRY_KEYS or (key in IGNORED_VALUES and value == IGNORED_VALUES[key]) or value is None:
            continue
        what = SAMPLER_KEYS.get(key, f"'{key}' (set by a node Sample does not map)")
        raise SampleError(f"{name}: this CONDITIONING carries {what}, which only ComfyUI's own sampler applies; "
                          "Sample takes plain encodings (CLIP Text Encode, FluxGuidance, ConditioningConcat, "
                          "ConditioningAverage). Remove that node, or use ComfyUI's KSampler for it.")
    if extras.get("guidance") is not None:
        extras["guidance"] = _guidance(name, extras["guidance"])
    pooled = extras.get("pooled_output")
    pooled = None if pooled is None else np.asarray(pooled)
    width, pooled_width = widths
    if embeds.ndim != 3 or pooled is None or pooled.ndim != 2 or not _floats(embeds) or not _floats(pooled):
        shape = f"{list(embeds.shape)} {embeds.dtype}" + ("" if pooled is None else f", pooled {list(pooled.shape)}")
        raise SampleError(f"{name}: a CONDITIONING of {shape} (no pooled output, or not float tensors) cannot be used; "
                          f"{spec.family.name} takes [1, tokens, {width}] with a pooled output [1, {pooled_width}], "
                          "as CLIP Text Encode makes.")
    if embeds.shape[-1] != width or pooled.shape[-1] != pooled_width:
        source = _source(embeds.shape[-1], pooled.shape[-1])
        raise ModelError(f"{name}: this CONDITIONING is {embeds.shape[-1]} wide (pooled {pooled.shape[-1]})"
                         f"{source}; {spec.family.name} '{spec.name}' takes {width} (pooled {pooled_width}). Encode "
                         f"with its own text encoders: {mapping.encoders}, into CLIP Text Encode.")
    if embeds.shape[0] != 1 or pooled.shape[0] != 1:
        raise SampleError(f"{name}: this CONDITIONING holds a batch of {embeds.shape[0]} encodings; Sample takes one "
                          "(batch_size makes several images of it).")
    longest = mapping.length * mapping.chunks
    if not 1 <= embeds.shape[1] <= longest:
        raise SampleError(f"{name}: this CONDITIONING is {embeds.shape[1]} tokens long; {spec.family.name} takes at "
                          f"most {longest} (its text encoders' limit as the pipeline uses them). Shorten the text.")
    embeds, pooled = embeds.astype(np.float32), pooled.astype(np.float32)
    if not (np.isfinite(embeds).all() and np.isfinite(pooled).all()):
        raise SampleError(f"{name}: this CONDITIONING holds values that are not numbers (NaN or infinity); check "
                          "the nodes that made it.")
    return embeds, pooled, extras


def _guidance(name: str, value: Any) -> float:
    """The entry's 'guidance' as FluxGuidance sets it: one finite float (a Python int too). A string, several
    values, or an integer or bool tensor (a third-party node's encoding) would fail deep in the pipeline with a
    bare TypeError, or be taken for a number it is not: refused, naming the input, the key and the type."""
    if isinstance(value, bool) or isinstance(value, (str, bytes)):
        what = f"a {type(value).__name__} ({value!r:.40})"
    elif isinstance(value, (int, float)):
        what = "" if math.isfinite(value) else f"{value}"
    else:
        try:
            a = np.asarray(value)
        except Exception:
            a = np.asarray(None, dtype=object)
        if _floats(a) and a.size == 1 and np.isfinite(a).all():
            return float(a.reshape(()))
        what = (f"a {a.dtype} tensor of shape {list(a.shape)}" if a.dtype != object
                else f"a {type(value).__name__}")
    if not what:
        return float(value)
    raise SampleError(f"{name}: this CONDITIONING's 'guidance' is {what}, not one finite number; FluxGuidance sets "
                      "one (e.g. 3.5). Set it with FluxGuidance, or remove the node that set it.")


def _floats(a: np.ndarray) -> bool:
    return np.issubdtype(a.dtype, np.floating)


def _source(width: int, pooled: int) -> str:
    """', as FLUX.1's text encoders give': the published family whose widths these are ('' when none)."""
    for pipeline in families.PIPELINES.values():
        if pipeline.embeddings is None:
            continue
        family = families.family_of(pipeline)
        config = read_json(config_dir(family.configs[0].folder) / family.denoiser / "config.json", {})
        if config and pipeline.embeddings.widths(config) == (width, pooled):
            return f", as {pipeline.name}'s text encoders give"
    return ""
