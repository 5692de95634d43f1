"""MiniMax H3 (issue 37), diffusers' modular pipeline through the same family declaration as FLUX 3: text to video
with sound (t2va), first / last frame (fl2va) and reference images (ref2va) through the pack's API, frames and
waveform equal to plain diffusers' MiniMaxH3ModularPipeline of each workflow; frame counts it cannot make, and
images it cannot take, refused before any worker starts."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from backend.controller import api
from backend.protocol.errors import ModelError, ParallelError, SampleError
from backend.protocol.spec import SampleRequest

FRAMES = 124  # 17·7 + 5: the shortest video the model makes (5.17 s at 24 fps)


def _request(**kw) -> SampleRequest:
    base = dict(prompt="a robot dancing", width=32, height=32, frames=FRAMES, steps=2, guidance=1.0, seed=5,
                batch_size=1)
    return SampleRequest(**{**base, **kw})


def _picture(seed: int, width: int = 32, height: int = 32) -> np.ndarray:
    return np.random.default_rng(seed).random((1, height, width, 3), dtype=np.float32)


def _pil(image: np.ndarray):
    import PIL.Image

    return PIL.Image.fromarray((image[0] * 255).round().astype(np.uint8))


def _plain(folder, workflow: str, req: SampleRequest, **inputs):
    from diffusers.modular_pipelines import ModularPipeline

    pipe = ModularPipeline.from_pretrained(str(folder), workflow=workflow)
    pipe.load_components(dtype=torch.float32)
    return pipe(prompt=req.prompt, height=32, width=32, num_frames=FRAMES, num_inference_steps=2,
                generator=torch.Generator("cpu").manual_seed(req.seed), output_type="np", **inputs)


def _equal(out: dict, state) -> None:
    frames, audio = out["images"], out["audio"]
    plain_audio = state.get("audio").float().numpy()
    assert frames.shape == (FRAMES, 32, 32, 3)
    assert np.abs(frames - np.asarray(state.get("videos"), dtype=np.float32)[0]).max() <= 1e-4
    assert audio.shape == plain_audio.shape == (1, 2, 41400)  # 207 audio latents x hop 200
    assert np.abs(audio - plain_audio).max() <= 1e-4
    assert int(out["audio_rate"][0]) == state.get("sampling_rate") == 8000  # the rate Sample Video gives ComfyUI


@pytest.mark.workers
def test_every_workflow_equals_plain_diffusers(tiny_models):
    """t2va, then fl2va (start and end frame; the end frame alone) on the loaded `transformer`, then ref2va, whose
    `transformer_ref` the worker loads when the first reference images come; each equal to diffusers' own
    workflow pipeline given the same pictures."""
    from diffusers.modular_pipelines.minimax_h3 import MiniMaxH3ImageReference

    folder = tiny_models / "tiny-minimax-h3"
    spec = api.make_spec("tiny-minimax-h3", [str(tiny_models)])
    req = _request()
    _equal(api.run_sample_outputs(api.prepare_sample(spec, req)), _plain(folder, "t2va", req))

    first, last = _picture(1), _picture(2, 48, 32)  # the end frame of another aspect: diffusers crops it
    prepared = api.prepare_sample(spec, req, first, end_image=last)
    assert any("end image (48x32)" in note for note in prepared.notes)
    _equal(api.run_sample_outputs(prepared), _plain(folder, "fl2va", req, image=_pil(first), last_image=_pil(last)))
    _equal(api.run_sample_outputs(api.prepare_sample(spec, req, end_image=last)),
           _plain(folder, "fl2va", req, last_image=_pil(last)))

    refs = np.concatenate([_picture(3, 64, 64), _picture(4, 64, 64)])
    prepared = api.prepare_sample(spec, req, references=refs)
    assert any("reference images (2, 64x64)" in note for note in prepared.notes)
    _equal(api.run_sample_outputs(prepared),
           _plain(folder, "ref2va", req, references=[MiniMaxH3ImageReference(_pil(r[None])) for r in refs]))


def _voice(seconds: float, rate: int = 8000, batch: int = 1) -> dict:
    """ComfyUI's AUDIO: a stereo 300 Hz / 450 Hz sine per sound (float32 [B, 2, S])."""
    t = np.arange(round(seconds * rate)) / rate
    wave = np.stack([np.stack([np.sin(2 * np.pi * (300 + 150 * c + 40 * b) * t) for c in range(2)])
                     for b in range(batch)]).astype(np.float32) * 0.4
    return {"waveform": torch.from_numpy(wave), "sample_rate": rate}


