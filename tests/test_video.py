"""Video (Wan, LTX-2 with sound) through the workers: frames (and LTX-2's waveform) equal plain diffusers'
WanPipeline, WanImageToVideoPipeline, LTX2Pipeline and LTX2ImageToVideoPipeline, progress per step, Cancel, and the
layouts (Context Parallel 2, CFG Parallel, Data Parallel 2) against one worker.

Tolerances: CFG Parallel and Data Parallel run one worker's arithmetic (each rank computes whole passes, each
video is its own call with its own generator): bit-identical. Context Parallel 2 (Ulysses) splits the tokens and
the heads of each attention over two ranks, which sums in another order: frames match one worker within 1e-4 in
float32. LTX-2 against plain diffusers: within PLAIN_TOLERANCE (seen: bit-identical).
"""

from __future__ import annotations

import json
import shutil
import threading

import numpy as np
import pytest
import torch

from backend.controller import api, layouts
from backend.families.ltx2 import OFF
from backend.families.wan import TAYLORSEER_MODULES
from backend.protocol import settings
from backend.protocol.errors import CompileError, Interrupted, ModelError, ParallelError, SampleError
from backend.protocol.messages import Status, Step
from backend.protocol.spec import PipelineSpec, SampleRequest, warmup_request

CP_TOLERANCE = PLAIN_TOLERANCE = 1e-4
# Tiled against whole VAE decoding on the tiny random-weight VAE (320x32 frames: tiles at 0 and 192, blended over
# 192..256): seen max 0.148 at the seam, 0.023 left of it, mean 0.0064 (pixels in 0..1)
TILE_MAX, TILE_MEAN = 0.2, 0.01
# tiny-ltx2's random-weight VAE on a random latent, tiled as the worker tiles it against whole: 544x64 frames in
# 512-pixel tiles, seen max 0.58, mean 0.021; 25 frames frame-wise (tiles of 17 frames, blended over 8), seen max
# 0.96-1.06, mean 0.12-0.13 (seeds 0-2; its non-causal decoder sees no frames beyond a tile's, and random weights
# make every frame depend on all of them). Far apart on random weights: real weights are not checked here.
LTX_TILE_MAX, LTX_TILE_MEAN, LTX_FRAMES_MEAN = 0.65, 0.03, 0.15
FOX = "a red fox in the snow"


def _request(**kw) -> SampleRequest:
    base = dict(prompt=FOX, negative_prompt="blurry", width=32, height=32, frames=5, steps=2, guidance=5.0, seed=11)
    return SampleRequest(**{**base, **kw})


# tiny-ltx2's smallest video: 64x64 (2x2 latent pixels), 9 frames (2 latent frames), CFG 3 (batched), 25 fps
LTX = dict(width=64, height=64, frames=9, guidance=3.0, frame_rate=25.0)


def _spec(tiny_models, name="tiny-wan"):
    return api.make_spec(name, [str(tiny_models)])


@pytest.mark.unit
@pytest.mark.parametrize("name, bad, message", [
    ("tiny-wan", 6, r"frames: Wan makes 1 \+ a multiple of 4 frames .* not 6; use 5 or 9"),
    ("tiny-ltx2", 10, r"frames: LTX-2 makes 1 \+ a multiple of 8 frames \(its VAE packs 8 frames into one\), not 10; "
                      r"use 9 or 17")])
def test_frames_and_video_tokens_are_checked_before_any_worker(tiny_models, name, bad, message):
    video = _spec(tiny_models, name)
    with pytest.raises(ModelError, match=message):
        api.check_request(video, _request(frames=bad, width=64, height=64))
    with pytest.raises(ModelError, match=rf"pipeline: {video.family.name} makes videos; use Sample Video \(TPU\)"):
        api.check_request(video, _request(frames=0, width=64, height=64))
    with pytest.raises(CompileError, match=rf"warmup: 64x64x{bad}f: frames: {video.family.name} makes 1 \+ a multiple"):
        api.with_compile(video, "whole denoiser", "auto", f"64x64x{bad}f")


@pytest.mark.unit
def test_wan_video_tokens_and_images_are_checked_before_any_worker(tiny_models):
    wan = _spec(tiny_models)
    with pytest.raises(ModelError, match=r"pipeline: FLUX.1 makes images, not videos; use Sample \(TPU\)"):
        api.check_request(_spec(tiny_models, "tiny-flux"), _request())
    cp, _ = api.context_parallel(wan, 2)
    api.check_request(cp, _request(width=16, height=16, frames=5))  # 2 latent frames x 1 x 1 tokens
    with pytest.raises(ParallelError, match=r"makes 1 video tokens.*\(width/16\) × \(height/16\) is a multiple of 2"):
        api.check_request(cp, _request(width=16, height=16, frames=1))
    with pytest.raises(CompileError, match=r"warmup: 32x32 has no frames, and Wan makes videos.*'32x32x81f'"):
        api.with_compile(wan, "whole denoiser", "auto", "32x32")
    with pytest.raises(CompileError, match=r"warmup: 64x64x5f: pipeline: FLUX.1 makes images, not videos"):
        api.with_compile(_spec(tiny_models, "tiny-flux"), "whole denoiser", "auto", "64x64x5f")


