"""The pixel budget: how large an image one pipeline call may make on this host, checked before any worker
starts on it (a size the memory cannot hold would otherwise run for minutes, or until it runs out of memory);
and, from the same memory, whether a video's VAE decodes in tiles.

The rule: the memory one worker has (TPU: HBM per device; CUDA: the GPU's memory; CPU: COMFYUI_TPU_WORKER_MEMORY_LIMIT_GB
when set, else the host's memory shared by its CPU workers) over VAE_VALUES_PER_PIXEL values of the pipeline's
dtype. COMFYUI_TPU_MAX_MEGAPIXELS replaces it. Controller side: reads no weights.
"""

from __future__ import annotations

import math
import os

from ..protocol import settings
from ..protocol.errors import DeviceError, ModelError
from ..protocol.spec import PipelineSpec
from ..protocol.units import format_bytes
from . import devices
from .offload import _FLOAT_BYTES

# A real VAE decoder (FLUX.1, FLUX.2, SD3, SDXL: blocks of 512, 512, 256, 128 channels) holds, at the image's
# full size, its last upsampler's 256-channel input and output and its last block's 128 channels: about 640
# values per pixel at once. Weights and the denoiser's activations come on top; the budget is an upper bound.
VAE_VALUES_PER_PIXEL = 640
# Wan's video VAE (AutoencoderKLWan) decodes one latent frame (4 frames) at a time through causal 3D convolutions,
# each keeping 2 frames of its input for the next: measured about 4,770 float32 values per frame pixel at its peak
# (the published Wan 2.1 config with random weights on the CPU, 128² → 256², 5 frames: 649 → 1,543 MB), however
# many frames the video has. diffusers' tiled decoding (enable_tiling: 256×256 tiles every 192 pixels, blended
# over the 64-pixel overlap) bounds that peak to one tile's.
VIDEO_VAE_VALUES_PER_PIXEL = 4800
# The finished images on their way to ComfyUI, in float32 (12 bytes per RGB pixel), are held about 4 times at
# once: the worker's outputs and their concatenation, the hand-over in /dev/shm, and ComfyUI's IMAGE (issue 34:
# 16 × 1024², 201 MB of pixels, took the worker +560 MB and ComfyUI +230 MB).
OUTPUT_COPIES = 4
VIDEO_TILE = 256  # diffusers' tile_sample_min_height / _width for AutoencoderKLWan: smaller frames are never tiled


def budget(spec: PipelineSpec) -> tuple[int, str] | None:
    """The most pixels one pipeline call (one image, or a batched Sample's batch) may make on this host, and
    where that figure comes from; None where the device's memory is unknown."""
    if settings.MAX_MEGAPIXELS.is_set():
        value = settings.MAX_MEGAPIXELS.raw()
        try:
            mp = float(value)
        except ValueError:
            mp = math.nan
        if not (math.isfinite(mp) and mp > 0):
            raise DeviceError(f"{settings.MAX_MEGAPIXELS.name}: {value!r} is not a number of megapixels; set one "
                              "such as 16, or unset it to use the host's memory.")
        return int(mp * 1e6), f"{settings.MAX_MEGAPIXELS.name}={value}"
    kind = spec.kind or "cpu"
    dtype = spec.dtype if spec.dtype in _FLOAT_BYTES else ("float32" if kind == "cpu" else "bfloat16")
    if kind == "cpu":
        cap = settings.WORKER_MEMORY_LIMIT_GB.number()
        if cap is not None and cap > 0:
            memory = int(cap * 2**30)
            where = f"a cpu worker is capped at {cap:g} GiB ({settings.WORKER_MEMORY_LIMIT_GB.name})"
        else:
            workers = max(1, spec.world_size)
            memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // workers
            where = (f"this host has {format_bytes(memory * workers)} of memory"
                     + (f" for {workers} cpu workers" if workers > 1 else ""))
    else:
        memory = devices.device_memory_bytes(kind)
        if memory is None:
            return None
        where = f"a {kind} device has {format_bytes(memory)}"
    per_pixel = VAE_VALUES_PER_PIXEL * _FLOAT_BYTES[dtype]
    return memory // per_pixel, (f"{where}, and decoding an image takes about {per_pixel / 1024:.1f} KiB per pixel "
                                 f"in {dtype}")