@pytest.mark.workers
def test_reference_audio_equals_plain_diffusers_audio_reference(tiny_models):
    """The prompt's <Audio 1>: Sample Video's reference_audio after its reference images, as diffusers' ref2va takes
    a MiniMaxH3AudioReference (a waveform at the audio VAE's rate: tiny-minimax-h3's 8 kHz), equal within 1e-4;
    the sound changes the video."""
    from diffusers.modular_pipelines.minimax_h3 import MiniMaxH3AudioReference, MiniMaxH3ImageReference

    folder, spec = tiny_models / "tiny-minimax-h3", api.make_spec("tiny-minimax-h3", [str(tiny_models)])
    req, refs, voice = _request(prompt="<Picture 1> sings <Audio 1>"), _picture(3, 64, 64), _voice(1.0)
    prepared = api.prepare_sample(spec, req, references=refs, reference_audio=voice)
    assert "reference_audio: 1 sound (1.00 s) for <Audio 1>." in prepared.notes
    out = api.run_sample_outputs(prepared)
    _equal(out, _plain(folder, "ref2va", req, references=[
        MiniMaxH3ImageReference(_pil(refs)), MiniMaxH3AudioReference(audio=voice["waveform"][0])]))
    without = api.run_sample_outputs(api.prepare_sample(spec, req, references=refs))
    # beyond the equality tolerance (the tiny model's sound changes by about 7e-4)
    assert np.abs(without["audio"] - out["audio"]).max() > 1e-4, "the reference sound changes the video's sound"


@pytest.mark.unit
def test_reference_audio_is_cut_resampled_or_refused_before_any_worker(tiny_models):
    spec = api.make_spec("tiny-minimax-h3", [str(tiny_models)])
    req, refs = _request(), _picture(3, 64, 64)
    long = api.prepare_sample(spec, req, references=refs, reference_audio=_voice(9.0, rate=16000, batch=2))
    assert ("reference_audio: 2 sounds (9.00 s) for <Audio 1>, <Audio 2>, cut to the video's 5.17 s, resampled "
            "from 16000 Hz to the model's 8000 Hz.") in long.notes
    assert long.arrays["reference_audio"].shape == (2, 2, 41334), "5.17 s at 8 kHz, resampled after the cut"
    for audio, refs_in, message in (
            (_voice(1.0), None, r"reference_audio: MiniMax H3 takes a reference sound only beside reference images"),
            (_voice(1.0, batch=4), refs, r"reference_audio: 4 sounds in its batch; MiniMax H3 takes at most 3"),
            ({"waveform": torch.full((1, 2, 800), float("nan")), "sample_rate": 8000}, refs,
             r"reference_audio: the waveform holds values that are not numbers"),
            ({"waveform": torch.zeros(1, 5, 800), "sample_rate": 8000}, refs,
             r"reference_audio: a waveform of shape \[1, 5, 800\]")):
        with pytest.raises(ModelError, match=message):
            api.prepare_sample(spec, req, references=refs_in, reference_audio=audio)
    with pytest.raises(ModelError, match=r"reference_audio: 'tiny-ltx2' \(LTX-2\) takes no reference sound; the "
                                         r"families that take one: MiniMax H3"):
        api.prepare_sample(api.make_spec("tiny-ltx2", [str(tiny_models)]),
                           _request(frames=9, width=64, height=64), reference_audio=_voice(0.4))


