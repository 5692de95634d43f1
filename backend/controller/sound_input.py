"""Sample Video's AUDIO input (image + audio to video), checked and fitted before any worker starts (controller
side, numpy and PyAV, ComfyUI's own dependency for its audio and video nodes); and its reference_audio (MiniMax
H3's reference sounds, `reference_arrays`).

ComfyUI's AUDIO is {"waveform": [batch, channels, samples], "sample_rate": N}. The model keeps the sound as it is
and makes frames that go with it, so the sound must last as long as the video: frames / frame_rate seconds. It is
resampled to the audio VAE's rate where it has another (as ComfyUI's LTXVAudioVAEEncode does, through
comfy.audio.resample); mono is used on both channels (as ComfyUI's encoder does). A sound shorter than the video,
or more than LONGER_S longer, is refused with the frames that would fit it; within that, it is cut to exactly the
audio latents the frames take (the pipeline counts round(seconds × latents per second) of them). Video i takes
waveform i of the batch (cycling, as start images do; the note says so). Integer samples are scaled to -1..1 as
ComfyUI's Load Audio does (comfy_extras/nodes_audio.py f32_pcm); a float waveform far beyond full scale (integer
samples stored as floats) is refused: the model would hear noise, or overflow.
"""

from __future__ import annotations

import math

import numpy as np

from .. import families
from ..protocol.errors import ModelError
from ..protocol.spec import PipelineSpec, SampleRequest

LONGER_S = 0.5  # a sound may run this much past the video's end (the frames come in steps of 8): the rest is cut
MEL_PER_LATENT = 4  # the LTX-2 audio VAE's time compression (mel frames per latent; causal: the first 3 are one)
MIN_LATENTS = 4  # fewer (a video of a few frames) leave the STFT shorter than its own window
MIN_RATE, MAX_RATE = 1000, 768_000  # below 1 kHz there is no sound to resample (libswresample gives nothing)
LOUDEST = 16.0  # a float waveform's peak beyond this (24 dB over full scale) is not a sound but integers or overflow
FULL_SCALE = {"int16": 2 ** 15, "int32": 2 ** 31}  # ComfyUI's f32_pcm: the integer PCM formats it reads


def audio_families() -> str:
    """'LTX-2': the families whose Sample Video takes an AUDIO (Pipeline.audio_via)."""
    return families.family_names(lambda p: bool(p.audio_via))


def arrays(spec: PipelineSpec, req: SampleRequest, audio: dict | None) -> dict[str, np.ndarray]:
    """{"audio": [B, C, S] float32 at the audio VAE's rate, cut to the frames' length} (empty without AUDIO); a
    ModelError naming `audio`, the value and the fix for anything the model cannot take."""
    if audio is None:
        return {}
    family = spec.family
    if not family.audio_via:
        raise ModelError(f"audio: '{spec.name}' ({family.name}) takes no sound in (image + audio to video); the "
                         f"families that take one: {audio_families()}. Disconnect the audio from Sample Video, "
                         "or load one of those models.")
    if req.steps < family.audio_min_steps:
        raise ModelError(f"steps: {req.steps} with an audio input is too few: image + audio to video runs "
                         f"diffusers' {family.audio_via}, which takes at least {family.audio_min_steps} steps; set "
                         f"steps to {family.audio_min_steps} or more, or disconnect the audio.")
    wave, rate = _waveform(audio)
    target, hop = _rates(spec)
    if target <= 0 or hop <= 0:
        raise ModelError(f"audio: '{spec.name}' has no audio VAE config with sample_rate and mel_hop_length "
                         "(audio_vae/config.json), so the sound cannot be encoded; check the model's folder.")
    latents = audio_latents(spec, req.frames, req.frame_rate)
    if latents < MIN_LATENTS:
        raise ModelError(f"audio: a video of {req.frames} frames at {req.frame_rate:g} fps is too short to take a "
                         f"sound ({latents} audio latents, at least {MIN_LATENTS}); make more frames (at least "
                         f"{_frames_for(MIN_LATENTS * MEL_PER_LATENT * hop / target, req, family.frame_step)}).")
    _check_length(wave.shape[2] / rate, req, family.frame_step, (MEL_PER_LATENT * latents - MEL_PER_LATENT) * hop / target)
    wave = _samples(wave[:len(req.images())], "audio")  # measured first: an hour of sound is refused uncopied
    if rate != target:
        wave = resample(wave, rate, target)
    needed = (MEL_PER_LATENT * latents - MEL_PER_LATENT) * hop + 2 * hop  # the middle of the latents' window
    if wave.shape[2] < needed:  # at most two mel frames short after resampling: silence
        wave = np.pad(wave, ((0, 0), (0, 0), (0, needed - wave.shape[2])))
    return {"audio": np.ascontiguousarray(wave[:, :, :needed], dtype=np.float32)}


