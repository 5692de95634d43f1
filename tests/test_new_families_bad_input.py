"""Issue 34's last part: the 2026 families (Qwen-Image 2.1, Krea 2, Ideogram 4, FLUX 3 [klein], LTX-2, MiniMax H3)
and ComfyUI's quantized files under a careless or hostile artist's input, each refused before any worker starts
with the pack's error naming the input, the value and the fix (the cases that were holes), or taken as ComfyUI
takes it: Sample Video's AUDIO (LTX-2) and reference_audio (MiniMax H3) at rates no sound has, integer or
overloud samples, batches that do not match the videos, a tensor without data; the sound counted in the output
bound; LTX-2's sides below what its VAE decodes and stage-2 sigmas that are not numbers; a MiniMax H3 reference
image beyond 4:1; a Qwen3-VL text encoder of the width but too few layers; a quantized layer whose comfy_quant
marker names another format than its bytes hold; and, as a compact table, what held. The cases that held before
(bad audio, an hour of sound, memory bombs, wrong-family files) are tests/test_ltx2_audio.py, test_minimax_h3.py,
test_files.py and test_quantized.py."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import torch

from backend.controller import api, devices, group, pixels, sound_input
from backend.protocol.errors import InputError, ModelError
from backend.protocol.spec import SampleRequest

LTX = dict(prompt="a red fox in the snow", negative_prompt="blurry", width=64, height=64, frames=9, steps=2,
           guidance=3.0, seed=11, frame_rate=25.0)  # tiny-ltx2: 0.36 s of sound at its audio VAE's 16 kHz
MINIMAX = dict(prompt="<Picture 1> sings <Audio 1>", width=32, height=32, frames=124, steps=2, guidance=1.0, seed=5)


def _sine(seconds: float, rate: int, batch: int = 1, channels: int = 2) -> np.ndarray:
    t = np.arange(round(seconds * rate)) / rate
    return np.stack([np.stack([np.sin(2 * np.pi * (220 + 40 * b + 55 * c) * t) for c in range(channels)])
                     for b in range(batch)]).astype(np.float32) * 0.5


def _audio(wave, rate: int) -> dict:
    return {"waveform": torch.as_tensor(wave) if isinstance(wave, np.ndarray) else wave, "sample_rate": rate}


def _ltx(tiny_models, name: str = "tiny-ltx2"):
    return api.make_spec(name, [str(tiny_models)])


def _minimax(tiny_models):
    return api.make_spec("tiny-minimax-h3", [str(tiny_models)])


def _no_worker(monkeypatch) -> None:
    monkeypatch.setattr(group, "run", lambda *a, **k: pytest.fail("a worker group was asked"))


def _references() -> np.ndarray:
    return np.random.default_rng(3).random((1, 64, 64, 3), dtype=np.float32)


def _prepare(tiny_models, slot: str, audio: dict, **request):
    """Sample Video's `audio` on LTX-2 or `reference_audio` (beside a reference image) on MiniMax H3."""
    if slot == "audio":
        return api.prepare_sample(_ltx(tiny_models), SampleRequest(**{**LTX, **request}), audio=audio)
    return api.prepare_sample(_minimax(tiny_models), SampleRequest(**{**MINIMAX, **request}), references=_references(),
                              reference_audio=audio)


SOUNDS = {  # were: libswresample gave nothing (ValueError: need at least one array to concatenate), a raw torch
    # NotImplementedError, noise from unscaled bytes, or (MiniMax H3) NaN frames blamed on the model's weights
    "10 Hz": (lambda: _audio(np.zeros((1, 2, 4), np.float32), 10),
              r"sample_rate 10 is not a number of samples a second between 1000 and 768000"),
    "1 Hz": (lambda: _audio(np.zeros((1, 2, 8), np.float32), 1), r"sample_rate 1 is not .* between 1000 and"),
    "8-bit unsigned samples": (lambda: _audio(np.full((1, 2, 8000), 200, np.uint8), 16000),
                               r"the waveform holds uint8 samples.*convert it to float32 within -1\.\.1"),
    "16-bit samples stored as floats": (lambda: _audio(_sine(0.5, 16000) * 32767, 16000),
                                        r"the waveform's peak is 1\.64e\+04.*-1\.\.1.*divide 16-bit ones by 32768"),
    "a peak of 1e30": (lambda: _audio(np.full((1, 2, 8000), 1e30, np.float32), 16000),
                       r"the waveform's peak is 1e\+30, where ComfyUI's AUDIO holds float samples within -1\.\.1"),
    "a tensor with no data": (lambda: _audio(torch.zeros(1, 2, 8000, device="meta"), 16000),
                              r"the waveform is a tensor on the 'meta' device, which holds no samples"),
}


