"""Sample's LATENT input, checked and described before any worker sees it (controller side).

ComfyUI's LATENT holds what the VAE encodes to and decodes from, unscaled ("samples" [B, C, h, w]; Qwen-Image's
Wan VAE adds a frame axis, [B, C, 1, h, w]; FLUX.2's packs 2×2 latent pixels into 128 channels): KSampler
hands it back in that space and VAE Decode decodes it as it is. So the pack's LATENT is exactly what its
diffusers pipeline hands its VAE to decode (worker/latents.py), and a LATENT coming in is handed to the
pipeline as if its VAE had encoded it. The latent sets the size (latent size × the VAE's downscale) and the batch.
An empty latent (all zeros) of another channel count is taken as this model's, as KSampler does
(comfy.sample.fix_empty_latent_channels), so Empty Latent Image works with every model.
Numpy only: no torch in ComfyUI's process.
"""

from __future__ import annotations

import sys

import numpy as np

from .. import families
from ..protocol.errors import ModelError
from ..protocol.spec import PipelineSpec, SampleRequest
from . import models, pixels

# The empty-latent node of each channel count (ComfyUI's class name, its display name); Empty Flux 2 Latent only
# since ComfyUI 0.3.6x: named only where the running ComfyUI has it.
EMPTY = {4: ("EmptyLatentImage", "Empty Latent Image"), 16: ("EmptySD3LatentImage", "EmptySD3LatentImage"),
         128: ("EmptyFlux2LatentImage", "Empty Flux 2 Latent")}
MAX_BATCH = 64  # Sample's batch_size maximum: a latent's batch counts against it


def comfy_has(node: str) -> bool:
    """Whether the running ComfyUI has the node class `node` (its nodes module's NODE_CLASS_MAPPINGS, which holds
    the extension nodes once they are loaded); True outside ComfyUI, where it cannot be told."""
    mapping = getattr(sys.modules.get("nodes"), "NODE_CLASS_MAPPINGS", None)
    return not isinstance(mapping, dict) or "KSampler" not in mapping or node in mapping


def channels(spec: PipelineSpec) -> int:
    """The channels of this model's LATENT: the VAE's latent channels (× the packing, FLUX.2)."""
    vae = spec.component_config("vae")
    return int(vae.get("latent_channels") or vae.get("z_dim") or 16) * spec.family.latent_patch ** 2


def scale(spec: PipelineSpec) -> int:
    """Image pixels per LATENT pixel: the VAE's downscale (× the packing, FLUX.2)."""
    return models.vae_scale(spec.component_config("vae")) * spec.family.latent_patch


def frame_axis(spec: PipelineSpec) -> bool:
    """Whether its VAE takes a frame axis (Qwen-Image's Wan VAE: [B, C, 1, h, w])."""
    return "z_dim" in spec.component_config("vae")


def as_array(spec: PipelineSpec, samples: np.ndarray, noise_mask: bool = False, name: str = "latent") -> np.ndarray:
    """A LATENT's samples as the worker takes them (float32; a frame axis added where the VAE takes one), checked
    against the model; raises ModelError naming the input (`name`: Sample's `latent`, VAE Decode's `samples`),
    the value and the fix."""
    family = spec.family
    if family.frame_step:
        raise ModelError(f"{name}: {family.name} makes videos; the pack's LATENT is for image models (Sample, VAE "
                         "Decode (TPU)). Disconnect it.")
    if noise_mask:
        raise ModelError(f"{name}: it carries a noise mask (Set Latent Noise Mask), which Sample does not read; for "
                         "inpainting connect the image and its mask to Sample's image and mask inputs instead.")
    a = np.asarray(samples)
    want = channels(spec)
    if a.ndim == 5 and frame_axis(spec) and a.shape[2] == 1:
        a = a[:, :, 0]
    if a.ndim != 4 or a.shape[0] < 1 or min(a.shape[2:]) < 1:
        raise ModelError(f"{name}: a LATENT of shape {list(a.shape)} cannot be used; Sample takes an image latent "
                         f"[batch, {want}, height/{scale(spec)}, width/{scale(spec)}] (Empty Latent Image, "
                         "EmptySD3LatentImage, VAE Encode or another Sample's LATENT).")
    if name == "latent" and a.shape[0] > MAX_BATCH:  # before anything is copied
        raise ModelError(f"latent: a batch of {a.shape[0]} latents; Sample makes at most {MAX_BATCH} images per run "
                         "(batch_size's maximum), and the latent's batch sets it. Use a smaller batch in the empty "
                         "latent, or take part of it (Latent From Batch).")
    if a.shape[1] != want and not a.any():  # an empty latent made for another model: KSampler takes its size too
        a = np.zeros((a.shape[0], want, *a.shape[2:]), np.float32)
    if a.shape[1] != want:
        node, empty = EMPTY.get(want, ("", None))
        empty = empty if empty and comfy_has(node) else None
        raise ModelError(f"{name}: it has {a.shape[1]} channels, but {family.name} ('{spec.name}') works on "
                         f"{want}-channel latents: it was made for another model. Connect "
                         + (f"{empty}, " if empty else "") + "VAE Encode with this model's VAE, or a LATENT of a "
                         "Sample with this model.")
    a = np.ascontiguousarray(a, dtype=np.float32)
    if not np.isfinite(a).all():
        raise ModelError(f"{name}: the latent holds values that are not numbers (NaN or infinity); check the nodes "
                         "that made it.")
    return a[:, :, None] if frame_axis(spec) else a


