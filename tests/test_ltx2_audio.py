"""LTX-2 image + audio to video through the workers (Sample Video's AUDIO in): frames and waveform equal plain
diffusers' LTX2ConditionPipeline driven the same way (the start image as the frame-0 condition; the sound's
log-mel, computed here by transformers' own numpy spectrogram, encoded by the audio VAE as audio_latents, held
clean by an audio scheduler at timestep 0 and no noise on them), within 1e-4; and the AUDIO checks, each before
any worker starts: the wrong family, the wrong rate (resampled, as ComfyUI does), too short or too long for the
frames, not numbers, a memory bomb; and Cancel during the sound's decode, which says what it decodes."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from backend.controller import api, sound_input
from backend.families.ltx2 import OFF
from backend.protocol.errors import Interrupted, ModelError
from backend.protocol.messages import Status
from backend.protocol.spec import SampleRequest

TOLERANCE = 1e-4
FOX = "a red fox in the snow"
# tiny-ltx2's smallest video: 64x64, 9 frames at 25 fps = 0.36 s; its audio VAE works at 16 kHz, hop 160
LTX = dict(prompt=FOX, negative_prompt="blurry", width=64, height=64, frames=9, steps=2, guidance=3.0, seed=11,
           frame_rate=25.0)
RATE, HOP = 16000, 160


def _request(**kw) -> SampleRequest:
    return SampleRequest(**{**LTX, **kw})


def _spec(tiny_models, name="tiny-ltx2"):
    return api.make_spec(name, [str(tiny_models)])


def _sound(seconds: float, rate: int = RATE, batch: int = 2, channels: int = 2) -> dict:
    """ComfyUI's AUDIO: a 220 Hz / 330 Hz sine per video, as Load Audio gives it (float32 [B, C, S])."""
    t = np.arange(round(seconds * rate)) / rate
    wave = np.stack([np.stack([np.sin(2 * np.pi * (220 + 110 * b + 55 * c) * t) for c in range(channels)])
                     for b in range(batch)]).astype(np.float32) * 0.5
    return {"waveform": torch.from_numpy(wave), "sample_rate": rate}


def _start_images() -> np.ndarray:
    return (np.random.default_rng(5).integers(0, 256, (2, 64, 64, 3)) / 255).astype(np.float32)


def _held_pipe(tiny_models):
    """Plain diffusers' LTX2ConditionPipeline driven to keep a sound (its audio latents get no noise; an audio
    scheduler at timestep 0 whose step returns the sample), and the sound's latents as ComfyUI encodes them (the
    log-mel by transformers' own numpy spectrogram, the audio VAE's posterior mode)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, LTX2ConditionPipeline
    from transformers.audio_utils import mel_filter_bank, spectrogram, window_function

    pipe = LTX2ConditionPipeline.from_pretrained(str(tiny_models / "tiny-ltx2"), dtype=torch.float32,
                                                 local_files_only=True)
    pipe.set_progress_bar_config(disable=True)

    class Held(FlowMatchEulerDiscreteScheduler):  # the audio kept: timesteps 0, step returns the sample
        def set_timesteps(self, num_inference_steps=None, device=None, sigmas=None, mu=None, timesteps=None):
            super().set_timesteps(num_inference_steps, device, sigmas, mu, timesteps)
            self.timesteps, self.sigmas = torch.zeros_like(self.timesteps), torch.ones_like(self.sigmas)

        def step(self, out, t, sample, return_dict=True, **k):
            return (sample,)

    prepare = pipe.prepare_audio_latents
    pipe.prepare_audio_latents = lambda *a, **k: prepare(*a, **{**k, "noise_scale": 0.0})
    pipe.audio_scheduler = Held.from_config(pipe.scheduler.config)
    n_fft, mels = 1024, pipe.audio_vae.config.mel_bins
    bank = mel_filter_bank(num_frequency_bins=n_fft // 2 + 1, num_mel_filters=mels, min_frequency=0.0,
                           max_frequency=RATE / 2, sampling_rate=RATE, norm=None, mel_scale="htk")

    def encode(wave: np.ndarray) -> torch.Tensor:
        mel = np.stack([spectrogram(ch, window_function(n_fft, "hann"), frame_length=n_fft, hop_length=HOP,
                                    power=1.0, center=True, pad_mode="reflect", mel_filters=bank, mel_floor=1e-5,
                                    log_mel=None) for ch in wave])  # [C, mels, T]
        mel = torch.from_numpy(np.log(np.maximum(mel, 1e-5)).astype(np.float32)).permute(0, 2, 1)[None]
        with torch.inference_mode():
            return pipe.audio_vae.encode(mel).latent_dist.mode()

    return pipe, encode


def _plain(tiny_models, starts: np.ndarray, waves: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Plain diffusers' LTX2ConditionPipeline for seeds 11 and 12, start image i and waveform i (at the VAE's rate,
    the length the controller cuts it to): each video's frames and waveform."""
    from diffusers.pipelines.ltx2 import LTX2VideoCondition
    from PIL import Image

    pipe, encode = _held_pipe(tiny_models)
    out = []
    for i, seed in enumerate((11, 12)):
        image = Image.fromarray((starts[i] * 255).round().astype(np.uint8))
        latents = encode(waves[i])
        with torch.inference_mode():
            result = pipe(conditions=[LTX2VideoCondition(frames=image, index=0, strength=1.0)], prompt=FOX,
                          negative_prompt="blurry", height=64, width=64, num_frames=9, frame_rate=25.0,
                          num_inference_steps=2, guidance_scale=3.0, output_type="np", audio_latents=latents,
                          generator=[torch.Generator("cpu").manual_seed(seed)],
                          **dict(OFF, audio_guidance_scale=3.0))
            kept = pipe.vocoder(pipe.audio_vae.decode(latents, return_dict=False)[0])  # the sound, decoded as is
        assert torch.allclose(result.audio, kept, atol=1e-6), "plain diffusers keeps the sound too"
        out.append((result.frames[0], result.audio[0].numpy()))
    return out


