"""The pixel budget: how large an image one pipeline call may make on this host, checked before any worker
starts on it (a size the memory cannot hold would otherwise run for minutes, or until it runs out of memory);
and, from the same memory, whether a video's VAE decodes in tiles.

The rule: the memory free for one worker's decode (TPU: HBM per device, CUDA: the GPU's memory, less the weights
each device keeps; CPU: COMFYUI_TPU_WORKER_MEMORY_LIMIT_GB when set, else the host's free memory shared by its
CPU workers) over the decode's measured peak per pixel for the pipeline's VAE (families/vaes.py DECODE_BYTES,
float32; half in bfloat16 and float16). COMFYUI_TPU_MAX_MEGAPIXELS replaces it. Controller side: reads no weights
(the weights' size comes from the safetensors headers).
"""

from __future__ import annotations

import math
from pathlib import Path

from ..families import vaes
from ..protocol import settings
from ..protocol.errors import DeviceError, ModelError
from ..protocol.spec import PipelineSpec
from ..protocol.units import format_bytes
from . import devices
from .offload import _FLOAT_BYTES

# The finished images on their way to ComfyUI, in float32 (12 bytes per RGB pixel), are held about 4 times at
# once: the worker's outputs and their concatenation, the hand-over in /dev/shm, and ComfyUI's IMAGE (issue 34:
# 16 × 1024², 201 MB of pixels, took the worker +560 MB and ComfyUI +230 MB).
OUTPUT_COPIES = 4


def _dtype(spec: PipelineSpec) -> str:
    kind = spec.kind or "cpu"
    return spec.dtype if spec.dtype in _FLOAT_BYTES else ("float32" if kind == "cpu" else "bfloat16")


def _device_weights(spec: PipelineSpec, float_bytes: int) -> int:
    """Bytes of weights each device keeps while it decodes, from the files' sizes on disk (no header is read:
    offload auto has read them once already), taken as 16-bit and scaled to `float_bytes`: all of them (split by
    Shard TP), none under sequential offload; under model offload, the largest file."""
    if spec.offload == "sequential":
        return 0
    if spec.source is not None:
        sizes = [c.size_bytes for c in spec.source.components if not c.name.startswith("tokenizer")]
    else:
        root = Path(spec.model_path)
        sizes = [f.stat().st_size for f in root.glob("*/*.safetensors")] if root.is_dir() else []
    sizes += [c.size_bytes for c in spec.controlnets]
    sizes = [n * float_bytes // 2 for n in sizes if n]
    if not sizes:
        return 0
    return max(sizes) if spec.offload == "model" else sum(sizes) // max(1, spec.tp_degree)


def memory(spec: PipelineSpec) -> tuple[int, str] | None:
    """The memory one worker's decode has on this host, and where that figure comes from; None where the
    device's memory is unknown."""
    kind = spec.kind or "cpu"
    if kind == "cpu":
        cap = settings.WORKER_MEMORY_LIMIT_GB.number()
        if cap is not None and cap > 0:
            return int(cap * 2**30), f"a cpu worker is capped at {cap:g} GiB ({settings.WORKER_MEMORY_LIMIT_GB.name})"
        workers = max(1, spec.world_size)
        total, free = devices.host_memory()
        return free // workers, (f"this host has {format_bytes(free)} of memory free (of {format_bytes(total)})"
                                 + (f" for {workers} cpu workers" if workers > 1 else ""))
    total = devices.device_memory_bytes(kind)
    if total is None:
        return None
    weights = _device_weights(spec, _FLOAT_BYTES[_dtype(spec)])
    kept = f", of which the weights keep {format_bytes(weights)}" if weights else ""
    return max(0, total - weights), f"a {kind} device has {format_bytes(total)}{kept}"


def per_pixel(spec: PipelineSpec, video: bool = False, frames: int = 1, tiled: bool = False) -> int:
    """Bytes one output pixel takes at the decode's peak, in the pipeline's dtype (a video's of `frames`: per frame
    pixel; `tiled`: of one tile's frames, vaes.decode_bytes)."""
    return vaes.decode_bytes(spec.component_config("vae"), video, frames, tiled) * _FLOAT_BYTES[_dtype(spec)] // 4


