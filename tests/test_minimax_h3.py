"""MiniMax H3 (issue 37), diffusers' modular pipeline through the same family declaration as FLUX 3: text to video
with sound (t2va) through the pack's API, frames and waveform equal to plain diffusers' MiniMaxH3ModularPipeline;
frame counts it cannot make refused before any worker starts."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from backend.controller import api
from backend.protocol.errors import ModelError
from backend.protocol.spec import SampleRequest

FRAMES = 124  # 17·7 + 5: the shortest video the model makes (5.17 s at 24 fps)


def _request(**kw) -> SampleRequest:
    base = dict(prompt="a robot dancing", width=32, height=32, frames=FRAMES, steps=2, guidance=1.0, seed=5,
                batch_size=1)
    return SampleRequest(**{**base, **kw})


@pytest.mark.workers
def test_text_to_video_with_sound_equals_plain_diffusers(tiny_models):
    from diffusers.modular_pipelines import ModularPipeline

    spec = api.make_spec("tiny-minimax-h3", [str(tiny_models)])
    req = _request()
    out = api.run_sample_outputs(api.prepare_sample(spec, req))
    frames, audio = out["images"], out["audio"]
    assert frames.shape == (FRAMES, 32, 32, 3)
    pipe = ModularPipeline.from_pretrained(str(tiny_models / "tiny-minimax-h3"), workflow="t2va")
    pipe.load_components(dtype=torch.float32)
    state = pipe(prompt=req.prompt, height=32, width=32, num_frames=FRAMES, num_inference_steps=2,
                 generator=torch.Generator("cpu").manual_seed(req.seed), output_type="np")
    plain_audio = state.get("audio").float().numpy()
    assert np.abs(frames - np.asarray(state.get("videos"), dtype=np.float32)[0]).max() <= 1e-4
    assert audio.shape == plain_audio.shape == (1, 2, 41400)  # 207 audio latents x hop 200
    assert np.abs(audio - plain_audio).max() <= 1e-4
    assert int(out["audio_rate"][0]) == state.get("sampling_rate") == 8000  # the rate Sample Video gives ComfyUI


@pytest.mark.unit
@pytest.mark.parametrize(("frames", "fix"), [(125, "use 124 or 141"), (22, "use 124"), (362, "use 345")])
def test_frame_counts_it_cannot_make_are_refused(tiny_models, frames, fix):
    spec = api.make_spec("tiny-minimax-h3", [str(tiny_models)])
    with pytest.raises(ModelError, match=rf"frames: MiniMax H3 .*{fix}"):
        api.check_request(spec, _request(frames=frames))
