"""One Sample: its request and inputs checked in one planning pass (`prepare_sample`), then run on the worker
group (`run_sample`); VAE Decode (TPU); the size a LATENT or an image sets; the last Sample's timings.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..protocol import samplers
from ..protocol.errors import ModelError
from ..protocol.messages import Status, Step, steps_per_image
from ..protocol.spec import PipelineSpec, SampleRequest
from . import (
    conditioning,
    controlnets,
    cp_sizes,
    group,
    images,
    latency,
    latents,
    models,
    pixels,
    prompt_weights,
    redux,
    resolve,
    sigmas,
    sound_input,
)
from .workers import ProgressFn, group_config, status_adapter


@dataclass(frozen=True)
class PreparedSample:
    """One Sample, resolved and checked once: the ready spec, the request, the input images as the workers take
    them (copied once), and what will happen to them, for the node's text."""

    spec: PipelineSpec
    req: SampleRequest
    arrays: dict[str, np.ndarray]
    notes: tuple[str, ...]


def size_from_image(spec: PipelineSpec, image: np.ndarray) -> tuple[int, int, str | None]:
    """Width and height that follow the image (rounded down to the model's size factor), and a note if rounded;
    held to the limits width and height have (the node's range, the model's, the pixel budget), checked from the
    image's shape before its pixels are copied."""
    shape = np.shape(image)
    if len(shape) in (3, 4) and min(shape[-3:-1], default=0) >= 1:
        h, w = shape[-3:-1]
        f = spec.size_factor or 1
        try:
            models.check_size(models.info_of(spec), max(f, w // f * f), max(f, h // f * f))
            pixels.check(spec, max(f, w // f * f), max(f, h // f * f))
        except ModelError as e:
            raise ModelError(f"size_from_image: the image is {w}x{h}, and width and height follow it, so they are "
                             f"held to the same limits: {e} Turn size_from_image off and set width and height, or "
                             "scale the image down first (Upscale Image By).") from None
    return images.size_from_image(spec, image)


def prepare_sample(spec: PipelineSpec, req: SampleRequest, image: np.ndarray | None = None,
                   mask: np.ndarray | None = None, latent: np.ndarray | None = None,
                   asked: tuple[int, int, int] | None = None, positive: Sequence | None = None,
                   negative: Sequence | None = None, audio: dict | None = None, end_image: np.ndarray | None = None,
                   references: np.ndarray | None = None, reference_audio: dict | None = None) -> PreparedSample:
    """Resolves `spec` and checks the request and Sample's image, latent and CONDITIONING inputs (raising an
    InputError naming the input), once: the node shows the notes, then `run_sample` runs exactly this.

    In order: the CONDITIONING, then `resolve` (the pipeline filled in; it and the request checked, each concern
    once), then the image, mask or latent inputs, the ControlNets' and Redux references' arrays, the VAE tiling,
    the sampler and the prompt weights.

    `image` (IMAGE [B, H, W, C] in 0..1) starts image-to-image, or gives reference images to the families that
    take them; with `mask` (MASK [B, H, W], 1 = repaint) it inpaints. `latent` (from `latents.latent_input`, whose size
    and batch `req` has) starts from a LATENT instead; `asked`: the node's own width, height and batch_size.
    `positive` / `negative`: ComfyUI's CONDITIONING (tensors as numpy arrays) replacing the prompt text
    (controller/conditioning.py). `audio`: Sample Video's AUDIO, the sound the video is made to (image + audio to
    video: controller/sound_input.py). `end_image` / `references`: Sample Video's last frame and reference images
    (IMAGE, MiniMax H3's fl2va and ref2va); `reference_audio`: its reference sounds (AUDIO, MiniMax H3's ref2va)."""
    conditioned = conditioning.apply(spec, req, positive, negative)  # CONDITIONING in place of the prompt text
    if conditioned is not None:
        req = conditioned.req
    spec = resolve.resolve(spec, req)  # the planning pass: the pipeline filled in, it and the request checked
    arrays = {**images.as_arrays(spec, req, image, mask, end_image, references), **sound_input.arrays(spec, req, audio),
              **sound_input.reference_arrays(spec, req, reference_audio, references)}
    if latent is None:
        notes, starts = images.describe(spec, req, arrays), images.starts_from_image(spec, arrays)
        controlnets.check_inputs(spec, starts, "mask" in arrays, req.denoise)
    else:
        latents.check(spec, req, image is not None)
        arrays["latent"] = latent
        notes = latents.describe(spec, req, latent, asked or (req.width, req.height, req.batch_size))
        starts = req.denoise < 1
    arrays.update(controlnets.arrays(spec))
    arrays.update(redux.arrays(spec))
    if tiling := pixels.video_tiling(spec, req.width, req.height, req.frames):
        req = dataclasses.replace(req, tiled_vae=True)
    req, scheduled = sigmas.apply(spec, req, starts)
    said = [samplers.check(spec, req, starts), prompt_weights.note(req), tiling, scheduled, sound_input.note(spec, req, audio),
            sound_input.reference_note(spec, req, reference_audio),
            cp_sizes.note(spec, req.width, req.height, req.frames, req.frame_rate)]
    if conditioned is not None:
        arrays, notes = {**arrays, **conditioned.arrays}, [*conditioned.notes, *notes]
    return PreparedSample(spec, req, arrays, tuple(notes + [text for text in said if text]))


def describe_inputs(spec: PipelineSpec, req: SampleRequest, image: np.ndarray | None = None,
                    mask: np.ndarray | None = None, positive: Sequence | None = None,
                    negative: Sequence | None = None) -> list[str]:
    """Checks Sample's inputs, sampler and scheduler as `sample` would and says what will happen."""
    return list(prepare_sample(spec, req, image, mask, positive=positive, negative=negative).notes)


def run_sample(prepared: PreparedSample, on_progress: ProgressFn | None = None,
               should_interrupt: Callable[[], bool] | None = None) -> np.ndarray:
    """Images [B, H, W, C] float32 in 0..1 for a prepared Sample (loading the pipeline first if needed); a video
    pipeline's frames, one video after another [B·F, H, W, C]. Where the time went is kept for `last_latency`."""
    return run_sample_outputs(prepared, on_progress, should_interrupt)["images"]


def run_sample_outputs(prepared: PreparedSample, on_progress: ProgressFn | None = None,
                       should_interrupt: Callable[[], bool] | None = None) -> dict[str, np.ndarray]:
    """What the request's `outputs` asks, by name: "images" (as `run_sample` gives them), "latents" (ComfyUI's
    LATENT samples [B, C, h, w], [B, C, 1, h, w] for Qwen-Image: what the pipeline hands its VAE to decode), and
    for a video model with sound (Pipeline.sound) "audio" [B, C, S] float32 with "audio_rate" [1] (samples per
    second)."""
    t0 = time.perf_counter()
    spec, req = prepared.spec, prepared.req
    progress = _group_progress(spec, req, on_progress)
    before = group.current_group()
    results = group.run(group_config(spec),
                        lambda g: g.sample(spec, req, progress, should_interrupt, prepared.arrays),
                        status_adapter(on_progress), should_interrupt)
    received = time.time()
    # Each replica's first rank sends its slice; rank order is image order.
    out = {}
    for name in ("images", "latents", "audio"):
        parts = [r.arrays[name] for r in results if name in r.arrays]
        if parts:
            out[name] = parts[0] if len(parts) == 1 else np.concatenate(parts)
    if "audio" in out:  # every replica's vocoder is the same one
        out["audio_rate"] = next(r.arrays["audio_rate"] for r in results if "audio_rate" in r.arrays)
    now = group.current_group()
    started = now.start_s if now is not None and now is not before else 0.0
    latency.record(results, started, received, time.perf_counter() - t0)
    return out


def sample(spec: PipelineSpec, req: SampleRequest, on_progress: ProgressFn | None = None,
           should_interrupt: Callable[[], bool] | None = None, image: np.ndarray | None = None,
           mask: np.ndarray | None = None, positive: Sequence | None = None,
           negative: Sequence | None = None) -> np.ndarray:
    """`prepare_sample` then `run_sample`: one call for scripts, tests and benchmarks."""
    return run_sample(prepare_sample(spec, req, image, mask, positive=positive, negative=negative), on_progress,
                      should_interrupt)


def decode(spec: PipelineSpec, samples: np.ndarray, on_progress: ProgressFn | None = None,
           should_interrupt: Callable[[], bool] | None = None) -> np.ndarray:
    """VAE Decode (TPU): a LATENT (numpy) decoded by the pipeline's own VAE on the workers (loading it first if
    needed), as its Sample decodes; images [B, H, W, C] float32 in 0..1."""
    spec = resolve.resolve(spec)
    latent = latents.decode_input(spec, samples)
    results = group.run(group_config(spec), lambda g: g.decode(spec, {"latent": latent}, on_progress,
                                                                 should_interrupt),
                        status_adapter(on_progress), should_interrupt)
    return results[0].arrays["images"]


def record_queue_wait(seconds: float) -> None:
    """The node's share of the last Sample's report: how long the prompt waited in ComfyUI's queue (and for the
    nodes before Sample)."""
    latency.record_queue_wait(seconds)


def last_latency() -> dict | None:
    """Where the last Sample's time went, in seconds (None before the first): start_s (worker group start),
    load_s (loading, compiling warm-ups), text_s, denoise_s, vae_s, handback_s, total_s (the whole run)."""
    return latency.last()


def _group_progress(spec: PipelineSpec, req: SampleRequest, on_progress: ProgressFn | None) -> ProgressFn | None:
    """One progress bar for the whole group: completed steps of all replicas over the steps of all images."""
    if on_progress is None:
        return None
    total = len(req.images()) * steps_per_image(req)  # both stages' with upscale_model
    done: dict[int, int] = {}

    def aggregate(msg: Status | Step) -> None:
        if isinstance(msg, Step):
            done[msg.rank // spec.model_ranks] = msg.step  # each replica reports its own share
            msg = Step(msg.id, sum(done.values()), total, msg.step_s, msg.rank)
        on_progress(msg)

    return aggregate