@pytest.mark.unit
@pytest.mark.parametrize("slot", ["audio", "reference_audio"])
@pytest.mark.parametrize("case", sorted(SOUNDS))
def test_a_sound_no_model_can_hear_is_refused_before_any_worker_naming_it(tiny_models, monkeypatch, slot, case):
    _no_worker(monkeypatch)
    make, message = SOUNDS[case]
    started = time.monotonic()
    with pytest.raises(ModelError, match=rf"^{slot}: {message}"):
        _prepare(tiny_models, slot, make())
    assert time.monotonic() - started < 2
    assert _prepare(tiny_models, slot, _audio(_sine(0.36, 16000), 16000)).arrays[slot].dtype == np.float32


@pytest.mark.unit
@pytest.mark.parametrize("slot", ["audio", "reference_audio"])
def test_integer_samples_are_scaled_as_comfyuis_load_audio_does(tiny_models, slot):
    """int16 and int32 samples (a third-party node's, or Load Audio's own before it scales them) are the float
    sound at 1/2^15 and 1/2^31 (ComfyUI's f32_pcm), not samples 32767 loud; float64, a non-contiguous view and a
    2-D [channels, samples] waveform are the float32 sound."""
    wave = _sine(0.36, 16000)
    plain = _prepare(tiny_models, slot, _audio(wave, 16000)).arrays[slot]
    for label, other in (("int16", np.round(wave * 2**15).astype(np.int16)),
                         ("int32", np.round(wave.astype(np.float64) * 2**31).astype(np.int32)),
                         ("float64", wave.astype(np.float64)),
                         ("non-contiguous", np.ascontiguousarray(wave.transpose(0, 2, 1)).transpose(0, 2, 1)),
                         ("2-D", wave[0])):
        got = _prepare(tiny_models, slot, _audio(other, 16000)).arrays[slot]
        assert got.shape == plain.shape and np.abs(got - plain).max() < 1e-4, label


@pytest.mark.unit
def test_a_batch_of_sounds_that_is_not_the_videos_is_said_and_only_the_used_ones_are_sent(tiny_models):
    """Video i takes sound i, cycling (as start images do): more sounds than videos leave some unused, fewer are
    reused; the note says which, and the sounds no video takes never travel to the workers."""
    one = api.prepare_sample(_ltx(tiny_models), SampleRequest(**LTX), audio=_audio(_sine(0.36, 16000, batch=3), 16000))
    assert one.arrays["audio"].shape[0] == 1
    assert ("audio: the video is made to this sound, which it keeps. 3 sounds for 1 video: video i takes sound i; "
            "sounds 2 to 3 are not used.") in one.notes
    two = api.prepare_sample(_ltx(tiny_models), SampleRequest(**{**LTX, "batch_size": 2}),
                             audio=_audio(_sine(0.36, 16000), 16000))
    assert two.arrays["audio"].shape[0] == 1
    assert ("audio: the video is made to this sound, which it keeps. 1 sound for 2 videos: video i takes sound i "
            "(cycling: i mod 1).") in two.notes
    same = api.prepare_sample(_ltx(tiny_models), SampleRequest(**{**LTX, "batch_size": 2}),
                              audio=_audio(_sine(0.36, 16000, batch=2), 16000))
    assert same.notes == ("audio: the video is made to this sound, which it keeps.",)


