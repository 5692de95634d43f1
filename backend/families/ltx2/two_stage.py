"""LTX-2's two-stage spatial upscale, as ComfyUI's LTX-2.3 / 2.5 templates run it (worker only, torch): stage 1
denoises at half the width and height into latents, diffusers' LTX2LatentUpsamplePipeline doubles them with the
x2 latent upsampler (ComfyUI's latent_upscale_models: ltx-2.3-spatial-upscaler-x2-*), and stage 2 denoises the
upscaled video latents with stage 1's audio latents at full size on a few manual sigmas (the templates':
0.85, 0.725, 0.4219), re-noised to the first of them, as diffusers' own two-stage recipe does
(`latents=`, `audio_latents=`, `sigmas=`, `noise_scale=`).

Stage 2's scheduler is a copy of the call's own without dynamic shifting: LTX-2's published schedule shifts by the
token count, which would warp manual sigmas (0.4219 becomes 0.1 with shift_terminal 0.1), where ComfyUI's
ManualSigmas runs them as given. The same generators run on through both stages (diffusers draws stage 2's noise
from where stage 1 left them)."""

from __future__ import annotations

import json
import re
from itertools import pairwise
from pathlib import Path
from typing import Any

from ...protocol.errors import ModelError, SampleError

# the templates' stage-2 ManualSigmas (ComfyUI's trailing 0.0 left out: diffusers' scheduler appends it)
TEMPLATE_SIGMAS = (0.85, 0.725, 0.4219)
_loaded: dict[tuple, Any] = {}  # (path, dtype, device) -> the upsampler, loaded once per worker


def _config(sd: dict, metadata: dict | None, path: str) -> dict:
    """LTX2LatentUpsamplerModel's config of a single file: its shapes (in/mid channels, blocks, 2-D or 3-D
    convolutions, which resampler and by how much), then the JSON `config` of its metadata where Lightricks wrote
    one (its names: in_channels, mid_channels, num_blocks_per_stage, dims, spatial_upsample, temporal_upsample)."""
    conv = sd.get("initial_conv.weight")
    if conv is None or "final_conv.weight" not in sd:
        raise ModelError(f"upscale_model: {Path(path).name} is not an LTX-2 latent upsampler (no initial_conv / "
                         "final_conv weights); choose an ltx-2.x-spatial-upscaler-x2 file of latent_upscale_models")
    mid = conv.shape[0]
    config: dict[str, Any] = dict(in_channels=conv.shape[1], mid_channels=mid, dims=conv.ndim - 2,
                                  num_blocks_per_stage=len({k.split(".")[1] for k in sd if k.startswith("res_blocks.")}))
    if "upsampler.conv.weight" in sd:  # the rational resampler: pixel shuffle by a, blur and downsample by b
        ratio = sd["upsampler.conv.weight"].shape[0] // mid
        config.update(spatial_upsample=True, temporal_upsample=False, use_rational_resampler=True,
                      rational_spatial_scale={4: 2.0, 9: 1.5, 16: 4.0}.get(ratio, 2.0))
    elif "upsampler.0.weight" in sd:
        ratio = sd["upsampler.0.weight"].shape[0] // mid
        config.update(use_rational_resampler=False, spatial_upsample=ratio in (4, 8), temporal_upsample=ratio in (2, 8))
    published = json.loads((metadata or {}).get("config") or "{}")
    config.update({k: published[k] for k in ("in_channels", "mid_channels", "num_blocks_per_stage", "dims",
                                             "spatial_upsample", "temporal_upsample") if k in published})
    return config