@pytest.mark.workers
def test_image_and_audio_to_video_equals_plain_diffusers_and_keeps_the_sound(tiny_models):
    req, starts, audio = _request(batch_size=2), _start_images(), _sound(0.36)
    prepared = api.prepare_sample(_spec(tiny_models), req, starts, audio=audio)
    waves = prepared.arrays["audio"]
    assert waves.shape == (2, 2, (4 * 9 - 4) * HOP + 2 * HOP), "cut to the 9 audio latents 9 frames at 25 fps take"
    said = []
    out = api.run_sample_outputs(prepared, lambda m: said.append(m.text) if isinstance(m, Status) else None)
    assert out["images"].shape == (18, 64, 64, 3) and out["audio"].shape[:2] == (2, 2)
    for video, (frames, wave) in enumerate(_plain(tiny_models, starts, waves)):
        assert np.abs(out["images"][9 * video:9 * (video + 1)] - frames).max() <= TOLERANCE, f"video {video}"
        assert np.abs(out["audio"][video] - wave).max() <= TOLERANCE, f"video {video}'s sound"
    assert not np.array_equal(out["audio"][0], out["audio"][1]), "each video its own sound"
    assert "audio: decoding the sound (audio VAE)…" in said and "audio: decoding the sound (vocoder stage 2/2)…" in said

    # the same sound at 48 kHz is resampled to the VAE's 16 kHz (libswresample), as ComfyUI's encoder does
    resampled = api.prepare_sample(_spec(tiny_models), req, starts, audio=_sound(0.36, rate=48000))
    assert "audio: the video is made to this sound, which it keeps, resampled from 48000 Hz to the model's 16000 " \
           "Hz." in resampled.notes
    high = resampled.arrays["audio"]
    assert high.shape == waves.shape and np.abs(high - waves)[:, :, 200:-200].max() < 0.02
    # mono is used on both channels
    mono = api.prepare_sample(_spec(tiny_models), req, starts, audio=_sound(0.36, channels=1)).arrays["audio"]
    assert mono.shape == (2, 1, waves.shape[2])