@pytest.mark.unit
@pytest.mark.parametrize(("inputs", "message"), [
    ({"references": np.zeros((10, 64, 64, 3), np.float32)}, r"reference_images: 10 images, .* at most 9"),
    ({"references": np.zeros((1, 64, 64, 3), np.float32), "image": np.zeros((1, 32, 32, 3), np.float32)},
     r"reference_images: MiniMax H3 .* not both"),
    ({"end_image": np.zeros((2, 3), np.float32)}, r"end_image: an IMAGE of shape \[2, 3\]"),
])
def test_images_it_cannot_take_are_refused(tiny_models, inputs, message):
    spec = api.make_spec("tiny-minimax-h3", [str(tiny_models)])
    image = inputs.pop("image", None)
    with pytest.raises(ModelError, match=message):
        api.prepare_sample(spec, _request(), image, **inputs)


@pytest.mark.unit
def test_a_video_model_without_them_refuses_end_and_reference_images(tiny_models):
    spec = api.make_spec("tiny-wan", [str(tiny_models)])
    req = _request(frames=9, width=32, height=32)
    with pytest.raises(ModelError, match=r"end_image: 'tiny-wan' .* takes no end image"):
        api.prepare_sample(spec, req, end_image=np.zeros((1, 32, 32, 3), np.float32))
    with pytest.raises(ModelError, match=r"reference_images: 'tiny-wan' .* takes no reference images"):
        api.prepare_sample(spec, req, references=np.zeros((1, 32, 32, 3), np.float32))


@pytest.mark.unit
@pytest.mark.parametrize(("frames", "fix"), [(125, "use 124 or 141"), (22, "use 124"), (362, "use 345")])
def test_frame_counts_it_cannot_make_are_refused(tiny_models, frames, fix):
    spec = api.make_spec("tiny-minimax-h3", [str(tiny_models)])
    with pytest.raises(ModelError, match=rf"frames: MiniMax H3 .*{fix}"):
        api.check_request(spec, _request(frames=frames))


@pytest.mark.unit
def test_one_step_is_refused_naming_its_schedulers_least(tiny_models):
    """diffusers' MiniMax H3 scheduler raises a bare ValueError below 2 steps; the pack refuses it first."""
    spec = api.make_spec("tiny-minimax-h3", [str(tiny_models)])
    with pytest.raises(SampleError, match=r"steps: 1 is too small for MiniMax H3 \(its scheduler takes at least 2\)"):
        api.check_request(spec, _request(steps=1))
    api.check_request(spec, _request(steps=2))


@pytest.mark.workers
def test_context_parallel_splits_the_packed_sequence_as_one_chip(tiny_models):
    """Context Parallel 2 by diffusers' own _cp_plan on two CPU workers (torch.distributed, gloo): the packed rows
    (11 prompt tokens + 414 sound rows + 37 video rows = 462) split at the first block; the frames and waveform
    equal plain diffusers within 1e-4, for t2va and for ref2va (its transformer_ref loaded later, split alike).
    A prompt one token longer makes 463 rows: refused at the first step, naming the rows and the fix."""
    from diffusers.modular_pipelines.minimax_h3 import MiniMaxH3ImageReference

    folder = tiny_models / "tiny-minimax-h3"
    spec, text = api.context_parallel(api.make_spec("tiny-minimax-h3", [str(tiny_models)]), 2)
    assert "packs the prompt's, the images', the sound's and the video's rows into one sequence" in text
    req = _request()
    _equal(api.run_sample_outputs(api.prepare_sample(spec, req)), _plain(folder, "t2va", req))
    refs = _picture(3, 64, 64)
    _equal(api.run_sample_outputs(api.prepare_sample(spec, req, references=refs)),
           _plain(folder, "ref2va", req, references=[MiniMaxH3ImageReference(_pil(refs))]))
    with pytest.raises(ParallelError, match=r"degree: Context Parallel 2 cannot split the 463 rows of the packed "
                                            r"sequence .* add or remove a word in the prompt"):
        api.run_sample_outputs(api.prepare_sample(spec, _request(prompt="a robot dancing!")))


