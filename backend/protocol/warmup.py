"""A Compile node's plan as the link carries it: the warm-up sizes ('WIDTHxHEIGHT[xFRAMESf][xBATCH][@RATEfps]',
controller/compile_plan.py parses them), the target and backend. Both processes read it (re-exported by spec)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

DEFAULT_FRAME_RATE = 24.0  # Sample Video's frame_rate default, and the warm-up's where the shape names none


class WarmupSize(NamedTuple):
    """One warm-up shape of a Compile node, 'WIDTHxHEIGHT[xFRAMESf][xBATCH][@RATEfps]'."""

    width: int
    height: int
    batch: int = 1
    frames: int = 0  # a video's frames; 0: an image
    # a video's frames per second, for the models that take one (Pipeline.frame_rate_arg: LTX-2, whose sound has
    # frames / frame_rate seconds of latents, a shape of its own); 0: none (the controller fills in
    # DEFAULT_FRAME_RATE for those models)
    frame_rate: float = 0.0

    def __reduce__(self) -> tuple:
        """Pickled as a plain tuple: under ComfyUI this module's name is the pack's folder path, which the worker
        cannot import (CompilePlan reads the tuple back as a WarmupSize)."""
        return tuple, (tuple(self),)

    def text(self) -> str:
        """'832x480x81fx2@25fps', as the Compile node's input writes it."""
        rate = f"@{self.frame_rate:g}fps" if self.frame_rate else ""
        return (f"{self.width}x{self.height}" + (f"x{self.frames}f" if self.frames else "")
                + (f"x{self.batch}" if self.batch != 1 else "") + rate)

    def label(self) -> str:
        """'832x480x81 frames at 25 fps (batch 1)', as the warm-up says it."""
        frames = f"x{self.frames} frames" if self.frames else ""
        rate = f" at {self.frame_rate:g} fps" if self.frame_rate else ""
        return f"{self.width}x{self.height}{frames}{rate} (batch {self.batch})"


@dataclass(frozen=True)
class CompilePlan:
    """How the denoiser (transformer or UNet) is compiled, and which shapes to compile up front."""

    target: str = "whole denoiser"
    backend: str = "auto"
    # compiled before the first prompt (plain tuples of 4 or 5, as older plans and the link hold them, are read as
    # WarmupSize)
    warmup: tuple[WarmupSize, ...] = ()
    snap_to_warmup: bool = False  # round a requested size to the nearest warmed-up one
    notes: tuple[str, ...] = ()  # how the controller adjusted the plan for this device, said when it applies
    # the warm-up sizes whose video VAE decodes in tiles, as a Sample of that size does (the controller's pixel
    # budget: controller.pixels.video_tiling), so that a warm-up decodes the way the run will
    tiled_vae: tuple[WarmupSize, ...] = ()

    def __post_init__(self) -> None:
        for name in ("warmup", "tiled_vae"):
            object.__setattr__(self, name, tuple(WarmupSize(*s) for s in getattr(self, name)))

    def warmup_text(self) -> str:
        """'1024x1024, 832x1216x2, 832x480x81f@25fps': the warm-up sizes as the Compile node's input writes them."""
        return ", ".join(size.text() for size in self.warmup)
