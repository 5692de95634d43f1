"""LTX-2 in compiled mode at another frame rate than Sample Video's default (worker/compiler.py): the sound has
frames / frame_rate seconds of latents (25 a second on tiny-ltx2, as on LTX-2.3), a shape of the denoiser's own, so
the Compile node's warm-up names the frame rate ('64x64x17f@25fps', as the LTX-2.3 i2v template runs 25 fps). A
25 fps warm-up, then 25 fps videos over seeds, steps and prompts: compiled once, 0 unexpected recompiles, the
frames and sound of eager mode within 1e-4. A rate the warm-up did not name whose sound has another length is a
new shape, compiled once and announced, not an unexpected recompile."""

from __future__ import annotations

import numpy as np
import pytest

from backend.controller import api
from backend.protocol.messages import Status
from backend.protocol.spec import SampleRequest

TOLERANCE = 1e-4
# 17 frames: 17 audio latents at 25 fps, 18 at Sample Video's default 24, 19 at 22
LTX = dict(prompt="a red fox in the snow", negative_prompt="blurry", width=64, height=64, frames=17, steps=2,
           guidance=3.0, seed=11, frame_rate=25.0)


@pytest.mark.workers
def test_a_25_fps_warm_up_compiles_the_25_fps_videos_graph_once_and_never_again(tiny_models):
    api.shutdown()  # fresh workers: a worker's totals count from its start (a reused one holds earlier tests')
    base = api.make_spec("tiny-ltx2", [str(tiny_models)])
    spec, _ = api.with_compile(base, "whole denoiser", "eager", "64x64x17f@25fps", False)
    said = []
    warm = api.load(spec, lambda m: said.append(m.text) if isinstance(m, Status) else None)["compile"]
    assert "warm-up 1/1: 64x64x17 frames at 25 fps (batch 1)" in said, said
    assert (warm["compiles"], warm["unexpected_recompiles"]) == (1, 0), warm
    assert [s["shape"] for s in warm["shapes"]] == ["64x64x17 frames (batch 1, CFG, 17 audio latents)"], warm
    for change in ({}, dict(seed=4, steps=3), dict(prompt="a lighthouse on a cliff at dusk, oil painting", seed=2)):
        last = api.run_sample_outputs(api.prepare_sample(spec, SampleRequest(**{**LTX, **change})))
    stats = api.compile_stats()
    assert (stats["compiles"], stats["graphs"], stats["unexpected_recompiles"], stats["hits"]) == (
        1, warm["graphs"], 0, 3), stats
    # 22 fps, not warmed up: its sound's 19 latents are a shape of their own, compiled once and said as such
    said.clear()
    api.run_sample_outputs(api.prepare_sample(spec, SampleRequest(**{**LTX, "frame_rate": 22.0})),
                           lambda m: said.append(m.text) if isinstance(m, Status) else None)
    assert "compiling 64x64x17 frames (batch 1, CFG, 19 audio latents) for the first time…" in said, said
    after = api.compile_stats()
    assert (after["compiles"], after["unexpected_recompiles"]) == (2, 0), after
    assert after["graphs"] > stats["graphs"]
    eager = api.run_sample_outputs(api.prepare_sample(base, SampleRequest(**{**LTX, **change})))
    for key in ("images", "audio"):
        assert last[key].shape == eager[key].shape and np.abs(last[key] - eager[key]).max() <= TOLERANCE, key