def _rates(spec: PipelineSpec) -> tuple[int, int]:
    """The audio VAE's sample rate and mel hop (0, 0 where its config has none)."""
    config = spec.component_config("audio_vae")
    return int(config.get("sample_rate", 0)), int(config.get("mel_hop_length", 0))


def audio_latents(spec: PipelineSpec, frames: int, frame_rate: float) -> int:
    """The audio latents (the sound's tokens) LTX-2's pipelines make for a video of `frames` at `frame_rate`:
    round(seconds × latents a second), as diffusers counts them; 0 for a model whose audio VAE config gives no
    rate (no sound, or another layout)."""
    target, hop = _rates(spec)
    if target <= 0 or hop <= 0 or frames <= 0 or frame_rate <= 0:
        return 0
    return round(frames / frame_rate * target / hop / MEL_PER_LATENT)


def note(spec: PipelineSpec, req: SampleRequest, audio: dict | None) -> str | None:
    """What happens to the sound (for the node's text): kept, resampled where its rate differs, and which video
    takes which sound where the batches differ."""
    if audio is None:
        return None
    rate, target = int(audio["sample_rate"]), int(spec.component_config("audio_vae")["sample_rate"])
    resampled = f", resampled from {rate} Hz to the model's {target} Hz" if rate != target else ""
    sounds, videos = len(_waveform(audio)[0]), len(req.images())
    batch, unused = "", f"sound {sounds} is" if sounds == videos + 1 else f"sounds {videos + 1} to {sounds} are"
    if sounds != videos:
        batch = (f" {sounds} sound{'s' if sounds > 1 else ''} for {videos} video{'s' if videos > 1 else ''}: video i "
                 "takes sound i" + (f" (cycling: i mod {sounds})." if sounds < videos else f"; {unused} not used."))
    return f"audio: the video is made to this sound, which it keeps{resampled}.{batch}"


def output_bytes(spec: PipelineSpec, req: SampleRequest) -> int:
    """Bytes of the sound one video hands back beside its frames (float32 [channels, samples] at the rate
    Pipeline.sound_rate names; LTX-2's vocoder and MiniMax H3's audio VAE make stereo), for the output bound;
    0 for a model without sound."""
    family = spec.family
    if not family.sound or not family.sound_rate or req.frames <= 0:
        return 0
    component, key = family.sound_rate.split(".", 1)
    config = spec.component_config(component)
    rate, channels = config.get(key, 0), config.get("out_channels", 2)
    fps = family.modular.fps if family.modular and family.modular.fps else req.frame_rate
    if not isinstance(rate, (int, float)) or rate <= 0 or not fps or fps <= 0:
        return 0
    return math.ceil(req.frames / fps * rate) * int(channels) * 4


def reference_families() -> str:
    """'MiniMax H3': the families whose Sample Video takes a reference_audio (Modular.audio_reference)."""
    return families.family_names(lambda p: bool(p.modular and p.modular.audio_reference))