def upsampler(path: str, dtype: Any, device: Any) -> Any:
    """The x2 latent upsampler of one of ComfyUI's latent_upscale_models files (safetensors), on the pipeline's
    device and dtype; loaded once per worker."""
    key = (path, str(dtype), str(device))
    if key in _loaded:
        return _loaded[key]
    from diffusers.pipelines.ltx2 import LTX2LatentUpsamplerModel
    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(path, "pt") as f:
        metadata = f.metadata()
    sd = load_file(path)
    model = LTX2LatentUpsamplerModel(**_config(sd, metadata, path))
    missing, unexpected = model.load_state_dict(sd, strict=False)
    if missing or unexpected:
        raise ModelError(f"upscale_model: {Path(path).name} does not fit diffusers' LTX2LatentUpsamplerModel "
                         f"(missing {sorted(missing)[:4]}, unexpected {sorted(unexpected)[:4]}); choose an "
                         "ltx-2.x-spatial-upscaler-x2 file of latent_upscale_models")
    _loaded.clear()  # one upsampler at a time
    _loaded[key] = model.to(device=device, dtype=dtype).eval()
    return _loaded[key]


def parse_sigmas(text: str) -> tuple[float, ...]:
    """Sample Video's upscale_sigmas ("0.85, 0.725, 0.4219", as ComfyUI's ManualSigmas writes them; a trailing 0
    is dropped, the scheduler appends it): falling values in (0, 1]; ValueError naming the fix otherwise."""
    try:
        values = [float(v) for v in re.split(r"[,\s]+", text.strip()) if v]
    except ValueError:
        raise ValueError(f"upscale_sigmas: {text!r} is not a list of numbers; write them as ManualSigmas does, "
                         "e.g. '0.85, 0.725, 0.4219'") from None
    return check_sigmas(values, repr(text))


def check_sigmas(values: Any, shown: str) -> tuple[float, ...]:
    """Stage 2's sigmas, falling values in (0, 1] (a NaN would run to NaN frames, then blamed on the weights):
    SampleError naming `shown` (the input as the artist wrote it) and the fix otherwise. Controller side too: the
    API's requests are checked as the node's text is."""
    values = list(values)
    if values and values[-1] == 0:
        values.pop()
    if (not values or any(not isinstance(v, (int, float)) or not 0 < v <= 1 for v in values)
            or any(a <= b for a, b in pairwise(values))):
        raise SampleError(f"upscale_sigmas: {shown} must be falling values in (0, 1] (a last 0 may follow), e.g. "
                          "the templates' '0.85, 0.725, 0.4219'")
    return tuple(float(v) for v in values)


def continued(callback: Any, offset: int) -> Any:
    """Stage 2's step callback: the call's own, told step `offset + i` for stage 2's step i, so that the progress
    counts on after stage 1's steps (`offset`: stage 1's model calls, steps × the scheduler's order)."""
    if callback is None:
        return None

    def on_step_end(pipe: Any, step: int, timestep: Any, callback_kwargs: dict) -> Any:
        return callback(pipe, offset + step, timestep, callback_kwargs)

    return on_step_end


def call(pipe: Any, kwargs: dict, path: str, sigmas: tuple[float, ...]) -> Any:
    """Both stages of one pipeline call: `kwargs` as for one stage at the final size (its output_type and step
    callback kept for stage 2; the callback sees stage 1's steps, then stage 2's after them: the progress counts
    both, and Cancel works in both)."""
    from diffusers.pipelines.ltx2 import LTX2LatentUpsamplePipeline

    height, width = kwargs["height"] // 2, kwargs["width"] // 2
    first = pipe(**{**kwargs, "height": height, "width": width, "output_type": "latent"})
    offset = kwargs["num_inference_steps"] * getattr(pipe.scheduler, "order", 1)
    model = upsampler(path, pipe.transformer.dtype, pipe._execution_device)
    up = LTX2LatentUpsamplePipeline(vae=pipe.vae, latent_upsampler=model)
    up.set_progress_bar_config(disable=True)
    video = up(latents=first.frames, height=height, width=width, num_frames=kwargs["num_frames"],
               output_type="latent", return_dict=False)[0]
    own = pipe.scheduler
    pipe.scheduler = type(own).from_config(own.config, use_dynamic_shifting=False, shift_terminal=None)
    try:
        return pipe(**{**kwargs, "latents": video, "audio_latents": first.audio, "sigmas": list(sigmas),
                       "num_inference_steps": len(sigmas), "noise_scale": sigmas[0],
                       "callback_on_step_end": continued(kwargs.get("callback_on_step_end"), offset)})
    finally:
        pipe.scheduler = own