@pytest.mark.workers
@pytest.mark.parametrize("rate, latents", [(25.0, 9), (22.0, 10)])
def test_image_and_audio_to_video_under_context_parallel_equals_one_worker(tiny_models, rate, latents):
    """Context Parallel 2 (families/ltx2/cp.py's plan) splits the video's tokens (8 at 9 frames, 64x64) and the
    kept sound's latents where they split as a made one's: at 25 fps, the templates' rate, the sound's 9 audio
    latents stay whole on every rank (the Sample's notes say so), at 22 fps its 10 are split; frames and waveform
    within TOLERANCE of one worker (LTX2ConditionPipeline, a timestep per video token)."""
    req, starts, audio = _request(batch_size=2, frame_rate=rate), _start_images(), _sound(9 / rate)
    one = api.run_sample_outputs(api.prepare_sample(_spec(tiny_models), req, starts, audio=audio))
    cp, _ = api.context_parallel(_spec(tiny_models), 2)
    prepared = api.prepare_sample(cp, req, starts, audio=audio)
    whole = [n for n in prepared.notes if "so the sound runs whole on every rank" in n]
    assert whole == ([f"Context Parallel 2: 9 frames at 25 fps make {latents} audio latents, which 2 ranks cannot "
                      "split evenly, so the sound runs whole on every rank (its attention repeated on each; the "
                      "video's tokens are split); the result is the same as on one rank."] if latents % 2 else [])
    out = api.run_sample_outputs(prepared)
    assert [e["denoiser"]["context_parallel"] for e in (w["experts"] for w in api.worker_info())] == [True] * 2
    for key in ("images", "audio"):
        assert out[key].shape == one[key].shape and np.abs(out[key] - one[key]).max() <= TOLERANCE, key


@pytest.mark.workers
def test_image_and_audio_to_video_under_cfg_parallel_and_model_offload_equals_one_worker(tiny_models):
    """CFG Parallel (2 ranks) splits the negative and positive passes of LTX2ConditionPipeline (its transformer is
    the loaded one's, shared by from_pipe); offload 'model' moves the audio VAE onto the device for the sound's
    encode through diffusers' own hook on encode: frames and sound within 1e-4 of one worker without offload."""
    req, starts, audio = _request(), _start_images()[:1], _sound(0.36, batch=1)
    one = api.run_sample_outputs(api.prepare_sample(_spec(tiny_models), req, starts, audio=audio))
    said = []
    split = api.cfg_parallel(_spec(tiny_models))[0]
    out = api.run_sample_outputs(api.prepare_sample(split, req, starts, audio=audio),
                                 lambda m: said.append(m.text) if isinstance(m, Status) else None)
    assert not [t for t in said if t.startswith("CFG Parallel: this Sample runs one")], "the passes were split"
    assert all(w["cfg_exchanges"] > 0 for w in api.worker_info()), "both ranks exchanged their halves"
    offloaded = api.make_spec("tiny-ltx2", [str(tiny_models)], offload="model")
    moved = api.run_sample_outputs(api.prepare_sample(offloaded, req, starts, audio=audio))
    assert api.worker_info()[0]["offload"] == "model"
    for key in ("images", "audio"):
        assert np.abs(out[key] - one[key]).max() <= TOLERANCE, f"CFG Parallel: {key}"
        assert np.abs(moved[key] - one[key]).max() <= TOLERANCE, f"offload model: {key}"


@pytest.mark.workers
def test_compiled_start_image_and_image_and_audio_compile_once_and_never_again(tiny_models):
    """The text-to-video warm-up does not build the graphs of a start image (LTX2ImageToVideoPipeline) or of image +
    audio (LTX2ConditionPipeline): their denoiser sees a timestep per token. Each compiles once, announced, and
    other seeds, prompts and steps reuse it (0 unexpected recompiles); the frames and sound are the eager ones."""
    from backend.protocol.messages import Step

    spec, _ = api.with_compile(_spec(tiny_models), "whole denoiser", "eager", "64x64x9f", False)
    warm = api.load(spec)["compile"]
    assert warm["unexpected_recompiles"] == 0
    starts, audio = _start_images()[:1], _sound(0.36, batch=1)
    for sound, task in ((None, "start image"), (audio, "image + audio")):
        said = []
        api.run_sample_outputs(api.prepare_sample(spec, _request(), starts, audio=sound),
                               lambda m, said=said: said.append(m.text) if isinstance(m, Status) else None)
        assert f"compiling 64x64x9 frames (batch 1, CFG, 9 audio latents, {task}) for the first time…" in said, said
        first = api.compile_stats()
        assert first["unexpected_recompiles"] == 0, said
        for change in (dict(seed=4, steps=3), dict(prompt="a lighthouse on a cliff at dusk, oil painting", seed=2)):
            steps = []
            last = api.run_sample_outputs(api.prepare_sample(spec, _request(**change), starts, audio=sound),
                                          lambda m, steps=steps: steps.append(m) if isinstance(m, Step) else None)
            assert [m.step for m in steps] == list(range(1, change.get("steps", 2) + 1))
        stats = api.compile_stats()
        assert (stats["compiles"], stats["graphs"], stats["unexpected_recompiles"]) == (
            first["compiles"], first["graphs"], 0), task
        eager = api.run_sample_outputs(api.prepare_sample(_spec(tiny_models), _request(**change), starts, audio=sound))
        for key in ("images", "audio"):
            assert np.abs(last[key] - eager[key]).max() <= TOLERANCE, f"{task}: {key}"