@pytest.mark.unit
@pytest.mark.parametrize("name, frame_rate", [("tiny-ltx2", 25.0), ("tiny-minimax-h3", 24.0)])
def test_the_output_bound_counts_the_sound_each_video_hands_back(tiny_models, monkeypatch, name, frame_rate):
    """The frames and the waveform returned to ComfyUI (stereo float32 at the vocoder's, or MiniMax H3's audio
    VAE's, rate) are held to the host's free memory together: frames that fit with a sound that does not are
    refused before any worker starts, naming the inputs and the sound's bytes."""
    monkeypatch.setenv("COMFYUI_TPU_MAX_MEGAPIXELS", "100")
    _no_worker(monkeypatch)
    spec = api.make_spec(name, [str(tiny_models)])
    req = SampleRequest(**(LTX if name == "tiny-ltx2" else {**MINIMAX, "prompt": "a robot dancing"}))
    component, key = spec.family.sound_rate.split(".")
    rate = spec.component_config(component)[key]
    sound = int(np.ceil(req.frames / frame_rate * rate)) * 2 * 4
    assert sound_input.output_bytes(spec, req) == sound > 0
    frames = req.width * req.height * 3 * 4 * req.frames * 4  # held 4 times (pixels.OUTPUT_COPIES)
    decode = pixels.sound_bytes(spec, req.frames, req.frame_rate)  # a cpu worker decodes the sound on the host
    assert decode > 0
    monkeypatch.setattr(devices, "host_memory", lambda: (2**30, frames + sound * 4 + decode))
    api.prepare_sample(spec, req)  # exactly fits
    monkeypatch.setattr(devices, "host_memory", lambda: (2**30, frames + sound * 2 + decode))
    with pytest.raises(ModelError, match=rf"^batch_size, frames, width/height: 1 video of {req.width}x{req.height} × "
                                         rf"{req.frames} frames are .* of float32 pixels and sound \(.* a video\).*at "
                                         r"most 0 at this size and length"):
        api.prepare_sample(spec, req)


@pytest.mark.unit
@pytest.mark.parametrize("name", ["tiny-ltx2", "tiny-ltx25"])
@pytest.mark.parametrize("side, message", [
    (32, r"{0}: 32 is less than LTX-2 can make: its VAE needs at least 2 latent pixels a side, 64 pixels; use 64 "
         r"or more\."),
    (48, r"{0}: 48 is not a multiple of 32, which LTX-2 needs; use 64\."),
])
def test_ltx2_sides_its_vae_cannot_decode_are_refused_naming_the_least(tiny_models, monkeypatch, name, side, message):
    """LTX-2's video VAE decoder pads by reflection, which torch refuses on a latent one pixel wide (a raw
    'Padding size should be less than the corresponding input dimension' from the worker, after the whole
    denoise): a 32-pixel side is refused first (ComfyUI's LTX nodes start at 64 too); 64 runs (test_ltx2_audio)."""
    _no_worker(monkeypatch)
    for which in ("width", "height"):
        with pytest.raises(ModelError, match="^" + message.format(which)):
            api.prepare_sample(_ltx(tiny_models, name), SampleRequest(**{**LTX, which: side}))
    api.check_request(_ltx(tiny_models, name), SampleRequest(**{**LTX, "width": 64, "height": 96}))
    api.check_request(_minimax(tiny_models), SampleRequest(**{**MINIMAX, "width": 32}))  # MiniMax H3's VAE takes 32


@pytest.mark.unit
@pytest.mark.parametrize("sigmas, shown", [((float("nan"), 0.5), "nan, 0.5"), ((float("inf"),), "inf"),
                                           ((5.0, 0.5), "5, 0.5"), ((0.4, 0.9), "0.4, 0.9")])
def test_ltx2_stage_two_sigmas_the_node_would_refuse_are_refused_through_the_api_too(tiny_models, tmp_path,
                                                                                    monkeypatch, sigmas, shown):
    """Sample Video's text is checked by the node (two_stage.parse_sigmas); a request built otherwise (a script, the
    API) with a NaN ran to NaN frames blamed on "NaN or infinity in the model's weights"; now the same rule refuses
    it before any worker, naming upscale_sigmas; the templates' values (a last 0 too) pass."""
    from backend.families.ltx2 import two_stage

    _no_worker(monkeypatch)
    req = dict(LTX, width=128, height=128, upscale_model=str(tmp_path / "ltx-2.3-spatial-upscaler-x2.safetensors"))
    with pytest.raises(InputError, match=rf"^upscale_sigmas: {shown} must be falling values in \(0, 1\]"):
        api.prepare_sample(_ltx(tiny_models), SampleRequest(**req, upscale_sigmas=sigmas))
    api.check_request(_ltx(tiny_models), SampleRequest(**req, upscale_sigmas=(*two_stage.TEMPLATE_SIGMAS, 0.0)))