def decode_input(spec: PipelineSpec, samples: np.ndarray) -> np.ndarray:
    """VAE Decode (TPU)'s `samples` as the worker takes them, checked first from its shape against the pixel
    budget of one image (the worker decodes a batch image by image, as Sample does), before anything is copied:
    a 16384² empty latent is refused at once instead of decoding for minutes."""
    shape = np.shape(samples)
    if len(shape) in (4, 5) and min(shape[-2:]) >= 1:
        s = scale(spec)
        width, height = shape[-1] * s, shape[-2] * s
        pixels.check(spec, width, height, name="samples",
                     fix="Decode a smaller latent (a smaller empty latent, or Upscale Latent By below 1), or decode "
                         "this one in tiles with ComfyUI's VAE Decode (Tiled) and this model's VAE file")
        pixels.check_output(spec, width, height, shape[0], name="samples (its batch)")
    return as_array(spec, samples, name="samples")


def size(spec: PipelineSpec, latent: np.ndarray) -> tuple[int, int, int]:
    """(width, height, batch) a LATENT sets, checked against the model's size multiple."""
    h, w = latent.shape[-2:]
    s = scale(spec)
    width, height = w * s, h * s
    f = spec.size_factor or s
    if width % f or height % f:
        step = f // s
        raise ModelError(f"latent: it is {w}x{h} latent pixels ({width}x{height} pixels); {spec.family.name} needs "
                         f"multiples of {f} pixels, so a latent side must be a multiple of {step}. Make it "
                         f"{max(step, w // step * step)}x{max(step, h // step * step)} (another scale in Upscale "
                         "Latent By, or another size in the empty latent).")
    return width, height, latent.shape[0]


def check(spec: PipelineSpec, req: SampleRequest, image_connected: bool) -> None:
    """What a latent input cannot be combined with, refused before anything runs."""
    family = spec.family
    if image_connected:
        raise ModelError("latent: both an image and a latent are connected; Sample starts from one of them. "
                         "Disconnect one (VAE Encode turns an image into a latent).")
    if req.denoise == 0:
        raise ModelError("denoise: 0 with a latent changes nothing; connect the latent to VAE Decode (TPU) or VAE "
                         "Decode instead, or raise denoise.")
    if req.denoise < 1 and spec.controlnets:
        raise ModelError(f"denoise: with a ControlNet a latent sets only the size and the batch, so denoise must be 1 "
                         f"(it is {req.denoise:g}); to start from a picture with a ControlNet, connect it to Sample's "
                         "image input instead (VAE Decode turns the latent into one).")
    plan = spec.compile_plan()
    warm = sorted({(w, h) for w, h, *_ in plan.warmup}) if plan is not None and plan.snap_to_warmup else []
    if req.denoise < 1 and warm and (req.width, req.height) not in warm:
        raise ModelError(f"latent: it is {req.width}x{req.height}, not one of the warm-up sizes Compile snaps to "
                         f"({', '.join(f'{w}x{h}' for w, h in warm)}), and a latent below denoise 1 cannot be "
                         "snapped; make it one of them (Upscale Latent By), or turn Compile's snap_to_warmup off.")
    if req.denoise < 1 and family.img2img is None:
        raise ModelError(f"denoise: {family.name} ('{spec.name}') has no image-to-image pipeline in diffusers, so it "
                         f"cannot start from a latent; set denoise to 1 (it is {req.denoise:g}): the latent then "
                         "sets only the size and the batch. Starting from a latent below denoise 1 works with "
                         f"{families.pipeline_names(lambda p: p.img2img is not None)}.")


def describe(spec: PipelineSpec, req: SampleRequest, latent: np.ndarray, asked: tuple[int, int, int]) -> list[str]:
    """What happens to the latent, for the text next to Sample. `asked`: the node's width, height, batch_size."""
    notes = []
    if req.denoise >= 1:
        notes.append(f"latent {req.width}x{req.height} (batch {len(latent)}), denoise 1: text to image at its size; "
                     "its values are not used (KSampler starts flow models from pure noise at denoise 1 too)")
    else:
        notes.append(f"starts from the latent ({req.width}x{req.height}, batch {len(latent)}), denoise "
                     f"{req.denoise:g}: {req.steps} steps of a {int(req.steps / req.denoise)}-step schedule")
    if asked != (req.width, req.height, req.batch_size):
        notes.append(f"width, height and batch_size ({asked[0]}x{asked[1]}, {asked[2]}) follow the latent")
    return notes


def latent_input(spec: PipelineSpec, samples: np.ndarray, noise_mask: bool = False) -> tuple[np.ndarray, int, int, int]:
    """A LATENT's samples (numpy) checked against the model, as the workers take them; and the width, height and
    batch it sets (raising an InputError naming the input)."""
    latent = as_array(spec, samples, noise_mask)
    return (latent, *size(spec, latent))