@pytest.mark.unit
@pytest.mark.parametrize("name, encoder", [("tiny-ltx2", "gemma3"), ("tiny-ltx25", "gemma4_unified")])
def test_sequential_offload_is_refused_before_any_worker_naming_the_gemma_text_encoder(tiny_models, monkeypatch,
                                                                                       name, encoder):
    """accelerate's layer hooks fail on the Gemma text encoders' tied embeddings (plain diffusers too): chosen, or
    picked by offload 'auto' on a device too small even for the transformer, it is refused with the way out."""
    from backend.controller import offload

    message = (rf"offload: sequential offload cannot run LTX-2's {encoder} text encoder: .*tied embedding weights.*"
               r"Choose offload 'model'.*float8_e4m3fn")
    with pytest.raises(ModelError, match=message):
        api.prepare_sample(api.make_spec(name, [str(tiny_models)], offload="sequential"), _request(),
                           _start_images()[:1], audio=_sound(0.36, batch=1))
    auto = api.make_spec(name, [str(tiny_models)], offload="auto").with_changes(kind="tpu")
    monkeypatch.setattr(offload.devices, "device_memory_bytes", lambda kind: 1024)
    assert offload.choose_offload(auto).mode == "sequential"
    with pytest.raises(ModelError, match=message):
        offload.resolve_offload(auto)
    assert api.make_spec(name, [str(tiny_models)], offload="model").offload == "model"


@pytest.mark.workers
def test_image_and_audio_to_video_in_two_stages_equals_plain_diffusers(tiny_models, tmp_path):
    """The ia2v template's two stages with the sound kept: LTX2ConditionPipeline at half size (the start image as
    its frame-0 condition, the held sound), LTX2LatentUpsamplePipeline, then the same pipeline at full size on
    the stage-2 sigmas with stage 1's (still the input's) audio latents; frames and sound within 1e-4 of plain
    diffusers run so, and the sound is the one-stage run's (the input's, decoded)."""
    import json

    from diffusers import FlowMatchEulerDiscreteScheduler
    from diffusers.pipelines.ltx2 import (
        LTX2LatentUpsamplePipeline,
        LTX2LatentUpsamplerModel,
        LTX2VideoCondition,
    )
    from PIL import Image
    from safetensors import safe_open
    from safetensors.torch import load_file

    from backend.families.ltx2 import two_stage
    from backend.families.ltx2.tiny import upsampler

    path = str(upsampler(tmp_path / "ltx-2.3-spatial-upscaler-x2-tiny.safetensors"))
    sigmas, starts = two_stage.TEMPLATE_SIGMAS, (np.random.default_rng(5).integers(0, 256, (1, 128, 128, 3)) / 255
                                                 ).astype(np.float32)
    req = _request(width=128, height=128, upscale_model=path, upscale_sigmas=sigmas)
    prepared = api.prepare_sample(_spec(tiny_models), req, starts, audio=_sound(0.36, batch=1))
    out = api.run_sample_outputs(prepared)
    assert out["images"].shape == (9, 128, 128, 3)

    pipe, encode = _held_pipe(tiny_models)
    with safe_open(path, "pt") as f:
        model = LTX2LatentUpsamplerModel(**json.loads(f.metadata()["config"]))
    model.load_state_dict(load_file(path))
    up = LTX2LatentUpsamplePipeline(vae=pipe.vae, latent_upsampler=model.eval())
    conditions = [LTX2VideoCondition(frames=Image.fromarray((starts[0] * 255).round().astype(np.uint8)), index=0,
                                     strength=1.0)]
    call = dict(OFF, prompt=FOX, negative_prompt="blurry", num_frames=9, frame_rate=25.0, guidance_scale=3.0,
                audio_guidance_scale=3.0, conditions=conditions)
    generator = [torch.Generator("cpu").manual_seed(11)]
    with torch.inference_mode():
        latents = encode(prepared.arrays["audio"][0])
        first = pipe(height=64, width=64, num_inference_steps=2, output_type="latent", audio_latents=latents,
                     generator=generator, **call)
        video = up(latents=first.frames, height=64, width=64, num_frames=9, output_type="latent",
                   return_dict=False)[0]
        pipe.scheduler = FlowMatchEulerDiscreteScheduler.from_config(pipe.scheduler.config,
                                                                     use_dynamic_shifting=False, shift_terminal=None)
        plain = pipe(height=128, width=128, latents=video, audio_latents=first.audio, sigmas=list(sigmas),
                     num_inference_steps=len(sigmas), noise_scale=sigmas[0], output_type="np", generator=generator,
                     **call)
    assert np.abs(out["images"] - plain.frames[0]).max() <= TOLERANCE
    assert np.abs(out["audio"][0] - plain.audio[0].numpy()).max() <= TOLERANCE
    one = api.run_sample_outputs(api.prepare_sample(_spec(tiny_models), _request(), starts[:, ::2, ::2],
                                                    audio=_sound(0.36, batch=1)))
    assert np.abs(out["audio"] - one["audio"]).max() <= TOLERANCE, "the input's sound, kept through both stages"


