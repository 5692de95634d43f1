"""The sound of a video pipeline that makes one (Pipeline.sound: LTX-2), handed back beside its frames: the
waveform [B, channels, samples] float32 and the sample rate its vocoder's config gives (ComfyUI's AUDIO)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..families import Pipeline
from ..protocol.errors import ModelError


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
