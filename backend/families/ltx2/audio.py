"""LTX-2's image + audio to video (worker side, torch): Sample Video's AUDIO becomes the video's sound, kept as it
is while the frames are made to go with it, as ComfyUI's template (video_ltx2_3_ia2v) does with LTXVAudioVAEEncode
and SetLatentNoiseMask(mask 0) on the audio latent.

diffusers has no audio input on any LTX-2 pipeline, so LTX2ConditionPipeline (the start image as its frame-0
condition) is driven so: the waveform's log-mel spectrogram, encoded by the audio VAE (its posterior's mode), is
the call's `audio_latents`; they get no noise (`prepare_audio_latents` at noise_scale 0) and an audio scheduler
whose timesteps are 0 (the transformer is told the sound is clean) and whose step keeps them, so the sound that
comes out is the input's, decoded by the audio VAE and the vocoder.

The log-mel is ComfyUI's (comfy/ldm/lightricks/vae/audio_vae.py: torchaudio's MelSpectrogram with power 1, HTK
mel scale, no filter norm, centred reflect-padded Hann STFT, then log of the magnitude clamped at 1e-5), here with
torch's STFT and transformers' mel filter bank (torchaudio is not installed beside diffusers). The waveform comes
at the audio VAE's own rate (the controller resamples, as ComfyUI does) and the length the frames take.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from diffusers import FlowMatchEulerDiscreteScheduler

from ...protocol.errors import Interrupted

# The published LTX-2 audio VAE's STFT size (ComfyUI reads it from the file's autoencoder config, n_fft: 1024);
# diffusers' AutoencoderKLLTX2Audio config has no such key, so a folder's config may add one
N_FFT = 1024
LATENT_MEL_DOWNSAMPLE = 4  # 4 mel frames per audio latent (the VAE's time compression)


def samples_for(latents: int, hop: int) -> int:
    """The waveform samples that give `latents` audio latents: 4 mel frames each, less the causal VAE's first 3,
    at `hop` samples per mel frame (a centred STFT of S samples gives S // hop + 1 frames)."""
    return (LATENT_MEL_DOWNSAMPLE * latents - LATENT_MEL_DOWNSAMPLE) * hop


def log_mel(audio_vae: Any, waveform: torch.Tensor) -> torch.Tensor:
    """Waveform [B, C, S] at the audio VAE's rate -> log-mel [B, C, T, mel_bins], as ComfyUI computes it."""
    from transformers.audio_utils import mel_filter_bank

    config = audio_vae.config
    n_fft, hop, mels, rate = int(config.get("n_fft", N_FFT)), config.mel_hop_length, config.mel_bins, config.sample_rate
    b, c, s = waveform.shape
    # float64 on the CPU: the log of the quiet bands would amplify float32's rounding to whole units
    spec = torch.stft(waveform.reshape(b * c, s).double(), n_fft=n_fft, hop_length=hop, win_length=n_fft,
                      window=torch.hann_window(n_fft, dtype=torch.float64), center=True, pad_mode="reflect",
                      return_complex=True).abs()
    bank = mel_filter_bank(num_frequency_bins=n_fft // 2 + 1, num_mel_filters=mels, min_frequency=0.0,
                           max_frequency=rate / 2, sampling_rate=rate, norm=None, mel_scale="htk")
    mel = torch.log(torch.clamp(torch.einsum("bft,fm->bmt", spec, torch.from_numpy(bank)), min=1e-5)).float()
    return mel.reshape(b, c, mels, -1).permute(0, 1, 3, 2).contiguous()


def encode(audio_vae: Any, waveform: np.ndarray, device: Any) -> torch.Tensor:
    """One video's waveform [C, S] (float32, the VAE's rate) -> its raw audio latents [1, C', L, M'] (the
    pipeline normalises them)."""
    wave = torch.from_numpy(np.ascontiguousarray(waveform, dtype=np.float32))[None]
    if wave.shape[1] == 1 and audio_vae.config.in_channels == 2:  # mono, as ComfyUI's encoder takes it
        wave = wave.expand(-1, 2, -1)
    mel = log_mel(audio_vae, wave).to(device=device, dtype=audio_vae.dtype)
    return audio_vae.encode(mel).latent_dist.mode()


class HeldAudioScheduler(FlowMatchEulerDiscreteScheduler):
    """The audio's scheduler in image + audio to video: timesteps 0 (clean), sigmas 1 (the pipeline divides by
    them; the result is discarded) and a step that returns the sample, so the audio latents stay the input's."""

    def set_timesteps(self, num_inference_steps: int | None = None, device: Any = None, sigmas: Any = None,
                      mu: float | None = None, timesteps: Any = None) -> None:
        # the full signature: diffusers' retrieve_timesteps reads it to see that custom sigmas are taken
        super().set_timesteps(num_inference_steps, device, sigmas, mu, timesteps)
        self.timesteps = torch.zeros_like(self.timesteps)
        self.sigmas = torch.ones_like(self.sigmas)

    def step(self, model_output: torch.Tensor, timestep: Any, sample: torch.Tensor, *args: Any,
             return_dict: bool = True, **kwargs: Any) -> Any:
        from diffusers.schedulers.scheduling_flow_match_euler_discrete import (
            FlowMatchEulerDiscreteSchedulerOutput,
        )

        return FlowMatchEulerDiscreteSchedulerOutput(prev_sample=sample) if return_dict else (sample,)


def add_inputs(pipe: Any, kwargs: dict, image: Any, waveform: np.ndarray) -> None:
    """One call's inputs: the start image (a PIL image at the video's size, or None) as the frame-0 condition,
    the sound's latents, and the held audio scheduler."""
    from diffusers.pipelines.ltx2 import LTX2VideoCondition

    if image is not None:
        kwargs["conditions"] = [LTX2VideoCondition(frames=image, index=0, strength=1.0)]
    kwargs["audio_latents"] = encode(pipe.audio_vae, waveform, pipe._execution_device)
    pipe.audio_scheduler = HeldAudioScheduler.from_config(pipe.scheduler.config)


@contextlib.contextmanager
def held(pipe: Any) -> Iterator[None]:
    """The call's audio latents get no noise (they are the input's sound), whatever the video's noise_scale."""
    original = pipe.prepare_audio_latents

    def clean(*args: Any, **kwargs: Any) -> Any:
        return original(*args, **{**kwargs, "noise_scale": 0.0})

    pipe.prepare_audio_latents = clean
    try:
        yield
    finally:
        del pipe.prepare_audio_latents


@contextlib.contextmanager
def decode_progress(pipe: Any, say: Callable[[str], None], stop: Callable[[], bool]) -> Iterator[None]:
    """The sound's decode says what it does and stops on Cancel between its pieces: the audio VAE's decoder, then
    each of the vocoder's upsampling stages (a BWE vocoder's two vocoders, one after the other), and, unsaid,
    before each of a stage's residual blocks: a stage's blocks at the output's rate are most of the decode."""
    vocoders = [m for m in pipe.vocoder.modules() if isinstance(getattr(m, "upsamplers", None), torch.nn.ModuleList)]
    stages = [up for m in vocoders for up in m.upsamplers]
    hooks = []

    def saying(text: str | None) -> Callable[..., None]:
        def before(module: Any, args: Any) -> None:
            if stop():
                raise Interrupted(Interrupted.DEFAULT)
            if text:
                say(text)

        return before

    hooks.append(pipe.audio_vae.decoder.register_forward_pre_hook(saying("audio: decoding the sound (audio VAE)…")))
    hooks += [stage.register_forward_pre_hook(saying(f"audio: decoding the sound (vocoder stage {i}/{len(stages)})…"))
              for i, stage in enumerate(stages, 1)]
    hooks += [block.register_forward_pre_hook(saying(None)) for m in vocoders for block in m.resnets]
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()