IMAGE = dict(prompt="a red fox", width=64, height=64, steps=2, guidance=3.5, seed=1)
HELD = {  # tiny model -> (its request, a memory bomb, a frame count or side it cannot make)
    "tiny-qwenimage21": (IMAGE, dict(width=2048, height=2048, batch_size=64), dict(width=48)),
    "tiny-krea2": (IMAGE, dict(width=2048, height=2048, batch_size=64), dict(width=40)),
    "tiny-ideogram4": (IMAGE, dict(width=2048, height=2048, batch_size=64), dict(height=24)),
    "tiny-flux3": (IMAGE, dict(width=2048, height=2048, batch_size=64), dict(frames=9)),
    "tiny-ltx2": (LTX, dict(width=1024, height=1024, frames=1017, batch_size=64), dict(frames=10)),
    "tiny-minimax-h3": ({**MINIMAX, "prompt": "a robot dancing"}, dict(width=1024, height=1024, frames=345,
                                                                         batch_size=64), dict(frames=362)),
}


@pytest.mark.unit
@pytest.mark.parametrize("name", sorted(HELD))
def test_what_held_on_the_new_families_guidance_memory_bombs_and_sizes(tiny_models, monkeypatch, name):
    """The cases that were refused already (a compact table): guidance NaN or infinite, a prompt whose frames or
    images (and sound) the host cannot hold, a size or frame count the model cannot make; each before any worker,
    within 2 s, naming the input."""
    monkeypatch.setenv("COMFYUI_TPU_MAX_MEGAPIXELS", "100")
    monkeypatch.setattr(devices, "host_memory", lambda: (16 * 2**30, 8 * 2**30))
    _no_worker(monkeypatch)
    spec, (base, bomb, unmade) = api.make_spec(name, [str(tiny_models)]), HELD[name]
    for change, error, words in (({"guidance": float("nan")}, InputError, r"^guidance: nan is not a number"),
                                 ({"guidance": float("inf")}, InputError, r"^guidance: inf is not a number"),
                                 (bomb, ModelError, r"^batch_size, (frames, )?width/height: 64 (videos|images) of "
                                                    r"(1024x1024 × \d+ frames|2048x2048) are .* at most \d+ at this "
                                                    r"size"),
                                 (unmade, ModelError, rf"^({'|'.join(unmade)}|pipeline): ")):
        started = time.monotonic()
        with pytest.raises(error, match=words):
            api.prepare_sample(spec, SampleRequest(**{**base, **change}))
        assert time.monotonic() - started < 2, change
    api.prepare_sample(spec, SampleRequest(**base))


@pytest.mark.unit
@pytest.mark.parametrize("height, width", [(512, 64), (64, 512)])
def test_a_minimax_reference_image_beyond_four_to_one_is_refused_before_any_worker(tiny_models, monkeypatch, height,
                                                                                   width):
    """diffusers' MiniMax H3 blocks raise a bare ValueError ("A reference image must be within 1:4 and 4:1") in the
    worker, after it has loaded; the pack refuses it first, naming the size and the fix; 4:1 runs."""
    _no_worker(monkeypatch)
    spec, req = _minimax(tiny_models), SampleRequest(**MINIMAX)
    with pytest.raises(ModelError, match=rf"^reference_images: {width}x{height}: MiniMax H3 takes reference images "
                                         r"whose sides differ by at most 4:1 .*Crop it nearer a square"):
        api.prepare_sample(spec, req, references=np.zeros((1, height, width, 3), np.float32))
    four = (256, 64) if height > width else (64, 256)
    assert api.prepare_sample(spec, req, references=np.zeros((1, *four, 3), np.float32)).arrays["references"].shape[
        1:3] == four


