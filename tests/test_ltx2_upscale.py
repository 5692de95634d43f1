"""LTX-2's two-stage spatial upscale (Sample Video's upscale_model, families/ltx2/two_stage.py) through the
workers: frames and waveform equal plain diffusers running the same two stages (LTX2Pipeline or
LTX2ImageToVideoPipeline at half size into latents, LTX2LatentUpsamplePipeline, the pipeline again at full size
on the stage-2 sigmas with a non-shifting scheduler), within 1e-4; and the bad inputs, refused before any worker.
The upsampler is a tiny file in ComfyUI's layout (families/ltx2/tiny.py: upsampler)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from backend.controller import api
from backend.families.ltx2 import OFF, two_stage
from backend.families.ltx2.tiny import upsampler
from backend.protocol.errors import ModelError, SampleError
from backend.protocol.messages import Status
from backend.protocol.spec import SampleRequest

TOLERANCE = 1e-4
FOX = "a red fox in the snow"
SIGMAS = two_stage.TEMPLATE_SIGMAS
# tiny-ltx2 two-stage: 128x128 (stage 1 at 64x64: the tiny VAE's smallest), 9 frames, CFG 3 (batched), 25 fps
LTX = dict(prompt=FOX, negative_prompt="blurry", width=128, height=128, frames=9, steps=2, guidance=3.0, seed=11,
           frame_rate=25.0, upscale_sigmas=SIGMAS)


@pytest.fixture(scope="module")
def upscaler(tmp_path_factory) -> str:
    return str(upsampler(tmp_path_factory.mktemp("latent_upscale_models") / "ltx-2.3-spatial-upscaler-x2-tiny.safetensors"))


def _spec(tiny_models):
    return api.make_spec("tiny-ltx2", [str(tiny_models)])


@pytest.mark.unit
def test_upscale_inputs_are_checked_before_any_worker(tiny_models, upscaler, tmp_path):
    ltx = _spec(tiny_models)
    api.check_request(ltx, SampleRequest(**LTX, upscale_model=upscaler))
    with pytest.raises(SampleError, match=r"width: 96 is not a multiple of 64: with upscale_model the first stage "
                                          r"runs at half the size, a multiple of 32; use 64 or 128"):
        api.check_request(ltx, SampleRequest(**{**LTX, "width": 96}, upscale_model=upscaler))
    with pytest.raises(SampleError, match=r"upscale_sigmas: none given"):
        api.check_request(ltx, SampleRequest(**{**LTX, "upscale_sigmas": ()}, upscale_model=upscaler))
    wan = api.make_spec("tiny-wan", [str(tiny_models)])
    with pytest.raises(SampleError, match=r"upscale_model: Wan has no two-stage latent upscale \(LTX-2 has\)"):
        api.check_request(wan, SampleRequest(**{**LTX, "width": 32, "height": 32, "frames": 5},
                                             upscale_model=upscaler))
    assert two_stage.parse_sigmas("0.85, 0.7250, 0.4219, 0.0") == SIGMAS, "ManualSigmas' text, its last 0 dropped"
    for bad in ("0.85, x", "0.4219, 0.85", "1.5, 0.5", ""):
        with pytest.raises(ValueError, match=r"upscale_sigmas: .*0.85, 0.725, 0.4219"):
            two_stage.parse_sigmas(bad)
    other = tmp_path / "not-an-upsampler.safetensors"
    from safetensors.torch import save_file

    save_file({"weight": torch.zeros(2)}, str(other))
    with pytest.raises(ModelError, match=r"upscale_model: not-an-upsampler.safetensors is not an LTX-2 latent "
                                         r"upsampler"):
        two_stage.upsampler(str(other), torch.float32, "cpu")


@pytest.mark.unit
def test_a_comfyui_file_loads_as_its_config_says(upscaler):
    """The single file's shapes give diffusers' config; the weights are the file's."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    model = two_stage.upsampler(upscaler, torch.float32, "cpu")
    with safe_open(upscaler, "pt") as f:
        published = json.loads(f.metadata()["config"])
    assert {k: model.config[k] for k in published} == published
    assert model.config.use_rational_resampler and model.config.rational_spatial_scale == 2.0
    sd = load_file(upscaler)
    assert all(torch.equal(v, sd[k]) for k, v in model.state_dict().items())