def sound_bytes(spec: PipelineSpec, frames: int, frame_rate: float) -> int:
    """The peak of one video's sound decode (it lasts as long as the video: frames / frame_rate seconds, MiniMax
    H3's at its fixed rate), in the pipeline's dtype; 0 for a model without sound."""
    if not spec.family.sound or frames <= 0:
        return 0
    fps = spec.family.modular.fps if spec.family.modular is not None and spec.family.modular.fps else frame_rate
    seconds = frames / fps if fps > 0 else 0.0
    each = vaes.sound_decode_bytes(spec.component_config(spec.family.sound[-1]))
    return int(seconds * each) * _FLOAT_BYTES[_dtype(spec)] // 4


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
    found = memory(spec)
    if found is None:
        return None
    have, where = found
    each = per_pixel(spec)
    return have // each, f"{where}, and decoding an image takes about {each / 1024:.1f} KiB per pixel in {_dtype(spec)}"


def video_tiling(spec: PipelineSpec, width: int, height: int, frames: int = 1) -> str | None:
    """A video pipeline's VAE decodes in tiles when its untiled peak (the video decode's bytes per frame pixel, for
    `frames` where the VAE decodes them all at once: LTX-2's) is over the pixel budget's memory: the note that says
    so, else None. Frames of at most one tile (vaes.video_tile; and of at most one tile's frames where the VAE
    decodes frame-wise: vaes.frame_tile) are never tiled."""
    if not spec.family.frame_step:
        return None
    config = spec.component_config("vae")
    side, clip = vaes.video_tile(config), vaes.frame_tile(config)
    spatial, framewise = max(width, height) > side, clip is not None and frames > clip
    if not (spatial or framewise) or (found := budget(spec)) is None:
        return None
    most, why = found
    ratio = per_pixel(spec, video=True, frames=frames) / per_pixel(spec)
    untiled = int(most / ratio)
    if width * height <= untiled:
        return None
    tiles = " ".join(([f"{side}×{side}"] if spatial else []) + ["tiles"] + ([f"of {clip} frames"] if framewise else []))
    tiled = (f"; tiled, about {per_pixel(spec, video=True, frames=frames, tiled=True) / per_pixel(spec):.1f}×"
             if framewise else "")
    return (f"VAE: decoding in {tiles} (blended at the seams), because decoding {width}x{height} "
            f"frames whole takes about {ratio:.1f}× an image's memory per pixel{tiled}, more than the pixel budget "
            f"allows ({untiled / 1e6:.2f} megapixels per frame untiled: {why})")


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
                 name: str = "batch_size", sound: int = 0, frame_rate: float = 24.0) -> None:
    """Refuses a whole prompt's output (every image, every video's frames and its `sound` bytes, as float32 held
    OUTPUT_COPIES times by the worker and ComfyUI) beyond the host's free memory, before any worker starts: the
    run would otherwise end in the OOM killer. A cpu worker decodes a video's sound on the host too, beside the
    frames it holds: one sound decode's peak is added (sound_bytes; at `frame_rate`). `name`: the input that sets
    the count (batch_size, a latent's batch)."""
    total, free = devices.host_memory()
    per = width * height * 3 * 4 * max(1, frames) + sound
    decode = sound_bytes(spec, frames, frame_rate) if (spec.kind or "cpu") == "cpu" else 0
    need = per * images * OUTPUT_COPIES + decode
    if need <= free:
        return
    fits = max(0, (free - decode) // (per * OUTPUT_COPIES))
    noun = ("video" if frames else "image") + ("s" if images != 1 else "")
    what = f"{images} {noun} of {width}x{height}" + (f" × {frames} frames" if frames else "")
    inputs = f"{name}, frames, width/height" if frames else f"{name}, width/height"
    kind = "float32 pixels" + (f" and sound ({format_bytes(sound)} a video)" if sound else "")
    raise ModelError(f"{inputs}: {what} {'are' if images != 1 or frames else 'is'} {format_bytes(per * images)} of "
                     f"{kind}, which the worker and ComfyUI hold about {OUTPUT_COPIES} times on their way out"
                     f"{f', and a sound decode of {format_bytes(decode)}' if decode else ''} ({format_bytes(need)}), "
                     f"more than this host's {format_bytes(free)} of free memory (of {format_bytes(total)}): at most "
                     f"{fits} at this size{' and length' if frames else ''}. Make fewer "
                     f"{'videos' if frames else 'images'}{', fewer frames' if frames else ''} or a smaller size, or "
                     "split the run over several prompts.")