@pytest.mark.unit
@pytest.mark.parametrize("name", ["tiny-flux3", "tiny-flux3-base"])
def test_more_reference_images_than_flux3_takes_are_refused_before_any_worker(tiny_models, monkeypatch, name):
    """FLUX 3 [klein] takes at most 10 reference images (diffusers' blocks say so): 11 are refused at once, naming
    the count and the fix, where each would otherwise be encoded and add its tokens to every step; 10 pass."""
    _no_worker(monkeypatch)
    spec, req = api.make_spec(name, [str(tiny_models)]), SampleRequest(**IMAGE)
    started = time.monotonic()
    with pytest.raises(ModelError, match=r"^image: 11 reference images; FLUX 3 \[klein\]( base)? takes at most 10\. "
                                         r"Batch fewer \(Image Batch of at most 10\)"):
        api.prepare_sample(spec, req, image=np.zeros((11, 64, 64, 3), np.float32))
    assert time.monotonic() - started < 2
    assert api.prepare_sample(spec, req, image=np.zeros((10, 64, 64, 3), np.float32)).arrays["image"].shape[0] == 10


# ---- ComfyUI's files: a text encoder too shallow, a quantized layer mislabelled

NEW_FILES = ("flux2", "krea2", "qwenimage21", "flux3", "ideogram4")  # FLUX 3 reads Krea 2's Qwen3-VL, FLUX.2's VAE


@pytest.fixture(scope="module")
def files(comfyui_files, comfyui_dir, monkeypatch_module):
    monkeypatch_module.syspath_prepend(str(comfyui_dir))
    return comfyui_files(*NEW_FILES)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def _file_spec(files, **choice):
    from backend.controller.files import assemble, listing

    roots = {role: [str(files / "models" / folder)] for role, folder in listing.ROLE_FOLDERS.items()}
    return api.make_file_spec(assemble.FileChoice(**choice), roots)


QWEN3VL_4B, QWEN3VL_2_LAYERS = "qwen3vl_4b-tiny.safetensors", "qwen3vl_8b-tiny.safetensors"
SHALLOW = {  # were accepted, then a worker's raw KeyError: 3 (Ideogram 4) or IndexError (Krea 2, FLUX 3)
    "Krea 2": (dict(diffusion_model="krea2_turbo-tiny.safetensors", vae="qwen_image_vae-krea2-tiny.safetensors"), 35),
    "FLUX 3 [klein]": (dict(diffusion_model="flux3-image-klein-tiny.safetensors", vae="flux2-vae-tiny.safetensors"),
                       32),
    "Ideogram 4": (dict(diffusion_model="ideogram4-tiny.safetensors", vae="flux2-vae-tiny.safetensors",
                        diffusion_model_2="ideogram4_unconditional-tiny.safetensors"), 36),
}


@pytest.mark.pipelines
@pytest.mark.parametrize("family", sorted(SHALLOW))
def test_a_qwen3vl_of_too_few_layers_for_the_layers_a_family_reads_is_refused_by_name(files, family):
    """The tiny Qwen3-VL-8B file (2 layers) is as wide as the families' 36-layer ones: these read the hidden states
    of fixed layers, so it is refused naming the file, its layers and the least; the whole file loads."""
    choice, least = SHALLOW[family]
    with pytest.raises(ModelError) as e:
        _file_spec(files, **choice, text_encoders=(QWEN3VL_2_LAYERS,))
    assert str(e.value) == (
        f"text_encoder_1: '{QWEN3VL_2_LAYERS}' is a Qwen3-VL text encoder of 2 layers; {family} reads the hidden "
        f"states of fixed layers, as deep as its layer {least}, so it needs at least {least}. Choose Qwen3-VL "
        "(qwen3vl_4b_*.safetensors or qwen3vl_8b_*.safetensors) made for it (the whole model, not a pruned one).")
    text = "qwen3vl_8b-36layers-tiny.safetensors" if family == "Ideogram 4" else QWEN3VL_4B
    assert _file_spec(files, **choice, text_encoders=(text,)).family.name == family