@pytest.mark.unit
def test_ltx2_sizes_frame_rate_and_sound_components_are_checked_before_any_worker(tiny_models, tmp_path):
    """Sides of 32 (its VAE's 32x packing), a frame rate in range, a folder that holds the audio VAE and the
    vocoder (the sound's parts), and under Context Parallel video tokens that split evenly (no plan pads them) with
    Ulysses: each refused naming the input, the value and the fix (the nearest values). Audio latents that do not
    split (9 at 25 fps: as many as the frames) are accepted, the notes saying the sound runs whole on every rank."""
    ltx = _spec(tiny_models, "tiny-ltx2")
    assert ltx.size_factor == 32 and ltx.start_image, "LTX-2 takes a start image (LTX2ImageToVideoPipeline)"
    api.check_request(ltx, _request(**LTX))
    with pytest.raises(ModelError, match=r"width: 48 is not a multiple of 32, which LTX-2 needs; use 64"):
        api.check_request(ltx, _request(**{**LTX, "width": 48}))
    with pytest.raises(SampleError, match=r"frame_rate: 0.5 frames per second is out of range for LTX-2; use 1 to 240"):
        api.check_request(ltx, _request(**{**LTX, "frame_rate": 0.5}))
    cp, text = api.context_parallel(ltx, 2)
    assert "LTX-2's sound is split too where its audio latents" in text and "the sound runs whole on every" in text
    api.check_request(cp, _request(**{**LTX, "frame_rate": 22.0}))  # 8 video tokens, 10 audio latents
    assert not [n for n in api.describe_inputs(cp, _request(**{**LTX, "frame_rate": 22.0})) if "runs whole" in n]
    api.check_request(cp, _request(**LTX))  # 9 audio latents: at 25 fps every 8k + 1 frames make an odd count
    assert [n for n in api.describe_inputs(cp, _request(**LTX)) if n.startswith("Context Parallel")] == [
        "Context Parallel 2: 9 frames at 25 fps make 9 audio latents, which 2 ranks cannot split evenly, so the "
        "sound runs whole on every rank (its attention repeated on each; the video's tokens are split); the result "
        "is the same as on one rank."]
    assert not [n for n in api.describe_inputs(ltx, _request(**LTX)) if "runs whole" in n], "one rank splits nothing"
    with pytest.raises(ParallelError, match=r"width/height: 96x96 at 17 frames makes 27 video tokens, which Context "
                                            r"Parallel degree 2 cannot split evenly; .*\(the nearest: width 64 or "
                                            r"128, height 64 or 128, frames 9 or 25\)"):  # the sound need not split
        api.check_request(cp, _request(**{**LTX, "width": 96, "height": 96, "frames": 17, "frame_rate": 25.0}))
    two_stage = dict(LTX, width=192, height=192, frames=17, frame_rate=24.0, upscale_model="x2.safetensors",
                     upscale_sigmas=(0.85, 0.725, 0.4219))  # 108 tokens at 192x192, 27 in the first stage's 96x96
    with pytest.raises(ParallelError, match=r"width/height: 192x192 at 17 frames makes 27 video tokens \(with "
                                            r"upscale_model its first stage runs at 96x96: .*\(the nearest: width "
                                            r"128 or 256, height 128 or 256, frames 9 or 25\)"):
        api.check_request(cp, _request(**two_stage))
    with pytest.raises(ParallelError, match=r"mode: 'ring' cannot be used with LTX-2: its prompt is padded to 1024 "
                                            r"tokens with a mask of its padding.*Use 'ulysses'"):
        api.context_parallel(ltx, 2, "ring")
    folder = tmp_path / "no-vocoder"
    shutil.copytree(tiny_models / "tiny-ltx2", folder)
    index = json.loads((folder / "model_index.json").read_text())
    (folder / "model_index.json").write_text(json.dumps({**index, "vocoder": [None, None]}))
    with pytest.raises(ModelError, match=r"model: 'no-vocoder' \(LTX-2\) makes the video's sound with "
                                         r"its audio_vae and vocoder, and its model_index.json lists no vocoder\. "
                                         r"The folder is incomplete: .*\(audio_vae/, vocoder/ beside vae/\)"):
        api.make_spec("no-vocoder", [str(tmp_path)])


@pytest.mark.unit
def test_start_image_is_checked_and_described(tiny_models):
    wan, i2v, image = _spec(tiny_models), _spec(tiny_models, "tiny-wan-i2v"), _start_images()
    with pytest.raises(ModelError, match=r"start_image: 'tiny-wan' \(Wan, WanPipeline\) makes video from text only"):
        api.prepare_sample(wan, _request(), image)
    with pytest.raises(ModelError, match=r"start_image: 'tiny-wan-i2v' is an image-to-video model .* Connect one"):
        api.prepare_sample(i2v, _request())
    with pytest.raises(ModelError, match="mask: Sample Video takes no mask"):
        api.prepare_sample(i2v, _request(), image, np.ones((1, 32, 32), np.float32))
    with pytest.raises(ModelError, match=r"start_image: an IMAGE of shape \[32, 32\] cannot be used"):
        api.prepare_sample(i2v, _request(), image[0, ..., 0])
    notes = api.prepare_sample(i2v, _request(batch_size=3), image[:, :16]).notes
    assert notes == ("image to video: the start image (32x16) is the first frame, stretched to 32x32 where it "
                     "differs", "2 start images for 3 videos: video i (seed + i) starts from image i (cycling: i mod 2)")


@pytest.mark.unit
def test_a_sound_that_is_not_numbers_fails_the_run_naming_the_audio():
    """The worker hands a sound-making model's waveform back as float32 [B, C, S], refuses one holding NaN or
    infinity (it would be saved as noise), and gives none for a model without sound."""
    from types import SimpleNamespace

    from backend.families import PIPELINES
    from backend.worker import sound

    ltx, wan = PIPELINES["LTX2Pipeline"], PIPELINES["WanPipeline"]
    wave = torch.linspace(-1, 1, 12, dtype=torch.bfloat16).reshape(1, 2, 6)
    out = sound.waveform(ltx, SimpleNamespace(frames=None, audio=wave))
    assert out.dtype == np.float32 and out.shape == (1, 2, 6) and np.array_equal(out, wave.float().numpy())
    assert sound.waveform(wan, SimpleNamespace(frames=None)) is None
    wave[0, 1, 3] = float("nan")
    with pytest.raises(ModelError, match=r"audio: the run made a sound that is not numbers \(NaN or infinity\), "
                                         r"which would be saved as noise, so it failed instead"):
        sound.waveform(ltx, SimpleNamespace(frames=None, audio=wave))