def _plain(tiny_models, upscaler, cls: str, starts: np.ndarray | None) -> list[tuple[np.ndarray, np.ndarray]]:
    """Plain diffusers' two stages, for seeds 11 and 12 (start image i as a PIL image where `starts`)."""
    import diffusers
    from diffusers.pipelines.ltx2 import LTX2LatentUpsamplePipeline, LTX2LatentUpsamplerModel
    from safetensors import safe_open
    from safetensors.torch import load_file

    pipe = getattr(diffusers, cls).from_pretrained(str(tiny_models / "tiny-ltx2"), dtype=torch.float32,
                                                   local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    with safe_open(upscaler, "pt") as f:
        model = LTX2LatentUpsamplerModel(**json.loads(f.metadata()["config"]))
    model.load_state_dict(load_file(upscaler))
    up = LTX2LatentUpsamplePipeline(vae=pipe.vae, latent_upsampler=model.eval())
    shifting = pipe.scheduler
    fixed = diffusers.FlowMatchEulerDiscreteScheduler.from_config(shifting.config, use_dynamic_shifting=False,
                                                                  shift_terminal=None)
    call = dict(OFF, prompt=FOX, negative_prompt="blurry", num_frames=9, frame_rate=25.0, guidance_scale=3.0,
                audio_guidance_scale=3.0)
    out = []
    for i, seed in enumerate((11, 12)):
        generator = [torch.Generator("cpu").manual_seed(seed)]
        image = {"image": _pil(starts[i])} if starts is not None else {}
        with torch.inference_mode():
            pipe.scheduler = shifting
            first = pipe(height=64, width=64, num_inference_steps=2, output_type="latent", generator=generator,
                         **image, **call)
            video = up(latents=first.frames, height=64, width=64, num_frames=9, output_type="latent",
                       return_dict=False)[0]
            pipe.scheduler = fixed
            result = pipe(height=128, width=128, latents=video, audio_latents=first.audio, sigmas=list(SIGMAS),
                          num_inference_steps=len(SIGMAS), noise_scale=SIGMAS[0], output_type="np",
                          generator=generator, **image, **call)
        assert [round(s, 4) for s in pipe.scheduler.sigmas.tolist()] == [*SIGMAS, 0.0], "the sigmas as given"
        out.append((result.frames[0], result.audio[0].numpy()))
    return out


def _pil(image: np.ndarray):
    from PIL import Image

    return Image.fromarray((image * 255).round().astype(np.uint8))


@pytest.mark.workers
@pytest.mark.parametrize("cls", ["LTX2Pipeline", "LTX2ImageToVideoPipeline"])
def test_two_stages_equal_plain_diffusers(tiny_models, upscaler, cls):
    """Videos i (seed 11 + i, start image i) at full size, and their sound, equal plain diffusers' two stages; the
    progress counts both stages' steps (2 + 3 a video)."""
    from backend.protocol.messages import Step

    starts = ((np.random.default_rng(5).integers(0, 256, (2, 128, 128, 3)) / 255).astype(np.float32)
              if cls == "LTX2ImageToVideoPipeline" else None)
    req, steps = SampleRequest(**LTX, batch_size=2, upscale_model=upscaler), []
    out = api.run_sample_outputs(api.prepare_sample(_spec(tiny_models), req, starts),
                                 lambda m: steps.append(m) if isinstance(m, Step) else None)
    assert [(m.step, m.total) for m in steps] == [(i, 10) for i in range(1, 11)], "stage 1's 2 steps, then stage 2's 3"
    frames = out["images"]
    assert frames.shape == (18, 128, 128, 3), "full size: stage 1 ran at half, the upsampler doubled it"
    for video, (plain_frames, plain_audio) in enumerate(_plain(tiny_models, upscaler, cls, starts)):
        assert np.abs(frames[9 * video:9 * (video + 1)] - plain_frames).max() <= TOLERANCE, f"video {video}"
        assert np.abs(out["audio"][video] - plain_audio).max() <= TOLERANCE, f"video {video}'s sound"
    one = api.run_sample_outputs(api.prepare_sample(_spec(tiny_models), SampleRequest(**LTX), starts), lambda m: None)
    assert np.abs(one["images"][:9] - frames[:9]).max() > 1e-3, "upscale_model none: one stage, another video"


@pytest.mark.workers
@pytest.mark.parametrize("rate", [25.0, 22.0])
def test_two_stages_under_context_parallel_equal_one_worker(tiny_models, upscaler, rate):
    """Context Parallel 2 splits both stages (LTX-2's corrected plan, families/ltx2/cp.py): the video's tokens (8 at
    stage 1's 64x64, 32 at 128x128) split evenly, and the sound's 10 audio latents at 22 fps; at 25 fps, the
    templates' rate, its 9 stay whole on every rank in both stages. Frames and sound within TOLERANCE of one
    worker."""
    req = SampleRequest(**{**LTX, "frame_rate": rate}, batch_size=2, upscale_model=upscaler)
    one = api.run_sample_outputs(api.prepare_sample(_spec(tiny_models), req), lambda m: None)
    cp, _ = api.context_parallel(_spec(tiny_models), 2)
    out = api.run_sample_outputs(api.prepare_sample(cp, req), lambda m: None)
    assert [w["experts"]["denoiser"]["context_parallel"] for w in api.worker_info()] == [True] * 2
    for key in ("images", "audio"):
        assert out[key].shape == one[key].shape and np.abs(out[key] - one[key]).max() <= TOLERANCE, key


@pytest.mark.workers
def test_compiled_two_stages_compile_once_and_never_again(tiny_models, upscaler):
    """A full-size warm-up does not build stage 1's half-size graph: the first two-stage video compiles it, once and
    announced; other seeds, prompts and steps reuse both (0 unexpected recompiles), and the frames and sound are
    the eager two stages'."""
    spec, _ = api.with_compile(_spec(tiny_models), "whole denoiser", "eager", "128x128x9f", False)
    assert api.load(spec)["compile"]["unexpected_recompiles"] == 0
    said = []
    api.run_sample_outputs(api.prepare_sample(spec, SampleRequest(**LTX, upscale_model=upscaler), None),
                           lambda m: said.append(m.text) if isinstance(m, Status) else None)
    assert "compiling 128x128x9 frames (batch 1, CFG, 9 audio latents, two stages) for the first time…" in said, said
    first = api.compile_stats()
    assert first["unexpected_recompiles"] == 0, said
    for change in (dict(seed=4, steps=3), dict(prompt="a lighthouse on a cliff at dusk, oil painting", seed=2)):
        last = api.run_sample_outputs(api.prepare_sample(spec, SampleRequest(**{**LTX, **change},
                                                                             upscale_model=upscaler), None))
    stats = api.compile_stats()
    assert (stats["compiles"], stats["graphs"], stats["unexpected_recompiles"]) == (first["compiles"],
                                                                                    first["graphs"], 0)
    eager = api.run_sample_outputs(api.prepare_sample(_spec(tiny_models), SampleRequest(
        **{**LTX, **change}, upscale_model=upscaler), None))
    for key in ("images", "audio"):
        assert np.abs(last[key] - eager[key]).max() <= TOLERANCE, key


@pytest.mark.unit
def test_a_new_shape_whose_graphs_were_built_already_is_seen_once_not_announced_forever():
    """Both of a two-stage call's sizes warmed up: its first call builds no graph; it counts as a hit, and the next
    call is no longer a first compile."""
    from backend.worker.compiler import Compiler, Shape

    said = []
    compiler, shape = Compiler(said.append), Shape(128, 128, 1, True, 128, frames=9, task="two stages")
    nothing = {"graphs": 0, "seconds": 0.0, "disk_hits": 0, "disk_misses": 0}
    compiler._record(shape, True, {"hits": 0}, nothing, 0.1, ended=False)
    assert shape not in compiler.seen, "stopped before the denoiser ran: still a first compile"
    entry = {"hits": 0, "unexpected_recompiles": 0}
    compiler._record(shape, True, entry, nothing, 0.1)
    assert shape in compiler.seen and entry["hits"] == 1 and compiler.totals["compiles"] == 0 and not said


@pytest.mark.workers
@pytest.mark.parametrize("fmt", ["lightricks", "comfy"])
def test_the_distilled_lora_equals_diffusers_own_load_and_fuse(tiny_models, tmp_path_factory, fmt):
    """Load LoRA on LTX-2, as the templates put the distilled LoRA on the dev model (strength 0.5): frames and sound
    equal plain LTX2Pipeline with load_lora_weights + fuse_lora(lora_scale=0.5), in Lightricks' own layout
    (lora_A/lora_B under diffusion_model.) and in ComfyUI's LoraSave layout (lora_up/lora_down, fp16, zero
    .diff_b: which diffusers 0.42.1 cannot read, so plain diffusers gets it renamed to lora_A/lora_B here)."""
    from lora_fixtures import fuse, load, make

    path, _ = make(tiny_models, "tiny-ltx2", fmt, tmp_path_factory.mktemp(f"ltx2-lora-{fmt}"))
    req = SampleRequest(**{k: v for k, v in LTX.items() if k != "upscale_sigmas"} | dict(width=64, height=64))
    spec, text = api.with_lora(_spec(tiny_models), str(path), 0.5)
    assert f"{path.name}: strength 0.5" in text
    out = api.run_sample_outputs(api.prepare_sample(spec, req, None), lambda m: None)
    pipe = load(tiny_models, "tiny-ltx2")
    base = pipe(prompt=FOX, negative_prompt="blurry", height=64, width=64, num_frames=9, frame_rate=25.0,
                num_inference_steps=2, guidance_scale=3.0, audio_guidance_scale=3.0, output_type="np",
                generator=[torch.Generator("cpu").manual_seed(11)], **dict(OFF))
    fuse(pipe, [(str(path) if fmt == "lightricks" else _peft_names(path), 0.5)])
    with torch.inference_mode():
        plain = pipe(prompt=FOX, negative_prompt="blurry", height=64, width=64, num_frames=9, frame_rate=25.0,
                     num_inference_steps=2, guidance_scale=3.0, audio_guidance_scale=3.0, output_type="np",
                     generator=[torch.Generator("cpu").manual_seed(11)], **dict(OFF))
    assert np.abs(out["images"] - plain.frames[0]).max() <= TOLERANCE
    assert np.abs(out["audio"][0] - plain.audio[0].numpy()).max() <= TOLERANCE
    assert np.abs(base.frames[0] - plain.frames[0]).max() > 1e-3, "the LoRA changes the video"


def _peft_names(path) -> dict:
    """A ComfyUI LoraSave file as diffusers reads LTX-2 LoRAs: lora_down/lora_up as lora_A/lora_B, no .diff_b."""
    from safetensors.torch import load_file

    names = {".lora_down.weight": ".lora_A.weight", ".lora_up.weight": ".lora_B.weight"}
    return {k.replace(end, names[end]): v for k, v in load_file(str(path)).items()
            for end in names if k.endswith(end)}


@pytest.mark.workers
def test_dual_guidance_equals_diffusers_video_and_audio_guidance(tiny_models):
    """Sample Video's guidance and audio_guidance, as LTXVDualCFGGuider's video_cfg and audio_cfg: plain CFG on
    each stream (no STG, modality isolation or rescale) = LTX2Pipeline's guidance_scale and audio_guidance_scale."""
    req = SampleRequest(**{k: v for k, v in LTX.items() if k != "upscale_sigmas"} | dict(width=64, height=64),
                        audio_guidance=6.0)
    out = api.run_sample_outputs(api.prepare_sample(_spec(tiny_models), req, None), lambda m: None)
    from lora_fixtures import load

    pipe = load(tiny_models, "tiny-ltx2")
    results = []
    for audio in (6.0, 3.0):
        with torch.inference_mode():
            results.append(pipe(prompt=FOX, negative_prompt="blurry", height=64, width=64, num_frames=9,
                                frame_rate=25.0, num_inference_steps=2, output_type="np",
                                generator=[torch.Generator("cpu").manual_seed(11)],
                                **dict(OFF, guidance_scale=3.0, audio_guidance_scale=audio)))
    plain, same = results
    assert np.abs(out["images"] - plain.frames[0]).max() <= TOLERANCE
    assert np.abs(out["audio"][0] - plain.audio[0].numpy()).max() <= TOLERANCE
    assert np.abs(out["audio"][0] - same.audio[0].numpy()).max() > 1e-4, "the sound's own guidance counts"
    wan = api.make_spec("tiny-wan", [str(tiny_models)])
    with pytest.raises(SampleError, match=r"audio_guidance: Wan has no guidance of its own for a sound"):
        api.check_request(wan, SampleRequest(prompt=FOX, width=32, height=32, frames=5, audio_guidance=2.0))


@pytest.mark.workers
@pytest.mark.parametrize("cls", ["LTX2Pipeline", "LTX2ImageToVideoPipeline"])
def test_ltx25_with_gemma4_equals_plain_diffusers(tiny_models, cls):
    """tiny-ltx25 (LTX-2.5's Gemma 4 text encoder, Gemma4UnifiedForConditionalGeneration; its DiT without
    feed-forward biases) through the workers equals plain diffusers, text and image to video, frames and sound."""
    import diffusers

    starts = ((np.random.default_rng(5).integers(0, 256, (1, 64, 64, 3)) / 255).astype(np.float32)
              if cls == "LTX2ImageToVideoPipeline" else None)
    spec = api.make_spec("tiny-ltx25", [str(tiny_models)])
    req = SampleRequest(**{k: v for k, v in LTX.items() if k != "upscale_sigmas"} | dict(width=64, height=64))
    out = api.run_sample_outputs(api.prepare_sample(spec, req, starts), lambda m: None)
    pipe = getattr(diffusers, cls).from_pretrained(str(tiny_models / "tiny-ltx25"), dtype=torch.float32,
                                                   local_files_only=True)
    assert type(pipe.text_encoder).__name__ == "Gemma4UnifiedForConditionalGeneration"
    image = {"image": _pil(starts[0])} if starts is not None else {}
    with torch.inference_mode():
        plain = pipe(prompt=FOX, negative_prompt="blurry", height=64, width=64, num_frames=9, frame_rate=25.0,
                     num_inference_steps=2, output_type="np", generator=[torch.Generator("cpu").manual_seed(11)],
                     **image, **dict(OFF, guidance_scale=3.0, audio_guidance_scale=3.0))
    assert np.abs(out["images"] - plain.frames[0]).max() <= TOLERANCE
    assert np.abs(out["audio"][0] - plain.audio[0].numpy()).max() <= TOLERANCE


@pytest.mark.workers
def test_cfg_parallel_splits_when_only_the_sound_is_guided(tiny_models):
    """Video CFG 1 with audio CFG 4 still runs the negative prompt pass (diffusers: either above 1), which CFG
    Parallel splits over its two ranks: frames and sound within 1e-4 of one worker."""
    req = SampleRequest(**{k: v for k, v in LTX.items() if k != "upscale_sigmas"}
                        | dict(width=64, height=64, guidance=1.0), audio_guidance=4.0)
    one = api.run_sample_outputs(api.prepare_sample(_spec(tiny_models), req, None), lambda m: None)
    said = []
    split = api.cfg_parallel(_spec(tiny_models))[0]
    out = api.run_sample_outputs(api.prepare_sample(split, req, None),
                                 lambda m: said.append(m.text) if isinstance(m, Status) else None)
    assert not [t for t in said if t.startswith("CFG Parallel: this Sample runs one")], "the passes were split"
    for key in ("images", "audio"):
        assert np.abs(out[key] - one[key]).max() <= TOLERANCE, key
