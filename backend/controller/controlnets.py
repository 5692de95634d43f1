"""ControlNets on a pipeline description (Apply ControlNet): each one recognised from its diffusers folder (its
config.json) or its single file (the tensors' names and shapes in its header: no weight is read), checked against
the pipeline it is added to, and added after the ones it has. The worker loads it and runs the family's ControlNet
pipeline (worker/controlnets.py).

Single files are read in diffusers' layout, the one FLUX.1 (InstantX, Shakker-Labs), SD3.5, SDXL (diffusers,
xinsir), Qwen-Image (InstantX) and Z-Image (alibaba-pai) ControlNets are published in: their config is read from
the tensors' shapes (one Z-Image tensor's zeros tell 2.0 from 2.1, as diffusers tells them), what no tensor holds
from the pipeline's denoiser. ControlNetModel's original LDM layout (SD1.5, SDXL as first released) is not read
here, nor XLabs' FLUX.1 ControlNets (diffusers has no converter for them); each is refused naming what works.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..families import PIPELINES, ControlNets, family_of
from ..protocol.errors import ModelError
from ..protocol.spec import ControlNetRef, PipelineSpec, control_key, read_json
from .files import headers
from .images import checked_image

MAX_STRENGTH = 10.0  # ComfyUI's Apply ControlNet range


@dataclass(frozen=True)
class Found:
    """What a ControlNet folder or file is: its kind (the family's `ControlNets`), config and size in the compute
    dtype's bytes per float."""

    kind: ControlNets
    config: dict
    header: headers.Header | None  # a single file's header; None for a folder
    weights: tuple[Path, ...]


def _kinds() -> dict[str, tuple[ControlNets, str]]:
    """Every ControlNet class the families take: class name -> (kind, the family's name)."""
    return {k.model: (k, p.name) for p in PIPELINES.values() for k in p.controlnets}


def _family_names() -> str:
    return ", ".join(dict.fromkeys(p.name for p in PIPELINES.values() if p.controlnets))


def read(path: str, spec: PipelineSpec) -> Found:
    """The ControlNet at `path` (a diffusers folder or a single .safetensors file), recognised; raises ModelError
    naming the input, the file and the fix."""
    p = Path(path)
    name = p.name
    if p.is_dir():
        config = read_json(p / "config.json", {})
        kind = _kinds().get(config.get("_class_name", ""), (None, ""))[0]
        if kind is None:
            raise ModelError(f"controlnet_name: the folder '{name}' holds no ControlNet diffusers describes "
                             f"({_config_problem(p / 'config.json', config)}); a ControlNet folder has a config.json "
                             f"naming a ControlNet class of {_family_names()}.")
        weights = tuple(sorted(f for f in p.iterdir() if f.suffix == ".safetensors"))
        if not weights:
            pickles = sorted(f.name for f in p.iterdir() if f.suffix in (".bin", ".pt", ".pth", ".ckpt"))
            if pickles:
                raise ModelError(f"controlnet_name: the folder '{name}' holds pickle weights only ({', '.join(pickles)}), "
                                 "which are refused: they can run code when loaded. Download the .safetensors "
                                 "version.")
            raise ModelError(f"controlnet_name: the folder '{name}' holds no weights beside its config.json; download "
                             "the ControlNet's diffusion_pytorch_model.safetensors into it.")
        return Found(kind, config, None, weights)
    if not p.is_file():
        raise ModelError(f"controlnet_name: '{name}' was not found ({path}). Put the ControlNet in ComfyUI's "
                         "models/controlnet folder and pick it from the list (press R to refresh it).")
    if p.suffix != ".safetensors":
        raise ModelError(f"controlnet_name: '{name}' is not a .safetensors file; pickle files can run code when loaded "
                         "and are refused. Use the .safetensors version of this ControlNet.")
    header = headers.read_header(p, "controlnet_name")
    shapes = header.shapes
    own = PIPELINES[spec.class_name].controlnets
    kind = next((k for k in (*own, *(v[0] for v in _kinds().values())) if k.recognises(shapes)), None)
    if kind is None:
        raise ModelError(f"controlnet_name: '{name}' {_what_else(shapes)}")
    config = {}
    if kind in own:
        denoiser = spec.component_config(family_of(spec.family).denoiser)
        zeros = {"zeros": frozenset(k for k in kind.zero_keys if k in shapes and headers.all_zeros(p, k, "controlnet_name"))}
        config = kind.config(shapes, denoiser, **(zeros if kind.zero_keys else {}))
    return Found(kind, config, header, (p,))


def _config_problem(path: Path, config: dict) -> str:
    """What is wrong with a folder's config.json, for the message: missing, not JSON (where), or its class."""
    if not path.is_file():
        return "no config.json"
    if not config:
        try:
            json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            return f"its config.json cannot be read as JSON: {e}"
    return config.get("_class_name") or "its config.json names no _class_name"


def _what_else(shapes) -> str:
    """Why a file is not a ControlNet read here, and what works."""
    works = (f"ControlNets are read in diffusers' layout (how the {_family_names()} ControlNets are published, e.g. "
             "diffusion_pytorch_model.safetensors renamed, or their diffusers folder)")
    if any(k.startswith("double_blocks.") for k in shapes) and any(k.startswith("controlnet_blocks.") for k in shapes):
        return (f"is an XLabs FLUX.1 ControlNet, a layout diffusers has no converter for. {works}: for FLUX.1, e.g. "
                "InstantX's or Shakker-Labs' union ControlNet.")
    if any(k.startswith(("control_model.", "input_hint_block.")) for k in shapes):
        return (f"is a ControlNet in the original LDM layout (SD1.5, or SDXL as first released), which ComfyUI-TPU "
                f"does not read. {works}.")
    return f"holds no ControlNet ComfyUI-TPU recognises ({len(shapes)} tensors). {works}."


def add(spec: PipelineSpec, path: str, image: np.ndarray, strength: float = 1.0, start: float = 0.0,
        end: float = 1.0, mode: str = "none") -> tuple[PipelineSpec, str]:
    """`spec` with one more ControlNet and its control image, checked; and the ControlNets, for the node's text.
    Never reloads the model: the worker loads the ControlNet beside it."""
    found = read(str(Path(path).resolve()), spec)
    kind = found.kind
    modes = _modes(found)
    index = kind.modes.index(mode) if modes and mode in kind.modes[:modes] else -1
    ref = ControlNetRef(path=str(Path(path).resolve()), model=kind.model,
                        config="" if found.header is None else json.dumps(found.config), strength=strength,
                        start=start, end=end, mode=index, mode_name="" if mode == "none" else mode,
                        size_bytes=sum(f.stat().st_size for f in found.weights), image=checked_image(image))
    spec = spec.with_changes(controlnets=(*spec.controlnets, ref))
    check(spec, ref, found)
    return spec, describe(spec)


def describe(spec: PipelineSpec) -> str:
    lines = []
    for i, c in enumerate(spec.controlnets, 1):
        mode = f", union mode {c.mode_name}" if c.mode_name else ""
        h, w = c.image.shape[1:3] if c.image is not None else (0, 0)
        lines.append(f"{i}. {c.name}: strength {c.strength:g}, steps {c.start:g}-{c.end:g}{mode}; control image "
                     f"{w}x{h}, resized to the output size as ComfyUI does (centre crop, nearest)")
    return ("ControlNets (on every chip under Shard TP and on each Data Parallel replica; the image model stays "
            "loaded):\n" + "\n".join(lines))


def _modes(found: Found) -> int:
    """How many union modes the ControlNet has (0: not a union one)."""
    if not found.kind.modes:
        return 0
    if not found.kind.mode_key:
        return int(found.config.get("num_control_type", len(found.kind.modes)))
    return int(found.config.get(found.kind.mode_key) or 0)


def check(spec: PipelineSpec, ref: ControlNetRef, found: Found | None = None) -> None:
    """A ControlNet this pipeline can run with these settings; raises ModelError naming the input and the fix."""
    family = spec.family
    if not family.controlnets:
        raise ModelError(f"controlnet_name: {family.name} ('{spec.name}', {spec.class_name}) takes no ControlNet in "
                         f"diffusers; the pipelines that do: {_family_names()}.")
    found = found or read(ref.path, spec)
    kind = found.kind
    if kind not in family.controlnets:
        owner = _kinds()[kind.model][1]
        raise ModelError(f"controlnet_name: '{ref.name}' is a {owner} ControlNet ({kind.model}); this pipeline is "
                         f"{family.name} ('{spec.name}'). Pick a {family.name} ControlNet.")
    _check_fit(spec, ref, found)
    if {c.model for c in spec.controlnets} - {kind.model} and len(family.controlnets) > 1:
        raise ModelError(f"controlnet_name: '{ref.name}' is a {kind.model}, and diffusers runs {family.name}'s union "
                         "ControlNets and its other ControlNets in different pipelines; chain ControlNets of one kind.")
    if not kind.multi and len(spec.controlnets) > 1:
        raise ModelError(f"controlnet_name: '{ref.name}' is a second {family.name} ControlNet, and diffusers' "
                         f"{kind.text2img} runs one; remove one of the chained Apply ControlNet nodes.")
    if not (math.isfinite(ref.strength) and 0 <= ref.strength <= MAX_STRENGTH):
        raise ModelError(f"strength: {ref.strength} is not between 0 and {MAX_STRENGTH:g} ('{ref.name}'); 1 applies "
                         "the ControlNet as trained, 0 turns it off.")
    if not (0 <= ref.start < ref.end <= 1):
        raise ModelError(f"start_percent, end_percent: {ref.start:g} and {ref.end:g} ('{ref.name}') must satisfy "
                         "0 ≤ start < end ≤ 1 (the share of the steps the ControlNet acts on; 0 and 1: all of them).")
    if not kind.steps_window and (ref.start, ref.end) != (0, 1):
        raise ModelError(f"start_percent, end_percent: {ref.start:g} and {ref.end:g} ('{ref.name}'): diffusers' "
                         f"{family.name} ControlNet pipelines apply the ControlNet at every step; set 0 and 1.")
    modes = _modes(found)
    if modes and ref.mode < 0:
        named = f"'{ref.mode_name}' is not one of its modes" if ref.mode_name else "it is 'none'"
        raise ModelError(f"union_mode: '{ref.name}' is a union ControlNet and needs the kind of its control image; "
                         f"{named}. Choose one of: {', '.join(kind.modes[:modes])}.")
    if not modes and ref.mode_name:
        raise ModelError(f"union_mode: '{ref.name}' is not a union ControlNet with modes{kind.no_modes}, so it has "
                         f"no mode '{ref.mode_name}'; set union_mode to none.")
    if spec.offload == "sequential":
        raise ModelError(f"controlnet_name: '{ref.name}' cannot run with offload 'sequential' (offload 'auto' picks it "
                         "for a model too big for the chip); choose offload 'model' or 'none', or Shard TP.")
    if spec.cp_degree > 1:
        raise ModelError(f"controlnet_name: '{ref.name}' cannot run under Context Parallel: the ControlNet's residuals "
                         "cover the whole image while each rank holds a slice of it. Remove Context Parallel (Shard "
                         "TP or Data Parallel work with ControlNets).")
    if spec.step_cache != "off":
        raise ModelError(f"step_cache: '{spec.step_cache}' is not used with ControlNets ('{ref.name}'): the cache "
                         "would reuse steps the ControlNet changes. Set step_cache to off in Sampling Options.")


# Config sizes a ControlNet shares with the denoiser it steers (FLUX.1, SD3, Qwen-Image: the text and pooled widths
# and the rotary axes; SDXL: cross attention and the added embeddings; Z-Image: the heads): any that differ fail
# at the first step with torch's shape error. The input channels are compared beside them (a UNet's latent
# channels: an inpainting UNet takes more, its ControlNet the latent's).
SHARED = ("joint_attention_dim", "pooled_projection_dim", "axes_dims_rope", "patch_size", "cross_attention_dim",
          "projection_class_embeddings_input_dim", "addition_time_embed_dim", "n_heads", "n_kv_heads",
          "all_patch_size", "all_f_patch_size")


def _plain(value: object) -> object:
    """A config value compared as JSON gives it (tuples and lists alike)."""
    return list(value) if isinstance(value, (list, tuple)) else value


def _check_fit(spec: PipelineSpec, ref: ControlNetRef, found: Found) -> None:
    """The ControlNet's residuals must have the shapes of the denoiser's hidden states."""
    config = found.config
    den = spec.component_config(family_of(spec.family).denoiser)
    if "block_out_channels" in den:
        mine, theirs = list(config.get("block_out_channels", ())), list(den["block_out_channels"])
    elif "dim" in den:  # Z-Image
        mine, theirs = [config.get("dim", 0)], [den["dim"]]
    else:
        mine = [config.get("num_attention_heads", 0) * config.get("attention_head_dim", 0)]
        theirs = [den.get("num_attention_heads", 0) * den.get("attention_head_dim", 0)]
    if mine != theirs:
        raise ModelError(f"controlnet_name: '{ref.name}' is made for a model of width {mine}, and '{spec.name}' has "
                         f"width {theirs}: pick the ControlNet made for this model.")
    expected = {**{k: den[k] for k in SHARED if den.get(k) is not None},
                "in_channels": den.get("out_channels") if "block_out_channels" in den else den.get("in_channels")}
    differ = [f"{key} {config[key]} (the model's: {want})" for key, want in expected.items()
              if want is not None and config.get(key) is not None and _plain(config[key]) != _plain(want)]
    if differ:
        raise ModelError(f"controlnet_name: '{ref.name}' is made for another {spec.family.name} model: its "
                         f"{', '.join(differ)} differ from '{spec.name}', so the first step would fail on mismatched "
                         "shapes. Pick the ControlNet made for this model.")
    extra = config.get("extra_conditioning_channels") or config.get("extra_condition_channels") or 0
    if extra:
        raise ModelError(f"controlnet_name: '{ref.name}' is an inpainting ControlNet (it reads a mask beside the "
                         "image), which Apply ControlNet does not drive; use a ControlNet for canny, depth, pose, ... "
                         "(or Sample's image and mask to inpaint).")


def arrays(spec: PipelineSpec) -> dict[str, np.ndarray]:
    """The control images as the workers take them, by `control_key`."""
    return {control_key(i): c.image for i, c in enumerate(spec.controlnets)}


def check_inputs(spec: PipelineSpec, starts_from_image: bool, inpainting: bool, denoise: float = 1.0) -> None:
    """Sample's image and mask with ControlNets: only where diffusers has the ControlNet pipeline for it, and
    the ControlNet and denoise it takes."""
    if not spec.controlnets or not starts_from_image:
        return
    kind = next(k for k in spec.family.controlnets if k.model == spec.controlnets[0].model)
    if (kind.inpaint if inpainting else kind.img2img) is None:
        what = "inpainting" if inpainting else "image to image"
        raise ModelError(f"image: diffusers has no {what} pipeline for {spec.family.name} with a ControlNet "
                         f"({kind.model}); disconnect Sample's image{' and mask' if inpainting else ''}, or the "
                         "ControlNet.")
    if not inpainting:
        return
    ref = spec.controlnets[0]
    why = kind.cannot_inpaint(json.loads(ref.config) if ref.config else read(ref.path, spec).config,
                              spec.component_config(family_of(spec.family).denoiser)) if kind.cannot_inpaint else ""
    if why:
        raise ModelError(f"mask: '{ref.name}' cannot inpaint: {why}. Disconnect Sample's mask, or pick such a "
                         "ControlNet.")
    if kind.inpaint_from_noise and denoise < 1:
        raise ModelError(f"denoise: {denoise:g} with a mask and '{ref.name}': diffusers' {kind.inpaint} makes the "
                         "whole image from noise (the ControlNet reads the image outside the mask and the mask), so "
                         "only denoise 1 works; set denoise to 1.")


def weight_bytes(spec: PipelineSpec, float_bytes: int) -> dict[str, int]:
    """What the ControlNets take once loaded (offload 'auto'), from their headers: {"controlnet": bytes}."""
    total = 0
    for ref in spec.controlnets:
        path = Path(ref.path)
        files = sorted(f for f in path.iterdir() if f.suffix == ".safetensors") if path.is_dir() else [path]
        try:
            total += sum(headers.read_header(f, "controlnet_name").loaded_bytes(float_bytes) for f in files)
        except ModelError:
            total += ref.size_bytes
    return {"controlnet": total} if total else {}