def reference_arrays(spec: PipelineSpec, req: SampleRequest, audio: dict | None,
                     references: np.ndarray | None) -> dict[str, np.ndarray]:
    """Sample Video's reference_audio (MiniMax H3's ref2va: the prompt's <Audio 1>, <Audio 2>, ... in batch order):
    {"reference_audio": [N, C, S] float32 at the audio VAE's rate, cut to the video's length (diffusers' ref2va
    reads no more)}; a ModelError naming the input, the value and the fix for what the blocks cannot take. The
    sound is resampled here (diffusers would need torchaudio, which is not installed beside it)."""
    if audio is None:
        return {}
    family, modular = spec.family, spec.family.modular
    if modular is None or not modular.audio_reference:
        raise ModelError(f"reference_audio: '{spec.name}' ({family.name}) takes no reference sound; the families "
                         f"that take one: {reference_families()} (reference to video). Disconnect the "
                         "reference_audio from Sample Video, or load one of those models.")
    if references is None:
        raise ModelError(f"reference_audio: {family.name} takes a reference sound only beside reference images "
                         "(diffusers' ref2va: an audio reference has to be paired with an image reference); "
                         "connect reference_images too, or disconnect the reference_audio.")
    wave, rate = _waveform(audio, "reference_audio")
    if len(wave) > modular.audio_references:
        raise ModelError(f"reference_audio: {len(wave)} sounds in its batch; {family.name} takes at most "
                         f"{modular.audio_references} (<Audio 1> to <Audio {modular.audio_references}>); give fewer.")
    wave = _samples(wave[:, :, :math.ceil(req.frames / modular.fps * rate)], "reference_audio")  # cut, then copied
    target = int(spec.component_config("audio_vae").get("sampling_rate", 0))
    if target <= 0:
        raise ModelError(f"reference_audio: '{spec.name}' has no audio VAE config with a sampling_rate "
                         "(audio_vae/config.json), so the sound cannot be encoded; check the model's folder.")
    return {"reference_audio": np.ascontiguousarray(resample(wave, rate, target) if rate != target else wave)}


def reference_note(spec: PipelineSpec, req: SampleRequest, audio: dict | None) -> str | None:
    """What happens to the reference sounds (for the node's text)."""
    if audio is None:
        return None
    wave, rate = _waveform(audio, "reference_audio")
    seconds, video = wave.shape[2] / rate, req.frames / spec.family.modular.fps
    target = int(spec.component_config("audio_vae")["sampling_rate"])
    tags = ", ".join(f"<Audio {i}>" for i in range(1, len(wave) + 1))
    cut = f", cut to the video's {video:.2f} s" if seconds > video else ""
    resampled = f", resampled from {rate} Hz to the model's {target} Hz" if rate != target else ""
    return f"reference_audio: {len(wave)} sound{'s' if len(wave) > 1 else ''} ({seconds:.2f} s) for {tags}{cut}{resampled}."


def _waveform(audio: dict, name: str = "audio") -> tuple[np.ndarray, int]:
    """The AUDIO's waveform [B, C, S] (1 or 2 channels) as numpy (a view of the tensor, not yet copied), and its
    rate; refused where it is not one."""
    if not isinstance(audio, dict) or "waveform" not in audio or "sample_rate" not in audio:
        raise ModelError(f"{name}: {type(audio).__name__} is not ComfyUI's AUDIO ({{'waveform': [batch, channels, "
                         "samples], 'sample_rate': N}}); connect Load Audio or another AUDIO output.")
    rate = audio["sample_rate"]
    if isinstance(rate, bool) or not isinstance(rate, (int, np.integer)) or not MIN_RATE <= int(rate) <= MAX_RATE:
        raise ModelError(f"{name}: sample_rate {rate!r} is not a number of samples a second between {MIN_RATE} and "
                         f"{MAX_RATE}; check the node that made the audio (Load Audio gives the file's own).")
    w = audio["waveform"]
    if hasattr(w, "detach"):  # a torch tensor; half precision has no numpy view
        if w.is_meta:
            raise ModelError(f"{name}: the waveform is a tensor on the 'meta' device, which holds no samples; check "
                             "the node that made the audio.")
        w = w.detach().cpu()
        w = (w.float() if w.is_floating_point() and w.element_size() == 2 else w).numpy()
    w = np.asarray(w)
    if w.ndim == 2:
        w = w[None]
    if w.dtype.kind in "iu" and w.dtype.name not in FULL_SCALE:
        raise ModelError(f"{name}: the waveform holds {w.dtype} samples, which ComfyUI's AUDIO does not (it holds "
                         f"float samples within -1..1, or 16- or 32-bit integers, which Load Audio scales); convert "
                         "it to float32 within -1..1, or load the file with Load Audio.")
    if w.ndim != 3 or w.shape[0] < 1 or w.shape[1] not in (1, 2) or w.shape[2] < 1 or w.dtype.kind not in "fi":
        raise ModelError(f"{name}: a waveform of shape {list(w.shape)} ({w.dtype}) cannot be used; it must be [batch, "
                         "channels, samples] with 1 (mono) or 2 (stereo) channels and some samples (mix other "
                         "channel counts down to stereo first).")
    return w, int(rate)


