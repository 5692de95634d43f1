"""LTX-2 on the templates' stage-1 ManualSigmas, as Sampling Options' sigmas: run as given, as ComfyUI's
ManualSigmas runs them (the scheduler's dynamic shift and shift_terminal off: Pipeline.sigmas_as_given), in one
stage and as stage 1 of the two-stage upscale (stage 2 keeps Sample Video's upscale_sigmas). Frames and sound equal
plain diffusers' LTX2Pipeline / LTX2ImageToVideoPipeline called with `sigmas=` on that scheduler, within 1e-4."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from backend.controller import api
from backend.families.ltx2 import OFF, two_stage
from backend.families.ltx2.tiny import upsampler
from backend.protocol import messages
from backend.protocol.spec import SampleRequest

TOLERANCE = 1e-4
FOX = "a red fox in the snow"
# the LTX-2.3 / 2.5 templates' stage-1 ManualSigmas, as their node writes them
DISTILLED = "1.0, 0.99375, 0.9875, 0.98125, 0.975, 0.909375, 0.725, 0.421875, 0.0"
SIGMAS = (1.0, 0.99375, 0.9875, 0.98125, 0.975, 0.909375, 0.725, 0.421875)
# tiny-ltx2 (stage 1 of the two stages at 64x64, the tiny VAE's smallest), 9 frames, CFG 3 (batched), 25 fps
LTX = dict(prompt=FOX, negative_prompt="blurry", width=128, height=128, frames=9, steps=2, guidance=3.0, seed=11,
           frame_rate=25.0, upscale_sigmas=two_stage.TEMPLATE_SIGMAS)


@pytest.fixture(scope="module")
def upscaler(tmp_path_factory) -> str:
    return str(upsampler(tmp_path_factory.mktemp("latent_upscale_models") / "ltx-2.3-spatial-upscaler-x2-tiny.safetensors"))


def _options(tiny_models):
    return api.sampling_options(api.make_spec("tiny-ltx2", [str(tiny_models)]), sigmas=DISTILLED)


@pytest.mark.unit
def test_ltx2_takes_the_templates_stage1_sigmas_and_its_steps_follow_them(tiny_models, upscaler):
    """The templates' ManualSigmas text is diffusers' own distilled schedule; Sample Video's steps follow it (8,
    then stage 2's 3)."""
    from diffusers.pipelines.ltx2.utils import DISTILLED_SIGMA_VALUES

    spec, text = _options(tiny_models)
    assert spec.sigmas == SIGMAS == tuple(DISTILLED_SIGMA_VALUES)
    assert "sigmas: 8 steps on your schedule" in text and "as given: its scheduler's shift off" in text, text
    prepared = api.prepare_sample(spec, SampleRequest(**LTX, upscale_model=upscaler))
    assert prepared.req.steps == 8 and "steps follow Sampling Options' sigmas: 8 (not 2)" in prepared.notes
    assert messages.steps_per_image(prepared.req) == 8 + 3


