"""One planning pass from a pipeline description to one ready to run: `resolve(spec)` fills in what the choices
leave open and checks the whole against the model and this host, once per request, before any worker sees it.
Specs built by scripts pass through the same checks as the nodes' ones.

In order, each concern asked once: the device kind; the host's capacity and the model's components (read once,
for every layout question); weight storage; offload 'auto'; the layout (default layout, sharded encoders, load
order, then every layout check, and with a request its tokens against the context split); the sampling options;
the LoRAs, ControlNets and Redux references; the compile plan; with a request, its numbers, size and frames
against the model and the pixel budget.
"""

from __future__ import annotations

import dataclasses
import math

from .. import families
from ..protocol.errors import SampleError
from ..protocol.spec import PipelineSpec, SampleRequest
from . import (
    capacity,
    compile_plan,
    controlnets,
    cp_sizes,
    devices,
    layouts,
    loras,
    models,
    offload,
    pixels,
    redux,
    sampling_options,
    sound_input,
    storage,
)
from .components import Components

MAX_IMAGES = 4096  # images in one Sample (prompt lines × batch_size)


def resolve(spec: PipelineSpec, req: SampleRequest | None = None) -> PipelineSpec:
    """`spec` ready to run: its device kind, weight storage, offload 'auto', layout (v7x: Data Parallel over one
    chip's two devices), load order and compile plan resolved, and its parallel layout, sampling options, LoRAs,
    ControlNets and Redux references checked against the model and this host (on TPU: a worker count TorchTPU
    launches); with `req` (after its CONDITIONING), the request too. Idempotent."""
    if req is not None:
        _check_finite(req)  # before any figure is computed from it
    if not spec.kind:
        spec = spec.with_changes(kind=devices.resolve_kind(spec.device))
    cap = capacity.host_capacity(spec.kind)
    across, parts = capacity.span(spec.kind, cap), Components(spec)
    spec = offload.resolve_offload(storage.resolve_storage(spec), parts)
    sampling_options.check_sampling(spec)
    spec = layouts.resolve_layout(spec, cap, across, parts, req)
    for lora in spec.loras:
        loras.check(spec, lora)
    for controlnet in spec.controlnets:
        controlnets.check(spec, controlnet)
    for ref in spec.redux:
        redux.check(spec, ref)
    spec = compile_plan.resolve_compile(spec)
    if req is not None:
        _check_values(spec, req)
    return spec


def check_request(spec: PipelineSpec, req: SampleRequest) -> None:
    """Rejects a sample request before any worker sees it, naming the input and the fix (for scripts: `resolve`
    with a request asks the same, the tokens' split with the rest of the layout)."""
    _check_values(spec, req)
    cp_sizes.check_cp_size(spec, req.width, req.height, req.frames, req.frame_rate, bool(req.upscale_model))


def _check_finite(req: SampleRequest) -> None:
    for f in dataclasses.fields(req):
        value = getattr(req, f.name)
        if isinstance(value, float) and not math.isfinite(value):  # the API accepts NaN and inf; nodes would not
            raise SampleError(f"{f.name}: {value} is not a number the pipeline can use; give a finite value "
                              f"(e.g. {getattr(SampleRequest, f.name)}).")


def _check_values(spec: PipelineSpec, req: SampleRequest) -> None:
    """The request's numbers, size and frames against the model and the pixel budget."""
    _check_finite(req)
    models.check_size(models.info_of(spec), req.width, req.height)
    models.check_frames(spec.family, req.frames, spec.component_config("transformer"))
    if spec.family.frame_rate_arg and not 1 <= req.frame_rate <= 240:
        raise SampleError(f"frame_rate: {req.frame_rate:g} frames per second is out of range for {spec.family.name}; "
                          "use 1 to 240 (the LTX-2 templates use 24 and 25).")
    pixels.check(spec, req.width, req.height, req.batch_size)
    pixels.check_output(spec, req.width, req.height, len(req.images()), req.frames,
                        sound=sound_input.output_bytes(spec, req), frame_rate=req.frame_rate)
    if req.steps < (least := spec.family.min_steps):
        whose = f" for {spec.family.name} (its scheduler takes at least {least})" if least > 1 else ""
        raise SampleError(f"steps: {req.steps} is too small{whose}; use at least {least}.")
    _check_upscale(spec, req)
    if req.batch_size < 1:
        raise SampleError(f"batch_size: {req.batch_size} is too small; use at least 1.")
    if not req.prompt.strip():
        raise SampleError("prompt: the prompt is empty; describe the image you want.")
    if (count := len(req.images())) > MAX_IMAGES:
        lines = len(req.prompts())
        if lines > 1:
            raise SampleError(f"prompt: {lines} prompt lines × batch_size {req.batch_size} = {count} images in one "
                              f"run is too many; use at most {MAX_IMAGES} (fewer lines, or a smaller batch_size).")
        raise SampleError(f"batch_size: {count} images in one run is too many; use at most {MAX_IMAGES}.")
    if not 0 <= req.seed < 2**64:
        raise SampleError(f"seed: {req.seed} is out of range; use 0 to 2^64-1.")


def _check_upscale(spec: PipelineSpec, req: SampleRequest) -> None:
    """Sample Video's upscale_model: a model that runs two stages (LTX-2), whose half size still fits its VAE,
    with stage-2 sigmas; and its audio_guidance: a model with a guidance of its sound."""
    if req.audio_guidance >= 0 and not spec.family.guidance_also:
        raise SampleError(f"audio_guidance: {spec.family.name} has no guidance of its own for a sound; leave it at -1 "
                          "(the same as guidance).")
    if not req.upscale_model:
        return
    if not spec.family.latent_upscale:
        raise SampleError(f"upscale_model: {spec.family.name} has no two-stage latent upscale "
                          f"({families.family_names(lambda p: bool(p.latent_upscale))} has); choose none.")
    step = 2 * spec.size_factor
    for name in ("width", "height"):
        if (value := getattr(req, name)) % step:
            raise SampleError(f"{name}: {value} is not a multiple of {step}: with upscale_model the first stage runs "
                              f"at half the size, a multiple of {step // 2}; use {max(step, value // step * step)} "
                              f"or {value // step * step + step}.")
    if not req.upscale_sigmas:
        raise SampleError("upscale_sigmas: none given; the second stage needs its sigmas, e.g. the templates' "
                          "0.85, 0.725, 0.4219.")
    families.module(spec.family.family, spec.family.latent_upscale).check_sigmas(
        req.upscale_sigmas, ", ".join(f"{s:g}" if isinstance(s, (int, float)) else repr(s) for s in req.upscale_sigmas))