def _samples(wave: np.ndarray, name: str) -> np.ndarray:
    """The (already cut) waveform as float32 within full scale: integer PCM scaled as ComfyUI's f32_pcm; refused
    where it is not numbers or far beyond full scale, naming the peak (the model would hear noise or overflow:
    MiniMax H3's video then comes out NaN, blamed on the weights)."""
    scale = FULL_SCALE.get(wave.dtype.name)
    wave = np.asarray(wave, dtype=np.float32) / scale if scale else np.asarray(wave, dtype=np.float32)
    if not np.isfinite(wave).all():
        raise ModelError(f"{name}: the waveform holds values that are not numbers (NaN or infinity), which the model "
                         "would turn into noise; check the nodes that made it (a file that decodes wrongly, or "
                         "audio math).")
    if (peak := float(np.abs(wave).max())) > LOUDEST:
        raise ModelError(f"{name}: the waveform's peak is {peak:.3g}, where ComfyUI's AUDIO holds float samples "
                         f"within -1..1 (1 is full scale; at most {LOUDEST:g} is taken): the model would hear noise. "
                         "It looks like integer samples stored as floats (divide 16-bit ones by 32768) or audio "
                         "math gone wrong; scale it into -1..1.")
    return wave


def _check_length(seconds: float, req: SampleRequest, step: int, least: float) -> None:
    """A sound shorter than the video needs, or more than LONGER_S longer than it, is refused naming the frames
    that fit it."""
    video = req.frames / req.frame_rate
    if least <= seconds <= video + LONGER_S:
        return
    fits = _frames_for(seconds, req, step)
    what = "short" if seconds < least else "long"
    fix = (f"Trim it to {video:.2f} s (ComfyUI's Trim Audio Duration), or set frames to {fits}" if what == "long"
           else f"Give a longer sound, or set frames to {fits}")
    raise ModelError(f"audio: the sound lasts {seconds:.2f} s, too {what} for {req.frames} frames at "
                     f"{req.frame_rate:g} fps ({video:.2f} s): the model keeps the sound and makes the frames to "
                     f"go with it, so both must last as long. {fix} (or change frame_rate).")


def _frames_for(seconds: float, req: SampleRequest, step: int) -> int:
    """The largest frame count the model takes (1 + a multiple of `step`) lasting no longer than `seconds`."""
    step = step or 1
    return 1 + step * max(0, math.floor((seconds * req.frame_rate - 1) / step))


def resample(wave: np.ndarray, rate: int, target: int) -> np.ndarray:
    """The waveform [B, C, S] at `target` samples a second, by libswresample (PyAV), video by video."""
    import av

    layout = "mono" if wave.shape[1] == 1 else "stereo"
    out = []
    for one in wave:
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(one, dtype=np.float32), format="fltp", layout=layout)
        frame.sample_rate = rate
        resampler = av.AudioResampler(format="fltp", layout=layout, rate=target)
        parts = [f.to_ndarray() for f in resampler.resample(frame)] + [f.to_ndarray() for f in resampler.resample(None)]
        out.append(np.concatenate(parts, axis=1))
    length = min(p.shape[1] for p in out)
    return np.stack([p[:, :length] for p in out])
