"""What a weights file holds, from its header alone: a denoiser of one family, a VAE, text encoders.

The keys that tell them apart live with each family (backend/families); this module walks the key
prefixes the files use (checkpoints nest their parts) and asks the registry.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ... import families
from ...families import image_encoders, text_encoders, vaes
from .headers import Header, read_header

DENOISER_PREFIXES = ("model.diffusion_model.", "diffusion_model.", "")
VAE_PREFIXES = ("first_stage_model.", "vae.", "", "audio_vae.")  # the last: LTX-2.5's audio VAE file
USED_TEXT_KINDS = ("clip", *text_encoders.KINDS)  # the text encoders a family reads ("clip": CLIP-L or -G)


@dataclass(frozen=True)
class Part:
    """One model inside a file: a denoiser, a VAE, a text encoder or a CLIP vision encoder."""

    role: str  # "diffusion_model" | "vae" | "text_encoder" | "clip_vision"
    kind: str  # denoiser: family id; vae: vaes.KINDS key; text encoder: text_encoders.recognise's kinds;
    # clip_vision: "clip-vision" (a CLIP ViT) or "siglip"
    prefix: str
    shapes: dict[str, tuple[int, ...]] = field(repr=False)

    @property
    def width(self) -> int:
        """A text or CLIP vision encoder's hidden size; a VAE's latent channels; a denoiser's input channels."""
        if self.role == "clip_vision":
            return image_encoders.width(self.shapes)
        if self.role == "text_encoder":
            return text_encoders.width(self.shapes)
        if self.role == "vae":
            return vaes.width(self.kind, self.shapes)
        return self.shapes[families.FAMILIES[self.kind].width_key][1]

    @property
    def family(self) -> families.ModelFamily:
        return families.FAMILIES[self.kind]


@dataclass(frozen=True)
class Contents:
    """Everything a file holds that the pack could use."""

    header: Header
    denoiser: Part | None = None
    vae: Part | None = None
    text_encoders: tuple[Part, ...] = ()
    image_encoder: Part | None = None

    def fits(self, role: str) -> bool:
        if role in ("checkpoint", "diffusion_model"):
            return self.denoiser is not None
        if role == "vae":
            return self.vae is not None
        if role == "clip_vision":  # Wan's CLIP ViT; a SigLIP (Redux's) is for Apply Redux (TPU) only
            return self.image_encoder is not None and self.image_encoder.kind == "clip-vision"
        return any(p.kind in USED_TEXT_KINDS for p in self.text_encoders) and self.denoiser is None

    def describe(self) -> str:
        """'it holds a FLUX.1 diffusion model': what the file is, for messages."""
        if self.denoiser is not None:
            return f"it holds a {self.denoiser.family.name} diffusion model"
        if self.vae is not None:
            return f"it is a VAE with {self.vae.width} latent channels"
        if self.text_encoders:
            p = self.text_encoders[0]
            return f"it is a {short_name(p.kind)} text encoder ({p.width} wide)"
        if self.image_encoder is not None and self.image_encoder.kind == "siglip":
            return (f"it is a SigLIP vision encoder ({self.image_encoder.width} wide), which FLUX.1 Redux reads: "
                    "choose it in Apply Redux (TPU)")
        if self.image_encoder is not None:
            return f"it is a CLIP vision encoder ({self.image_encoder.width} wide)"
        if any(k.startswith(("input_blocks.", "model.diffusion_model.input_blocks.")) for k in self.header.shapes):
            return "it looks like an SD1.x/SD2.x model, which is not supported"
        return "its tensors are not a model ComfyUI-TPU knows"


def short_name(kind: str) -> str:
    """'T5-XXL': a text encoder kind as messages name it."""
    return text_encoders.KINDS[kind].short if kind in text_encoders.KINDS else kind


def _under(shapes: Mapping[str, tuple], prefix: str) -> dict[str, tuple[int, ...]]:
    return {k[len(prefix):]: v for k, v in shapes.items() if k.startswith(prefix)}


def _denoiser(header: Header) -> Part | None:
    for prefix in DENOISER_PREFIXES:
        s = header.strip(prefix)
        family = families.recognise(s)
        if family is not None:
            return Part("diffusion_model", family.id, prefix, s)
    return None


def _vae(header: Header) -> Part | None:
    for prefix in VAE_PREFIXES:
        s = header.strip(prefix)
        kind = vaes.recognise(s)
        if kind is not None:
            return Part("vae", kind, prefix, s)
    return None


def contents(header: Header) -> Contents:
    denoiser = _denoiser(header)
    vae = _vae(header)
    texts: list[Part] = []
    if denoiser is not None or vae is not None:  # a checkpoint: text encoders under known prefixes
        for prefix, kind in text_encoders.CHECKPOINT_PREFIXES.items():
            s = _under(header.logical, prefix)
            if text_encoders.recognise(s) is not None:
                texts.append(Part("text_encoder", kind, prefix, s))
    else:
        shapes = header.logical
        kind = text_encoders.recognise(shapes)
        if kind is not None:
            texts.append(Part("text_encoder", kind, "", dict(shapes)))
        elif image_encoders.recognise(shapes):
            kind = "siglip" if image_encoders.is_siglip(shapes) else "clip-vision"
            return Contents(header, image_encoder=Part("clip_vision", kind, "", dict(shapes)))
    return Contents(header, denoiser, vae, tuple(texts))


def file_contents(path: Path, role: str) -> Contents:
    return contents(read_header(path, role))