def _comfy_lora(folder, path, seed: int = 0) -> None:
    """A LoRA in ComfyUI's MiniMax H3 names (the turbo LoRAs' layout: `diffusion_model.blocks.N.attn.qkv_proj`, the
    fused q, k and v; `attn.out_proj`, `mlp.fc1` / `fc2`), rank 4 with alpha 8 (alpha / rank = 2: a loader that
    ignores alpha is caught)."""
    import json

    from safetensors.torch import save_file

    config = json.loads((folder / "transformer" / "config.json").read_text())
    hidden, ffn, rank = config["hidden_size"], config["ffn_dim"], 4
    shapes = {"attn.qkv_proj": (3 * hidden, hidden), "attn.out_proj": (hidden, hidden), "mlp.fc1": (2 * ffn, hidden),
              "mlp.fc2": (hidden, ffn)}
    g, sd = torch.Generator().manual_seed(seed), {}
    for block in range(config["num_layers"]):
        for name, (out, inp) in shapes.items():
            key = f"diffusion_model.blocks.{block}.{name}"
            sd[f"{key}.lora_down.weight"] = torch.randn(rank, inp, generator=g) * 0.3
            sd[f"{key}.lora_up.weight"] = torch.randn(out, rank, generator=g) * 0.3
            sd[f"{key}.alpha"] = torch.tensor(8.0)
    save_file(sd, str(path))


@pytest.mark.workers
def test_a_comfyui_lora_equals_diffusers_own_load_and_fuse(tiny_models, tmp_path):
    """A turbo-style LoRA in ComfyUI's names through Load LoRA's path (api.with_lora: diffusers' own
    load_lora_weights reads it, the worker writes it into the weights) on first / last frame to video, then on
    reference images to video: frames and waveform equal diffusers' MiniMaxH3ModularPipeline after its own
    load_lora_weights + fuse_lora."""
    from diffusers.modular_pipelines import ModularPipeline
    from diffusers.modular_pipelines.minimax_h3 import MiniMaxH3ImageReference

    folder = tiny_models / "tiny-minimax-h3"
    lora = tmp_path / "minimax_h3_fl2v_turbo_8step_tiny_comfyui.safetensors"
    _comfy_lora(folder, lora)
    spec, _ = api.with_lora(api.make_spec("tiny-minimax-h3", [str(tiny_models)]), str(lora), 0.8)
    req, first = _request(), _picture(1)
    out = api.run_sample_outputs(api.prepare_sample(spec, req, first))
    plain = ModularPipeline.from_pretrained(str(folder), workflow="fl2va")
    plain.load_components(dtype=torch.float32)
    plain.load_lora_weights(str(lora))
    plain.fuse_lora(lora_scale=0.8)
    state = plain(prompt=req.prompt, height=32, width=32, num_frames=FRAMES, num_inference_steps=2, image=_pil(first),
                  generator=torch.Generator("cpu").manual_seed(req.seed), output_type="np")
    _equal(out, state)
    without = api.run_sample_outputs(api.prepare_sample(api.make_spec("tiny-minimax-h3", [str(tiny_models)]), req,
                                                        first))
    assert np.abs(without["images"] - out["images"]).max() > 1e-3  # the LoRA changed the video
    # reference images: the worker loads transformer_ref, and the LoRA goes onto it too (as ComfyUI's Load LoRA onto
    # the ref2va file), equal to diffusers' load_lora_weights(load_into_transformer_ref=True) + fuse_lora
    refs = _picture(3, 64, 64)
    out = api.run_sample_outputs(api.prepare_sample(spec, req, references=refs))
    plain = ModularPipeline.from_pretrained(str(folder), workflow="ref2va")
    plain.load_components(dtype=torch.float32)
    plain.load_lora_weights(str(lora), load_into_transformer_ref=True)
    plain.fuse_lora(lora_scale=0.8)
    _equal(out, plain(prompt=req.prompt, height=32, width=32, num_frames=FRAMES, num_inference_steps=2,
                      references=[MiniMaxH3ImageReference(_pil(refs))],
                      generator=torch.Generator("cpu").manual_seed(req.seed), output_type="np"))