def _plain(tiny_models, cls: str, start: np.ndarray | None, upscaler: str | None):
    """Plain diffusers on the sigmas as given (FlowMatchEulerDiscreteScheduler without dynamic shifting): one stage
    at 64x64, or with `upscaler` the two stages (stage 1 at half size into latents, the x2 upsampler, stage 2 on
    the templates' upscale sigmas)."""
    import diffusers
    from diffusers.pipelines.ltx2 import LTX2LatentUpsamplePipeline, LTX2LatentUpsamplerModel
    from PIL import Image
    from safetensors import safe_open
    from safetensors.torch import load_file

    pipe = getattr(diffusers, cls).from_pretrained(str(tiny_models / "tiny-ltx2"), dtype=torch.float32,
                                                   local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    pipe.scheduler = diffusers.FlowMatchEulerDiscreteScheduler.from_config(
        pipe.scheduler.config, use_dynamic_shifting=False, shift_terminal=None)
    call = dict(OFF, prompt=FOX, negative_prompt="blurry", num_frames=9, frame_rate=25.0, guidance_scale=3.0,
                audio_guidance_scale=3.0, generator=[torch.Generator("cpu").manual_seed(11)])
    if start is not None:
        call["image"] = Image.fromarray((start * 255).round().astype(np.uint8))
    with torch.inference_mode():
        first = pipe(height=64, width=64, sigmas=list(SIGMAS), num_inference_steps=len(SIGMAS),
                     output_type="latent" if upscaler else "np", **call)
        assert [round(s, 6) for s in pipe.scheduler.sigmas.tolist()] == [*SIGMAS, 0.0], "the sigmas as given"
        if upscaler is None:
            return first
        with safe_open(upscaler, "pt") as f:
            model = LTX2LatentUpsamplerModel(**json.loads(f.metadata()["config"]))
        model.load_state_dict(load_file(upscaler))
        up = LTX2LatentUpsamplePipeline(vae=pipe.vae, latent_upsampler=model.eval())
        video = up(latents=first.frames, height=64, width=64, num_frames=9, output_type="latent",
                   return_dict=False)[0]
        stage2 = list(two_stage.TEMPLATE_SIGMAS)
        return pipe(height=128, width=128, latents=video, audio_latents=first.audio, sigmas=stage2,
                    num_inference_steps=len(stage2), noise_scale=stage2[0], output_type="np", **call)


@pytest.mark.workers
@pytest.mark.parametrize("cls, stages", [("LTX2Pipeline", 1), ("LTX2ImageToVideoPipeline", 2)])
def test_the_templates_stage1_sigmas_equal_plain_diffusers_called_with_them(tiny_models, upscaler, cls, stages):
    """Sampling Options' sigmas (the templates' 8 distilled values) reach the LTX-2 call as `sigmas=`, unshifted:
    text to video in one stage, and image to video as stage 1 of the two stages; frames and sound equal plain
    diffusers within 1e-4, and differ from LTX-2's own schedule for the same steps."""
    start = ((np.random.default_rng(5).integers(0, 256, (1, 128, 128, 3)) / 255).astype(np.float32)
             if cls == "LTX2ImageToVideoPipeline" else None)
    size = dict(width=64, height=64) if stages == 1 else {}
    extra = dict(upscale_model=upscaler) if stages == 2 else {}
    spec, _ = _options(tiny_models)
    req = SampleRequest(**{**LTX, **size, "steps": 8}, **extra)
    out = api.run_sample_outputs(api.prepare_sample(spec, req, start), lambda m: None)
    plain = _plain(tiny_models, cls, None if start is None else start[0], upscaler if stages == 2 else None)
    assert out["images"].shape == plain.frames[0].shape
    assert np.abs(out["images"] - plain.frames[0]).max() <= TOLERANCE
    assert np.abs(out["audio"][0] - plain.audio[0].numpy()).max() <= TOLERANCE
    own = api.run_sample_outputs(api.prepare_sample(api.make_spec("tiny-ltx2", [str(tiny_models)]), req, start),
                                 lambda m: None)
    assert np.abs(own["images"] - out["images"]).max() > 1e-3, "LTX-2's own (shifted) schedule: another video"


@pytest.mark.workers
def test_compiled_the_sigmas_build_no_graph_of_their_own(tiny_models):
    """In compiled mode the templates' sigmas run on the warm-up's graph (their timesteps are values, not shapes):
    0 unexpected recompiles over seeds, and the frames of eager mode on the same sigmas."""
    spec, _ = api.with_compile(api.make_spec("tiny-ltx2", [str(tiny_models)]), "whole denoiser", "eager",
                               "64x64x9f", False)
    spec, _ = api.sampling_options(spec, sigmas=DISTILLED)
    warm = api.load(spec)["compile"]
    video = dict(LTX, width=64, height=64, frame_rate=24.0)
    for seed in (11, 3):
        out = api.run_sample_outputs(api.prepare_sample(spec, SampleRequest(**{**video, "seed": seed})))
    stats = api.compile_stats()
    assert (stats["compiles"], stats["graphs"], stats["unexpected_recompiles"], stats["hits"]) == (
        1, warm["graphs"], 0, 2), stats
    eager, _ = _options(tiny_models)
    plain = api.run_sample_outputs(api.prepare_sample(eager, SampleRequest(**{**video, "seed": 3})))
    for key in ("images", "audio"):
        assert np.abs(out[key] - plain[key]).max() <= TOLERANCE, key
