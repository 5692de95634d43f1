"""The sound of a video pipeline that makes one (Pipeline.sound: LTX-2), handed back beside its frames: the
waveform [B, channels, samples] float32 and the sample rate its vocoder's config gives (ComfyUI's AUDIO); and
Sample Video's AUDIO in, kept as the video's sound (Pipeline.audio_via: the family's audio module encodes it),
with the sound's decode saying how far it is and stopping on Cancel."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

from .. import families
from ..families import Pipeline
from ..protocol.errors import ModelError
from . import images


def waveform(family: Pipeline, result: Any) -> np.ndarray | None:
    """The call's sound [B, C, S] float32 (None for a model without sound), refused when it holds NaN or
    infinity: it would be saved as noise or silence."""
    if not family.sound:
        return None
    audio = getattr(result, "audio", None)
    if audio is None:
        raise ModelError(f"audio: {family.name} made no sound in this call ({type(result).__name__} has no audio); "
                         "check that the model's folder holds its audio_vae and vocoder.")
    out = np.asarray(audio.float().cpu().numpy() if hasattr(audio, "float") else audio, dtype=np.float32)
    if not np.isfinite(out).all():
        raise ModelError(f"audio: the run made a sound that is not numbers (NaN or infinity), which would be saved "
                         f"as noise, so it failed instead. The audio VAE or vocoder weights of this {family.name} "
                         "model are likely damaged or converted wrongly; or the model computes in float16 here: "
                         "choose dtype bfloat16 or float32 in Load TPU Pipeline.")
    return out


def rate(pipe: Any, family: Pipeline) -> int:
    """Samples per second of the sound, from the component config Pipeline.sound_rate names."""
    component, key = family.sound_rate.split(".", 1)
    return int(getattr(pipe, component).config[key])


def _module(family: Pipeline) -> ModuleType | None:
    """The family's audio module (families/<id>/<audio_module>.py; torch, worker only), None where it has none."""
    if not family.audio_module:
        return None
    return families.module(family.family, family.audio_module)


def add_inputs(pipe: Any, family: Pipeline, kind: str, kwargs: dict, arrays: dict, index: int,
               call: contextlib.ExitStack) -> None:
    """Image + audio to video: video `index`'s sound (waveform i of the batch, cycling; checked, resampled and cut
    to the frames by the controller) and start image (if any) into the call, its audio held clean for the call."""
    if kind != images.AUDIO:
        return
    waves, starts = arrays["audio"], arrays.get("image")
    image = None
    if starts is not None:
        image = images.pil(images.fit(starts[index % len(starts)], kwargs["width"], kwargs["height"]))
    module = _module(family)
    module.add_inputs(pipe, kwargs, image, waves[index % len(waves)])
    call.enter_context(module.held(pipe))


def decode_progress(pipe: Any, family: Pipeline, say: Callable[[str], None],
                    stop: Callable[[], bool]) -> contextlib.AbstractContextManager:
    """The sound's decode (audio VAE, vocoder) in the block says what it does and stops on Cancel between its
    pieces, for a family whose audio module has the hooks."""
    module = _module(family)
    if module is None or not family.sound:
        return contextlib.nullcontext()
    return module.decode_progress(pipe, say, stop)