def video_tiling(spec: PipelineSpec, width: int, height: int) -> str | None:
    """A video pipeline's VAE decodes in tiles when its untiled peak (VIDEO_VAE_VALUES_PER_PIXEL per frame pixel)
    is over the pixel budget's memory: the note that says so, else None. Images and frames of at most one tile
    are never tiled."""
    if not spec.family.frame_step or max(width, height) <= VIDEO_TILE or (found := budget(spec)) is None:
        return None
    most, why = found
    untiled = most * VAE_VALUES_PER_PIXEL // VIDEO_VAE_VALUES_PER_PIXEL
    if width * height <= untiled:
        return None
    return (f"VAE: decoding in {VIDEO_TILE}×{VIDEO_TILE} tiles (blended at the seams), because decoding {width}x{height} "
            f"frames whole takes about {VIDEO_VAE_VALUES_PER_PIXEL / VAE_VALUES_PER_PIXEL:.1f}× an image's memory per "
            f"pixel, more than the pixel budget allows ({untiled / 1e6:.2f} megapixels per frame untiled: {why})")


def check(spec: PipelineSpec, width: int, height: int, batch: int = 1, name: str = "width/height",
          fix: str = "Use a smaller width and height") -> None:
    """Refuses a size beyond the budget before any worker starts on it, naming the input (`name`), the size, the
    budget, its source and the fix (`fix`: what the input can be instead)."""
    found = budget(spec)
    if found is None:
        return
    most, why = found
    calls = batch if spec.batched else 1
    pixels = width * height * calls
    if pixels <= most:
        return
    side = int(math.sqrt(most)) // spec.size_factor * spec.size_factor if spec.size_factor else int(math.sqrt(most))
    what = f"{width}x{height}" + (f" × batch {calls} (batched)" if calls > 1 else "")
    raise ModelError(f"{name}: {what} is {pixels / 1e6:.1f} megapixels in one pipeline call, more than this "
                     f"host can make: at most {most / 1e6:.1f} megapixels (e.g. {side}x{side}), because {why}. {fix}"
                     f"{', or turn batched off' if calls > 1 else ''}; an operator sure of the memory can set "
                     f"{settings.MAX_MEGAPIXELS.name}.")


def check_output(spec: PipelineSpec, width: int, height: int, images: int, frames: int = 0,
                 name: str = "batch_size") -> None:
    """Refuses a whole prompt's output (every image, every video's frames, as float32 pixels held OUTPUT_COPIES
    times by the worker and ComfyUI) beyond the host's free memory, before any worker starts: the run would
    otherwise end in the OOM killer. `name`: the input that sets the count (batch_size, a latent's batch)."""
    total, free = devices.host_memory()
    per = width * height * 3 * 4 * max(1, frames)
    need = per * images * OUTPUT_COPIES
    if need <= free:
        return
    fits = max(0, free // (per * OUTPUT_COPIES))
    noun = ("video" if frames else "image") + ("s" if images != 1 else "")
    what = f"{images} {noun} of {width}x{height}" + (f" × {frames} frames" if frames else "")
    inputs = f"{name}, frames, width/height" if frames else f"{name}, width/height"
    raise ModelError(f"{inputs}: {what} {'are' if images != 1 or frames else 'is'} {format_bytes(per * images)} of float32 pixels, which the worker and "
                     f"ComfyUI hold about {OUTPUT_COPIES} times on their way out ({format_bytes(need)}), more than this "
                     f"host's {format_bytes(free)} of free memory (of {format_bytes(total)}): at most {fits} at this "
                     f"size{' and length' if frames else ''}. Make fewer {'videos' if frames else 'images'}"
                     f"{', fewer frames' if frames else ''} or a smaller size, or split the run over several prompts.")
