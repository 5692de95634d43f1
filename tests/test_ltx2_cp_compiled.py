"""LTX-2 in compiled mode under Context Parallel 2 (families/ltx2/cp.py's plan, worker/compiler.py): the denoiser
compiles once, in the warm-up, and other seeds, steps and prompts reuse it (0 unexpected recompiles); the frames
and sound are one eager worker's within 1e-4. Both of cp.py's cases: the sound whole on every rank (9 frames at 25
fps: 9 audio latents) and split (17 frames at 24 fps, the warm-up's rate: 18). diffusers' context-parallel hooks
log a warning inside the graph where they leave the [batch] timestep whole, which Dynamo is told to skip (without
that, fullgraph fails on the first call)."""

from __future__ import annotations

import numpy as np
import pytest

from backend.controller import api
from backend.protocol.spec import SampleRequest

TOLERANCE = 1e-4
LTX = dict(prompt="a red fox in the snow", negative_prompt="blurry", width=64, height=64, steps=2, guidance=3.0,
           seed=11)


@pytest.mark.workers
@pytest.mark.parametrize("frames, rate, whole", [(9, 25.0, True), (17, 24.0, False)])
def test_compiled_under_context_parallel_compiles_once_and_equals_one_eager_worker(tiny_models, frames, rate,
                                                                                    whole):
    api.shutdown()  # fresh workers: a worker's totals count from its start (a reused one holds earlier tests')
    one = api.make_spec("tiny-ltx2", [str(tiny_models)])
    cp, _ = api.context_parallel(one, 2)
    spec, _ = api.with_compile(cp, "whole denoiser", "eager", f"64x64x{frames}f", False)
    warm = api.load(spec)["compile"]
    assert (warm["compiles"], warm["unexpected_recompiles"]) == (1, 0), warm
    video = dict(LTX, frames=frames, frame_rate=rate)
    notes = api.prepare_sample(spec, SampleRequest(**video)).notes
    assert any("the sound runs whole on every rank" in n for n in notes) == whole, notes
    for change in ({}, dict(seed=4, steps=3), dict(prompt="a lighthouse on a cliff at dusk, oil painting", seed=2)):
        last = api.run_sample_outputs(api.prepare_sample(spec, SampleRequest(**{**video, **change})))
    stats = api.compile_stats()
    assert (stats["compiles"], stats["graphs"], stats["unexpected_recompiles"]) == (1, warm["graphs"], 0), stats
    assert stats["hits"] == 3
    assert [w["experts"]["denoiser"]["context_parallel"] for w in api.worker_info()] == [True] * 2
    eager = api.run_sample_outputs(api.prepare_sample(one, SampleRequest(**{**video, **change})))
    for key in ("images", "audio"):
        assert last[key].shape == eager[key].shape and np.abs(last[key] - eager[key]).max() <= TOLERANCE, key