def _wide_vocoder_model(tiny_models, folder):
    """tiny-ltx2 with a vocoder of a real one's width (1024 channels, LTX-2's; random weights) and four residual
    blocks a stage: its decode of a 4 s sound takes seconds, as a real one does, where tiny-ltx2's takes
    milliseconds, so a Cancel can arrive while it runs."""
    import json

    from diffusers.pipelines.ltx2 import LTX2Vocoder

    model = folder / "tiny-ltx2"
    model.mkdir()
    for part in (tiny_models / "tiny-ltx2").iterdir():
        if part.name != "vocoder":
            (model / part.name).symlink_to(part)
    config = json.loads((tiny_models / "tiny-ltx2" / "vocoder" / "config.json").read_text())
    config = {k: v for k, v in config.items() if not k.startswith("_")}
    torch.manual_seed(0)
    LTX2Vocoder(**{**config, "hidden_channels": 1024, "resnet_kernel_sizes": [3] * 4,
                   "resnet_dilations": [[1, 3, 5]] * 4}).save_pretrained(str(model / "vocoder"))
    return folder


@pytest.mark.workers
def test_cancel_during_the_sounds_decode_ends_within_seconds_and_says_so(tiny_models, tmp_path):
    spec, stop, said = api.make_spec("tiny-ltx2", [str(_wide_vocoder_model(tiny_models, tmp_path))]), \
        threading.Event(), []

    def on_progress(msg):
        if isinstance(msg, Status):
            said.append(msg.text)
            if msg.text.startswith("audio: decoding the sound (vocoder stage 1/2)"):
                stop.set()

    request = _request(frames=97)  # 3.88 s of sound
    started = time.monotonic()
    with pytest.raises(Interrupted):
        api.run_sample_outputs(api.prepare_sample(spec, request, _start_images()[:1], audio=_sound(3.88, batch=1)),
                               on_progress, stop.is_set)
    assert time.monotonic() - started < 30
    assert said.index("audio: decoding the sound (audio VAE)…") < said.index(
        "audio: decoding the sound (vocoder stage 1/2)…")
    out = api.run_sample_outputs(api.prepare_sample(spec, _request(), audio=_sound(0.36, batch=1)))
    assert out["images"].shape == (9, 64, 64, 3), "the next video runs (audio to video without a start image)"


@pytest.mark.unit
@pytest.mark.parametrize("audio, message", [
    (_sound(0.2), r"audio: the sound lasts 0\.20 s, too short for 9 frames at 25 fps \(0\.36 s\).*Give a longer "
                  r"sound, or set frames to 1\b"),
    (_sound(3.0), r"audio: the sound lasts 3\.00 s, too long for 9 frames at 25 fps \(0\.36 s\).*Trim it to 0\.36 s "
                  r"\(ComfyUI's Trim Audio Duration\), or set frames to 73 "),
    ({"waveform": torch.full((1, 2, 6000), float("nan")), "sample_rate": RATE}, r"audio: the waveform holds values "
                                                                                 r"that are not numbers"),
    ({"waveform": torch.zeros(1, 6, 6000), "sample_rate": RATE}, r"audio: a waveform of shape \[1, 6, 6000\]"),
    ({"waveform": torch.zeros(1, 2, 6000), "sample_rate": 0}, r"audio: sample_rate 0 is not a number of samples"),
    ({"waveform": torch.zeros(1, 2, 6000)}, r"audio: dict is not ComfyUI's AUDIO"),
])
def test_bad_audio_is_refused_before_any_worker_naming_the_value_and_the_fix(tiny_models, audio, message):
    with pytest.raises(ModelError, match=message):
        api.prepare_sample(_spec(tiny_models), _request(), audio=audio)