def _start_images(size: int = 32) -> np.ndarray:
    """Two start images as Load Image gives them (8-bit pixels as float32 in 0..1), size x size."""
    return (np.random.default_rng(5).integers(0, 256, (2, size, size, 3)) / 255).astype(np.float32)


@pytest.fixture(scope="module")
def one_worker(tiny_models) -> np.ndarray:
    """Two videos (seeds 11, 12) from one worker, with CFG (guidance 5, a negative prompt)."""
    return api.sample(_spec(tiny_models), _request(batch_size=2))


@pytest.mark.workers
def test_frames_equal_plain_diffusers_with_progress_and_cancel(tiny_models, one_worker):
    from diffusers import WanPipeline

    assert one_worker.shape == (10, 32, 32, 3) and one_worker.dtype == np.float32, "2 videos of 5 frames"
    pipe = WanPipeline.from_pretrained(str(tiny_models / "tiny-wan"), dtype=torch.float32, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    for video, seed in enumerate((11, 12)):
        with torch.inference_mode():
            plain = pipe(prompt=FOX, negative_prompt="blurry", height=32, width=32, num_frames=5,
                         num_inference_steps=2, guidance_scale=5.0, output_type="np",
                         generator=[torch.Generator("cpu").manual_seed(seed)]).frames[0]
        assert np.array_equal(one_worker[5 * video:5 * (video + 1)], plain), f"video {video} (seed {seed})"

    spec, stop, seen = _spec(tiny_models), threading.Event(), []

    def on_progress(msg):
        if isinstance(msg, Step):
            seen.append((msg.step, msg.total))
            if msg.step == 2:
                stop.set()

    with pytest.raises(Interrupted):
        api.sample(spec, _request(steps=5000), on_progress, stop.is_set)
    assert seen[0] == (1, 5000) and max(s for s, _ in seen) < 50, "one Step per step; stopped within a few"
    said = []
    assert api.sample(spec, _request(batch_size=1), said.append).shape == (5, 32, 32, 3), "the next video runs"
    told = [(m.step, m.total) if isinstance(m, Step) else m.text for m in said
            if isinstance(m, Step) or m.text.startswith("VAE")]
    assert told == [(1, 2), (2, 2), "VAE: decoding the video's 5 frames of 32x32…", "VAE: decoding latent frame 1/2…",
                    "VAE: decoding latent frame 2/2…"], "the decode follows the steps, and says how far it is"


def _plain(tiny_models, name: str, cls: str, starts: np.ndarray | None,
           **call) -> list[tuple[np.ndarray, np.ndarray | None]]:
    """Plain diffusers' pipeline `cls` of the tiny folder `name`, called for seeds 11 and 12 (with start image 0 and
    1 as PIL images, where `starts`) as the pack's request asks (LTX-2: its guidance on the video and the sound alike, the rest switched off as the family's OFF): each
    video's frames [F, H, W, 3] and its waveform [C, S] (None without sound)."""
    import diffusers

    pipe = getattr(diffusers, cls).from_pretrained(str(tiny_models / name), dtype=torch.float32, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    sound = dict(OFF, audio_guidance_scale=call["guidance_scale"]) if "LTX2" in cls else {}
    out = []
    for i, seed in enumerate((11, 12)):
        image = {"image": _pil(starts[i])} if starts is not None else {}
        with torch.inference_mode():
            result = pipe(prompt=FOX, negative_prompt="blurry", num_inference_steps=2, output_type="np",
                          generator=[torch.Generator("cpu").manual_seed(seed)], **image, **sound, **call)
        out.append((result.frames[0], result.audio[0].numpy() if "LTX2" in cls else None))
    return out


def _pil(image: np.ndarray):
    from PIL import Image

    return Image.fromarray((image * 255).round().astype(np.uint8))


# (tiny folder, plain diffusers class, with start images, request): every image-to-video model and LTX-2's text
# to video (Wan's text to video: test_frames_equal_plain_diffusers_with_progress_and_cancel)
PLAIN = {"wan i2v": ("tiny-wan-i2v", "WanImageToVideoPipeline", True, {}),
         "ltx2 t2v": ("tiny-ltx2", "LTX2Pipeline", False, LTX),
         "ltx2 i2v": ("tiny-ltx2", "LTX2ImageToVideoPipeline", True, LTX)}


@pytest.mark.workers
@pytest.mark.parametrize("case", list(PLAIN))
def test_videos_and_their_sound_equal_plain_diffusers(tiny_models, case):
    """Video i (seed 11 + i) equals plain diffusers' pipeline with that seed (and start image i, a PIL image of the
    video's size); LTX-2's sound too, as ComfyUI's AUDIO takes it ([B, 2, S] at the vocoder's rate, as long as the
    frames at the frame rate less the audio VAE's causal 3 mel frames)."""
    name, cls, starts, kw = PLAIN[case]
    req = _request(batch_size=2, **kw)
    images = _start_images(req.width) if starts else None
    said = []
    out = api.run_sample_outputs(api.prepare_sample(_spec(tiny_models, name), req, images),
                                 lambda m: said.append(m.text) if isinstance(m, Status) else None)
    frames, f = out["images"], req.frames
    assert frames.shape == (2 * f, req.height, req.width, 3)
    call = dict(height=req.height, width=req.width, num_frames=f, guidance_scale=req.guidance)
    if "LTX2" in cls:
        call["frame_rate"] = req.frame_rate
    plain = _plain(tiny_models, name, cls, images, **call)
    tolerance = PLAIN_TOLERANCE if "LTX2" in cls else 0.0
    for video, (plain_frames, plain_audio) in enumerate(plain):
        assert np.abs(frames[f * video:f * (video + 1)] - plain_frames).max() <= tolerance, f"video {video}"
        if plain_audio is None:
            assert "audio" not in out, "no sound from a model without one"
            continue
        assert np.abs(out["audio"][video] - plain_audio).max() <= tolerance, f"video {video}'s sound"
    assert not np.array_equal(frames[:f], frames[f:]), "each video its own seed (and start image)"
    if "LTX2" in cls:
        from backend.families.ltx2.tiny import TINY_RATE

        rate, samples = int(out["audio_rate"][0]), out["audio"].shape[2]
        latents = round(f / req.frame_rate * 25)  # the audio VAE's 25 latents a second, 4 mel frames each, causal
        assert out["audio"].shape[:2] == (2, 2) and rate == TINY_RATE
        assert samples == (4 * latents - 3) * TINY_RATE // 100, "100 mel frames a second"
        assert np.abs(out["audio"][0]).max() > 0 and not np.array_equal(out["audio"][0], out["audio"][1])
        assert said.count("VAE: decoding the video's 9 frames of 64x64 and its sound (audio VAE and vocoder)…") == 2


@pytest.mark.workers
def test_compiled_video_warms_up_and_prompts_seeds_steps_never_recompile(tiny_models):
    """One static shape per (frames, height, width): the warm-up compiles it before the first Sample Video, other
    prompts, seeds, steps and guidance reuse it (dynamo's own counters), another frame count compiles once.
    Repeated blocks with the 'eager' backend: the same shape signatures as the whole denoiser, in seconds."""
    spec, _ = api.with_compile(_spec(tiny_models), "repeated blocks", "eager", "32x32x5f", False)
    said = []
    warm = api.load(spec, said.append)["compile"]
    texts = [m.text for m in said if isinstance(m, Status)]
    assert "warm-up 1/1: 32x32x5 frames (batch 1)" in texts, texts
    shape = next(s for s in warm["shapes"] if s["shape"] == "32x32x5 frames (batch 1)" and "eager" in s["component"])
    assert (shape["compiles"], shape["graphs"], warm["unexpected_recompiles"]) == (1, 1, 0), "one graph, all steps"
    varied = [dict(seed=1, prompt="a lighthouse on a cliff at dusk, oil painting, warm light"),
              dict(steps=3, guidance=1.0, negative_prompt="")]
    for change in varied:
        assert api.sample(spec, _request(**change)).shape == (5, 32, 32, 3)
    stats = api.compile_stats()
    assert (stats["graphs"], stats["compiles"], stats["unexpected_recompiles"]) == (warm["graphs"], warm["compiles"], 0)
    assert stats["hits"] == warm["hits"] + len(varied)
    said = []
    api.sample(spec, _request(frames=1, steps=1), said.append)
    assert "compiling 32x32x1 frames (batch 1) for the first time…" in [m.text for m in said if isinstance(m, Status)]
    after = api.compile_stats()
    assert (after["compiles"], after["graphs"], after["unexpected_recompiles"]) == (
        stats["compiles"] + 1, stats["graphs"] + 1, 0)


@pytest.mark.unit
def test_the_video_vae_tiles_where_the_pixel_budget_says(tiny_models, monkeypatch):
    """3 megapixels of image budget: 1280x720 frames decode whole, 1920x1088 in tiles (a video's decode takes
    about 2.2× an image's memory per pixel: families/vaes.py), in a Sample and in a compile warm-up of that size;
    images never tile."""
    monkeypatch.setenv(settings.MAX_MEGAPIXELS.name, "3")
    wan = _spec(tiny_models)
    assert not api.prepare_sample(wan, _request(width=1280, height=720)).req.tiled_vae
    tiled = api.prepare_sample(wan, _request(width=1920, height=1088))
    assert tiled.req.tiled_vae and tiled.notes[-1] == (
        "VAE: decoding in 256×256 tiles (blended at the seams), because decoding 1920x1088 frames whole takes about "
        "2.2× an image's memory per pixel, more than the pixel budget allows (1.35 megapixels per frame untiled: "
        f"{settings.MAX_MEGAPIXELS.name}=3)")
    flux = api.prepare_sample(_spec(tiny_models, "tiny-flux"), _request(width=1920, height=1088, frames=0))
    assert not flux.req.tiled_vae
    # a compile warm-up decodes as the Sample of its size does (the plan travels to the worker as plain data)
    compiled = api.checked(api.with_compile(wan, "repeated blocks", "eager", "1280x720x5f, 1920x1088x5f", False)[0])
    assert compiled.compile.tiled_vae == ((1920, 1088, 1, 5, 0.0),)
    compiled = PipelineSpec.from_dict(json.loads(json.dumps(compiled.to_dict())))
    assert [warmup_request(compiled, *size).tiled_vae for size in compiled.compile.warmup] == [False, True]


def _plain_tiled_and_whole(pipeline_class, folder, framewise: bool, **call) -> dict[bool, np.ndarray]:
    """Plain diffusers' frames of one seeded video, with the VAE's tiling on (True; `framewise`: its frame-wise
    decoding too) and off (False)."""
    pipe = pipeline_class.from_pretrained(str(folder), dtype=torch.float32, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    plain = {}
    for tiled in (True, False):
        pipe.vae.enable_tiling() if tiled else pipe.vae.disable_tiling()
        if framewise:
            pipe.vae.use_framewise_decoding = tiled
        with torch.inference_mode():
            plain[tiled] = pipe(prompt=FOX, negative_prompt="blurry", output_type="np",
                                generator=[torch.Generator("cpu").manual_seed(11)], **call).frames[0]
    return plain


@pytest.mark.workers
def test_frames_over_the_budget_decode_in_tiles_close_to_whole(tiny_models, monkeypatch):
    """A budget of 0.02 megapixels takes 320x32 frames but not their whole decode: the worker decodes in diffusers'
    tiles (equal to plain diffusers with vae.enable_tiling()), within TILE_MAX / TILE_MEAN of the whole decode (the
    tiles see no pixels beyond their edges; their 64-pixel overlap is blended)."""
    from diffusers import WanPipeline

    monkeypatch.setenv(settings.MAX_MEGAPIXELS.name, "0.02")
    prepared = api.prepare_sample(_spec(tiny_models), _request(width=320, height=32, steps=1))
    assert prepared.req.tiled_vae
    frames = api.run_sample(prepared)
    plain = _plain_tiled_and_whole(WanPipeline, tiny_models / "tiny-wan", False, height=32, width=320, num_frames=5,
                                   num_inference_steps=1, guidance_scale=5.0)
    assert np.array_equal(frames, plain[True]), "diffusers' tiled decode"
    difference = np.abs(plain[True] - plain[False])
    assert 0 < difference.max() <= TILE_MAX and difference.mean() <= TILE_MEAN


@pytest.mark.unit
def test_ltx2_tiles_are_its_vaes_and_split_frames_where_the_budget_needs(tiny_models, monkeypatch):
    """LTX-2's VAE decodes every frame at once (350 bytes per pixel of every frame: families/vaes.py), so at 0.05
    megapixels 25 frames tile even at 64x64: frame-wise, in tiles of 17 frames (diffusers' 16 and the frame it
    blends), the tiled figure counting those; wider frames also in its 512×512 tiles (not Wan's 256); 17 frames
    or fewer of at most 512 pixels never tile."""
    monkeypatch.setenv(settings.MAX_MEGAPIXELS.name, "0.05")
    ltx = _spec(tiny_models, "tiny-ltx2")
    why = f"({{}} megapixels per frame untiled: {settings.MAX_MEGAPIXELS.name}=0.05)"
    both = api.prepare_sample(ltx, _request(**{**LTX, "width": 544, "frames": 25}))
    assert both.req.tiled_vae and both.notes[-1] == (
        "VAE: decoding in 512×512 tiles of 17 frames (blended at the seams), because decoding 544x64 frames whole "
        "takes about 14.6× an image's memory per pixel; tiled, about 9.9×, more than the pixel budget allows "
        + why.format("0.00"))
    frames = api.prepare_sample(ltx, _request(**{**LTX, "frames": 25}))
    assert frames.req.tiled_vae and frames.notes[-1].startswith("VAE: decoding in tiles of 17 frames (blended")
    wide = api.prepare_sample(ltx, _request(**{**LTX, "width": 544, "frames": 9}))
    assert wide.req.tiled_vae and wide.notes[-1] == (
        "VAE: decoding in 512×512 tiles (blended at the seams), because decoding 544x64 frames whole takes about "
        "5.2× an image's memory per pixel, more than the pixel budget allows " + why.format("0.01"))
    for kw in ({"width": 512, "frames": 17}, {"frames": 9}):
        assert not api.prepare_sample(ltx, _request(**{**LTX, **kw})).req.tiled_vae


@pytest.mark.unit
def test_ltx2_tiled_decode_holds_a_tiles_frames_close_to_whole(tiny_models):
    """tiny-ltx2's VAE (in this process) as the worker sets it (worker/images.tile_vae): tiled, diffusers' tiled
    and frame-wise decode (equal to plain diffusers with both on), whose decoder never sees more than a tile's 3
    latent frames (17 frames); untiled, the whole decode, every frame at once. Within LTX_TILE_* of each other."""
    from diffusers import AutoencoderKLLTX2Video

    from backend.worker import images

    vae = AutoencoderKLLTX2Video.from_pretrained(str(tiny_models / "tiny-ltx2" / "vae"), local_files_only=True).eval()
    seen: list[int] = []
    vae.decoder.register_forward_pre_hook(lambda module, args: seen.append(args[0].shape[2]))
    decoded = {}
    with torch.inference_mode():
        for shape in ((4, 2, 2), (2, 2, 17)):  # 25 frames of 64x64; 9 frames of 64x544
            z = torch.randn(1, vae.config.latent_channels, *shape, generator=torch.Generator().manual_seed(0))
            for tiled in (True, False):
                seen.clear()
                images.tile_vae(vae, tiled)
                decoded[shape, tiled] = vae.decode(z).sample
                assert max(seen) == (min(shape[0], 3) if tiled else shape[0]) and vae.use_framewise_decoding == tiled
            vae.enable_tiling()
            vae.use_framewise_decoding = True
            assert torch.equal(decoded[shape, True], vae.decode(z).sample), "diffusers' tiled, frame-wise decode"
    for shape, most, mean in (((4, 2, 2), 1.1, LTX_FRAMES_MEAN), ((2, 2, 17), LTX_TILE_MAX, LTX_TILE_MEAN)):
        difference = (decoded[shape, True] - decoded[shape, False]).abs() / 2  # -1..1 to the frames' 0..1
        assert 0 < difference.max() <= most and difference.mean() <= mean, shape


@pytest.mark.workers
def test_ltx2_frames_over_the_budget_decode_frame_wise_in_the_worker(tiny_models, monkeypatch):
    """At 0.05 megapixels tiny-ltx2's 25 frames of 64x64 decode frame-wise in the worker: equal to plain diffusers'
    LTX2Pipeline with vae.enable_tiling() and use_framewise_decoding on (within PLAIN_TOLERANCE), and not to its
    whole decode."""
    from diffusers import LTX2Pipeline

    monkeypatch.setenv(settings.MAX_MEGAPIXELS.name, "0.05")
    req = _request(**{**LTX, "frames": 25, "steps": 2})
    prepared = api.prepare_sample(_spec(tiny_models, "tiny-ltx2"), req)
    assert prepared.req.tiled_vae
    frames = api.run_sample(prepared)
    plain = _plain_tiled_and_whole(LTX2Pipeline, tiny_models / "tiny-ltx2", True, height=64, width=64, num_frames=25,
                                   frame_rate=req.frame_rate, num_inference_steps=2, guidance_scale=req.guidance,
                                   **dict(OFF, audio_guidance_scale=req.guidance))
    assert frames.shape == (25, 64, 64, 3)
    assert np.abs(frames - plain[True]).max() <= PLAIN_TOLERANCE, "diffusers' tiled, frame-wise decode"
    assert np.abs(frames - plain[False]).max() > PLAIN_TOLERANCE, "not the whole decode"


# ---- Wan 2.2 A14B's two experts (tiny-wan22: the published boundary 0.875 and flow shift 12; 3 steps: high, high,
# low): every layout, compile and step cache treats the low-noise expert (transformer_2) as the high-noise one

FIRST_BLOCK = 0.5  # a first block cache threshold at which tiny-wan22 skips steps


def _pair_request(**kw) -> SampleRequest:
    return _request(**{"steps": 3, **kw})


@pytest.fixture(scope="module")
def plain_pair(tiny_models):
    """Plain diffusers' WanPipeline of tiny-wan22: `run(steps, cached, kind)` gives its frames (the step cache
    hook of `kind` on the experts named in `cached`) and which expert ran each step's first pass."""
    from diffusers import FirstBlockCacheConfig, TaylorSeerCacheConfig, WanPipeline

    pipe = WanPipeline.from_pretrained(str(tiny_models / "tiny-wan22"), dtype=torch.float32, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    ran: list[str] = []
    for name in ("transformer", "transformer_2"):
        getattr(pipe, name).register_forward_pre_hook(lambda *_, name=name: ran.append(name))

    def run(steps: int = 3, cached: tuple[str, ...] = (), kind: str = "taylorseer") -> tuple[np.ndarray, list[str]]:
        ran.clear()
        for name in ("transformer", "transformer_2"):
            module = getattr(pipe, name)
            if module.is_cache_enabled:
                module.disable_cache()
            if name in cached:
                module.enable_cache(TaylorSeerCacheConfig(cache_identifiers=list(TAYLORSEER_MODULES))
                                    if kind == "taylorseer" else FirstBlockCacheConfig(threshold=FIRST_BLOCK))
        with torch.inference_mode():
            frames = pipe(prompt=FOX, negative_prompt="blurry", height=32, width=32, num_frames=5,
                          num_inference_steps=steps, guidance_scale=5.0, output_type="np",
                          generator=[torch.Generator("cpu").manual_seed(11)]).frames[0]
        return frames, ran[::2]  # cond and uncond per step

    return run


@pytest.mark.workers
def test_step_caches_run_on_both_experts_as_plain_diffusers_with_a_hook_on_each(tiny_models, plain_pair):
    """14 steps: 9 of the high-noise expert, 5 of the low-noise one, whose own TaylorSeer hook computes its first 3
    and extrapolates its 4th and 5th. Bit-identical to plain WanPipeline with the hook on each expert, and not to
    one with the hook on the high-noise expert only (so the low-noise expert's hook did something). The first block
    cache, a hook on each expert too, equals plain WanPipeline with it."""
    assert np.array_equal(api.sample(_spec(tiny_models, "tiny-wan22"), _pair_request()), plain_pair()[0]), \
        "one worker, uncached: plain WanPipeline"
    spec, text = api.sampling_options(_spec(tiny_models, "tiny-wan22"), step_cache="taylorseer")
    assert "step_cache taylorseer" in text and "attention and feed-forward outputs" in text
    frames = api.sample(spec, _pair_request(steps=14))
    both, ran = plain_pair(14, ("transformer", "transformer_2"))
    assert ran == ["transformer"] * 9 + ["transformer_2"] * 5
    assert np.array_equal(frames, both)
    high_only = plain_pair(14, ("transformer",))[0]
    assert not np.array_equal(both, high_only), "the low-noise expert's hook extrapolated"
    assert not np.array_equal(high_only, plain_pair(14)[0]), "the high-noise expert's hook too"
    experts = api.worker_info()[0]["experts"]
    assert experts["denoiser"]["step_cache"] and experts["transformer_2"]["step_cache"]
    spec = api.sampling_options(_spec(tiny_models, "tiny-wan22"), step_cache="first block",
                                cache_threshold=FIRST_BLOCK)[0]
    frames = api.sample(spec, _pair_request(steps=14))
    assert np.array_equal(frames, plain_pair(14, ("transformer", "transformer_2"), "first block")[0])
    assert not np.array_equal(frames, plain_pair(14)[0]), "the first block cache skipped"
    with pytest.raises(ParallelError, match=r"'magcache' does not suit Wan .* For Wan use first block or taylorseer"):
        api.sampling_options(_spec(tiny_models, "tiny-wan22"), step_cache="magcache")


@pytest.mark.workers
def test_a_lora_goes_into_the_experts_its_load_lora_names(tiny_models, tmp_path_factory):
    """A Wan LoRA (diffusers' format, on every linear of the transformer) on the pair: 'both', 'high noise' and
    'low noise' each equal plain WanPipeline with load_lora_weights into those experts (load_into_transformer_2 for
    the low-noise one) and fuse_lora at the strength, bit for bit; on a one-denoiser model only 'both' is taken."""
    from lora_fixtures import load, make

    pair = _spec(tiny_models, "tiny-wan22")
    path, _ = make(tiny_models, "tiny-wan22", "diffusers", tmp_path_factory.mktemp("wan-lora"))
    with pytest.raises(ModelError, match=r"experts: 'low noise' picks one expert .* 'tiny-wan' has one denoiser; "
                                         r"choose 'both'"):
        api.with_lora(_spec(tiny_models), str(path), 0.7, experts="low noise")
    _, text = api.with_lora(pair, str(path), 0.7, experts="low noise")
    assert text.endswith("strength 0.7, text encoder 1, experts: low noise")
    for experts in ("both", "high noise", "low noise"):
        frames = api.sample(api.with_lora(pair, str(path), 0.7, experts=experts)[0], _pair_request())
        pipe = load(tiny_models, "tiny-wan22")
        components = {"both": ["transformer", "transformer_2"], "high noise": ["transformer"],
                      "low noise": ["transformer_2"]}[experts]
        for component in components:
            pipe.load_lora_weights(str(path), adapter_name=component,
                                   load_into_transformer_2=component == "transformer_2")
        pipe.fuse_lora(components=components, lora_scale=0.7)
        with torch.inference_mode():
            plain = pipe(prompt=FOX, negative_prompt="blurry", height=32, width=32, num_frames=5, num_inference_steps=3,
                         guidance_scale=5.0, output_type="np",
                         generator=[torch.Generator("cpu").manual_seed(11)]).frames[0]
        assert np.array_equal(frames, plain), experts
    assert api.worker_info()[0]["loras"][0]["experts"] == "low noise"


@pytest.mark.workers
def test_both_experts_compile_and_prompts_seeds_steps_never_recompile(tiny_models, plain_pair):
    """Both experts' repeated blocks compile (one graph serves both: the same block class and shapes); the warm-up
    runs 3 steps so that the low-noise expert runs in it too (2, the usual, stay above the boundary), and no later
    prompt, seed or step count (2: the high-noise expert only; 4: both) compiles anything."""
    spec, _ = api.with_compile(_spec(tiny_models, "tiny-wan22"), "repeated blocks", "eager", "32x32x5f", False)
    said = []
    warm = api.load(spec, said.append)["compile"]
    assert "warm-up 1/1: 32x32x5 frames (batch 1), 3 steps so that both experts run" in [
        m.text for m in said if isinstance(m, Status)]
    experts = api.worker_info()[0]["experts"]
    assert experts["denoiser"]["compiled"] == experts["transformer_2"]["compiled"] == 2, "2 blocks each"
    shape = next(s for s in warm["shapes"] if s["shape"] == "32x32x5 frames (batch 1)"
                 and s["component"].startswith("tiny-wan22/"))
    assert (shape["compiles"], shape["unexpected_recompiles"]) == (1, 0) and shape["graphs"] >= 1
    varied = [dict(seed=1, prompt="a lighthouse on a cliff at dusk, oil painting, warm light"), dict(steps=2),
              dict(steps=4, guidance=1.0, negative_prompt="")]
    frames = [api.sample(spec, _pair_request(**change)) for change in varied]
    stats = api.compile_stats()
    assert (stats["graphs"], stats["compiles"], stats["unexpected_recompiles"]) == (warm["graphs"], warm["compiles"], 0)
    assert stats["hits"] == warm["hits"] + len(varied)
    assert np.abs(api.sample(spec, _pair_request()) - plain_pair()[0]).max() <= CP_TOLERANCE, "the eager frames"
    assert all(f.shape == (5, 32, 32, 3) for f in frames)


# ---- two ranks (last: the tests above run on one worker, so the group is started once for them)

# LTX-2's videos for the layouts: 9 frames (2 latent frames × 2 × 2 = 8 video tokens, split over 2 context ranks)
# at 25 fps, the templates' rate, whose sound is 9 audio latents (as many as the frames: odd, so it runs whole on
# every rank), and at 22 fps, whose sound (round(9 / 22 × 25) = 10 audio latents) is split as the video is
LTX_SPLIT = {**LTX, "frame_rate": 22.0}
LTX_MODES = ("text to video", "image to video")


@pytest.fixture(scope="module")
def ltx_one_worker(tiny_models) -> dict[tuple[str, str, float], dict[str, np.ndarray]]:
    """Two videos with sound (seeds 11, 12) from one worker, with CFG (guidance 3, batched), by model (LTX-2,
    LTX-2.5), mode (text to video; image to video from two start images: a timestep per video token) and frame
    rate (25 fps for both models, 22 for LTX-2)."""
    made = {}
    for name, rate in (("tiny-ltx2", 25.0), ("tiny-ltx25", 25.0), ("tiny-ltx2", 22.0)):
        req = _request(batch_size=2, **{**LTX, "frame_rate": rate})
        for mode in LTX_MODES:
            made[name, mode, rate] = api.run_sample_outputs(api.prepare_sample(
                _spec(tiny_models, name), req, _start_images(req.width) if mode == "image to video" else None))
    return made


@pytest.mark.workers
@pytest.mark.parametrize("name, layout, rate", [
    ("tiny-wan", "context", None), ("tiny-wan", "cfg", None), ("tiny-wan", "data", None),
    ("tiny-ltx2", "context", 25.0), ("tiny-ltx2", "context", 22.0), ("tiny-ltx25", "context", 25.0),
    ("tiny-ltx2", "cfg", 25.0), ("tiny-ltx2", "data", 25.0)])
def test_layouts_of_two_ranks_equal_one_worker(tiny_models, one_worker, ltx_one_worker, name, layout, rate):
    """LTX-2's Context Parallel splits the video's tokens (and their rotary tables) over the ranks by the family's
    corrected plan (families/ltx2/cp.py) and the sound's where its audio latents split (22 fps: 10), gathering
    both outputs; at 25 fps (9 audio latents, odd) the sound runs whole on every rank. Its CFG Parallel splits its
    doubled batch and gathers both predictions: frames and sound within CP_TOLERANCE of one worker, in text and
    image to video (LTX-2 and LTX-2.5 under Context Parallel)."""
    spec = _spec(tiny_models, name)
    spec = {"context": lambda: api.context_parallel(spec, 2)[0], "cfg": lambda: api.cfg_parallel(spec)[0],
            "data": lambda: layouts.plan_dp(spec, 2)[0]}[layout]()
    assert spec.world_size == 2
    api.load(spec)
    before = [w["steps"] for w in api.worker_info()]
    ltx = name.startswith("tiny-ltx")
    req = _request(batch_size=2, **({**LTX, "frame_rate": rate} if ltx else {}))
    # CFG Parallel of a doubled batch (LTX-2) runs half batches, not bit-identical to the whole one (cfg_parallel.py)
    exact = layout == "data" or (layout == "cfg" and spec.family.cfg_passes == "branches")
    for mode in LTX_MODES if ltx else LTX_MODES[:1]:
        said: list[str] = []
        image = _start_images(req.width) if mode == "image to video" else None
        prepared = api.prepare_sample(spec, req, image)
        out = api.run_sample_outputs(prepared, lambda m, said=said: said.append(m.text)
                                     if isinstance(m, Status) else None)
        one = ltx_one_worker[name, mode, rate] if ltx else {"images": one_worker}
        whole = [n for n in prepared.notes if "the sound runs whole on every rank" in n]
        assert len(whole) == (layout == "context" and rate == 25.0), (mode, prepared.notes)
        assert out.keys() == one.keys() and out["images"].shape == one["images"].shape, mode
        assert not [t for t in said if t.startswith("CFG Parallel: this Sample runs one")], "CFG Parallel split"
        for key in ("images", "audio") if ltx else ("images",):
            if exact:
                assert np.array_equal(out[key], one[key]), (mode, key)
            else:
                assert np.abs(out[key] - one[key]).max() <= CP_TOLERANCE, (mode, key)
    if ltx:
        assert not np.array_equal(ltx_one_worker[name, LTX_MODES[0], rate]["images"],
                                  ltx_one_worker[name, LTX_MODES[1], rate]["images"]), "the start images count"
    steps = [w["steps"] - b for w, b in zip(api.worker_info(), before, strict=True)]
    runs = len(LTX_MODES) if ltx else 1
    assert steps == [runs * (2 if layout == "data" else 4)] * 2, "data: a video each; split models: both, every step"
    assert [e["denoiser"]["context_parallel"] for e in (w["experts"] for w in api.worker_info())] == [
        layout == "context"] * 2


@pytest.mark.workers
def test_ltx2_context_parallel_with_interleaved_rotary_embeddings_equals_one_worker(tiny_models, ltx_one_worker,
                                                                                    tmp_path):
    """The plan follows the transformer's rope_type: LTX-2's interleaved rotary tables ([batch, tokens, dims], the
    config's default; the published models use split ones, per head) are split on their token dimension too.
    tiny-ltx2 with rope_type "interleaved" (rotary tables have no weights): frames and sound under Context
    Parallel 2 within CP_TOLERANCE of one worker."""
    folder = tmp_path / "tiny-ltx2-interleaved"
    shutil.copytree(tiny_models / "tiny-ltx2", folder)
    config = json.loads((folder / "transformer" / "config.json").read_text())
    (folder / "transformer" / "config.json").write_text(json.dumps({**config, "rope_type": "interleaved"}))
    one = api.make_spec(folder.name, [str(tmp_path)])
    req = _request(batch_size=2, **LTX_SPLIT)
    ref = api.run_sample_outputs(api.prepare_sample(one, req))
    out = api.run_sample_outputs(api.prepare_sample(api.context_parallel(one, 2)[0], req))
    assert [e["denoiser"]["context_parallel"] for e in (w["experts"] for w in api.worker_info())] == [True] * 2
    for key in ("images", "audio"):
        assert out[key].shape == ref[key].shape and np.abs(out[key] - ref[key]).max() <= CP_TOLERANCE, key
    split = ltx_one_worker["tiny-ltx2", "text to video", 22.0]["images"]
    assert np.abs(ref["images"] - split).max() > 100 * CP_TOLERANCE, "another rotary layout: other frames"


@pytest.mark.workers
@pytest.mark.parametrize("layout", ["context", "cfg"])
def test_both_experts_take_the_layout_and_equal_one_worker(tiny_models, plain_pair, layout):
    """Context Parallel 2 gives both experts diffusers' ContextParallelConfig (frames within CP_TOLERANCE: Ulysses
    sums attention in another order), CFG Parallel splits both experts' passes (bit-identical: each rank computes
    whole passes). Against plain WanPipeline, which one worker equals bit for bit (the step cache test checks it)."""
    spec = _spec(tiny_models, "tiny-wan22")
    spec = api.context_parallel(spec, 2)[0] if layout == "context" else api.cfg_parallel(spec)[0]
    frames = api.sample(spec, _pair_request())
    experts = [w["experts"] for w in api.worker_info()]
    assert len(experts) == 2 and all(set(e) == {"denoiser", "transformer_2"} for e in experts)
    key = {"context": "context_parallel", "cfg": "cfg_split"}[layout]
    assert [(e["denoiser"][key], e["transformer_2"][key]) for e in experts] == [(True, True)] * 2, experts
    plain, ran = plain_pair()
    assert ran == ["transformer", "transformer", "transformer_2"], "3 steps reach the low-noise expert"
    if layout == "context":
        assert np.abs(frames - plain).max() <= CP_TOLERANCE
    else:
        assert np.array_equal(frames, plain)