def _relabelled(files, tmp_path, marker: dict) -> str:
    """FLUX 3 [klein] base's int8 ConvRot file with its first layer's comfy_quant marker replaced by `marker`."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    src = files / "models" / "diffusion_models" / "flux3-image-klein-base-int8-convrot-tiny.safetensors"
    with safe_open(str(src), "pt") as f:
        sd = {k: f.get_tensor(k) for k in f.keys()}
    layer = "content_mode_blocks.image.0.attn_out"
    sd[f"{layer}.comfy_quant"] = torch.tensor(list(json.dumps(marker).encode()), dtype=torch.uint8)
    if marker.get("scale") == "tensorwise":  # plain int8 bytes with a tensorwise scale
        del marker["scale"]
        sd[f"{layer}.weight_scale"] = sd[f"{layer}.weight_scale"].amax().reshape(())
    out = tmp_path / "models" / "diffusion_models" / "mislabelled.safetensors"
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file(sd, str(out))
    return str(out.parent)


MISLABELLED = {  # marker -> what the refusal names
    # was: comfy-kitchen's raw NoCapableBackendError at load ("scales: shape [256, 1] fails: exactly 1D")
    "int8 bytes marked ConvRot W4A4": ({"format": "convrot_w4a4", "convrot_groupsize": 256},
                                       "'content_mode_blocks.image.0.attn_out.weight_scale' has the shape [256, 1], "
                                       "which does not fit 'content_mode_blocks.image.0.attn_out.weight' [256, 256] "
                                       "(expected [256])"),
    # was: loaded, rotated back where it was never rotated (weights about 137% off)
    "a tensorwise int8 layer marked ConvRot": ({"format": "int8_tensorwise", "convrot": True, "scale": "tensorwise"},
                                               "'content_mode_blocks.image.0.attn_out.weight_scale' has the shape [], "
                                               "which does not fit"),
    # held before: the bytes' dtype is not the format's
    "int8 bytes marked nvfp4": ({"format": "nvfp4"}, "'content_mode_blocks.image.0.attn_out.weight' is I8; nvfp4 "
                                                     "stores U8"),
}


@pytest.mark.pipelines
@pytest.mark.parametrize("case", sorted(MISLABELLED))
def test_a_quantized_layer_whose_marker_names_another_format_is_refused_before_any_worker(files, tmp_path, case):
    from backend.controller.files import assemble, listing

    marker, words = MISLABELLED[case]
    folder = _relabelled(files, tmp_path, dict(marker))
    roots = {role: [str(files / "models" / f)] for role, f in listing.ROLE_FOLDERS.items()}
    choice = assemble.FileChoice(diffusion_model="mislabelled.safetensors", text_encoders=(QWEN3VL_4B,),
                                 vae="flux2-vae-tiny.safetensors")
    with pytest.raises(InputError) as e:
        api.make_file_spec(choice, {**roots, "diffusion_model": [folder]})
    assert "'mislabelled.safetensors'" in str(e.value) and words in str(e.value), str(e.value)


# ---- through ComfyUI (this ComfyUI has no AUDIO nodes: comfy_extras/nodes_audio.py needs torchaudio)


def _video_graph(**sample) -> dict:
    """Load TPU Pipeline (tiny-ltx2) → Sample Video (id 2) → Preview Image."""
    inputs = {k: v for k, v in LTX.items()}
    return {"1": {"class_type": "LoadTPUPipeline", "inputs": {"model": "tiny-ltx2", "dtype": "auto", "device": "auto",
                                                              "offload": "none", "model_path": ""}},
            "2": {"class_type": "TPUSampleVideo", "inputs": {"pipeline": ["1", 0], **inputs, "batch_size": 1,
                                                             **sample}},
            "3": {"class_type": "PreviewImage", "inputs": {"images": ["2", 0]}}}


@pytest.mark.server
def test_through_comfyui_ltx2_at_32_pixels_names_the_side_and_the_next_prompt_runs(server):
    from helpers import prompt, run_ok
    from test_reliability import rejection

    started = time.monotonic()
    stage, node, message = rejection(server, _video_graph(width=32))
    assert (stage, node) == ("execution", "2"), message
    assert "width: 32 is less than LTX-2 can make" in message and "use 64 or more" in message, message
    assert "Padding size" not in message and time.monotonic() - started < 30
    assert len(run_ok(server, prompt())["images"]) == 1