@pytest.mark.unit
def test_audio_into_a_family_without_sound_in_and_a_memory_bomb_are_refused(tiny_models):
    assert sound_input.audio_families() == "LTX-2"
    with pytest.raises(ModelError, match=r"audio: 'tiny-wan' \(Wan\) takes no sound in \(image \+ audio to "
                                         r"video\); the families that take one: LTX-2\. Disconnect the audio"):
        api.prepare_sample(_spec(tiny_models, "tiny-wan"), SampleRequest(prompt=FOX, width=32, height=32, frames=5,
                                                                         steps=2), audio=_sound(0.3))
    with pytest.raises(ModelError, match=r"audio: a video of 1 frames at 25 fps is too short to take a sound"):
        api.prepare_sample(_spec(tiny_models), _request(frames=1), audio=_sound(0.04))
    with pytest.raises(ModelError, match=r"steps: 1 with an audio input is too few: image \+ audio to video runs "
                                         r"diffusers' LTX2ConditionPipeline, which takes at least 2 steps"):
        api.prepare_sample(_spec(tiny_models), _request(steps=1), audio=_sound(0.36))
    api.prepare_sample(_spec(tiny_models), _request(), audio=_sound(0.36))  # (the first call reads the folder)
    hour = {"waveform": torch.zeros(1, 2, 3600 * 44100), "sample_rate": 44100}
    started = time.monotonic()
    with pytest.raises(ModelError, match=r"audio: the sound lasts 3600\.00 s, too long"):
        api.prepare_sample(_spec(tiny_models), _request(), audio=hour)
    assert time.monotonic() - started < 2, "an hour of sound is measured, never resampled"
    # 64 videos of 1017 frames at 1024x1024 with a sound as long: the output bound refuses it, before the sound is
    # touched
    started = time.monotonic()
    with pytest.raises(ModelError, match=r"batch_size, frames, width/height: 64 videos of 1024x1024 × 1017 frames"):
        api.prepare_sample(_spec(tiny_models), _request(width=1024, height=1024, frames=1017, batch_size=64),
                           audio={"waveform": torch.zeros(1, 1, 1017 * 320), "sample_rate": 8000})
    assert time.monotonic() - started < 2


@pytest.mark.unit
def test_the_sounds_decode_says_each_piece_and_stops_between_them(tiny_models):
    """tiny-ltx2's audio VAE and vocoder in this process, as the worker wraps them: the audio VAE's decode and each
    vocoder stage are said, Cancel is seen before the next piece, and the sound is the plain decode's."""
    from types import SimpleNamespace

    from diffusers import AutoencoderKLLTX2Audio
    from diffusers.pipelines.ltx2 import LTX2Vocoder

    from backend.families.ltx2 import audio

    folder = tiny_models / "tiny-ltx2"
    pipe = SimpleNamespace(audio_vae=AutoencoderKLLTX2Audio.from_pretrained(str(folder / "audio_vae")).eval(),
                           vocoder=LTX2Vocoder.from_pretrained(str(folder / "vocoder")).eval())
    z = torch.randn(1, 2, 9, 4, generator=torch.Generator().manual_seed(0))
    said: list[str] = []

    def decode() -> torch.Tensor:
        return pipe.vocoder(pipe.audio_vae.decode(z, return_dict=False)[0])

    with torch.inference_mode():
        plain = decode()
        with audio.decode_progress(pipe, said.append, lambda: False):
            assert torch.equal(decode(), plain)
        assert said == ["audio: decoding the sound (audio VAE)…", "audio: decoding the sound (vocoder stage 1/2)…",
                        "audio: decoding the sound (vocoder stage 2/2)…"]
        said.clear()
        with audio.decode_progress(pipe, said.append, lambda: bool(said)), pytest.raises(Interrupted):
            decode()
        assert said == ["audio: decoding the sound (audio VAE)…"], "Cancel is seen before the vocoder"
    assert not pipe.vocoder.upsamplers[0]._forward_pre_hooks and not pipe.audio_vae.decoder._forward_pre_hooks
