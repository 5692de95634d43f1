"""Step caching (Sampling Options): diffusers' cache hooks on the denoiser, in every layout.

Tolerances, float32 images in 0..1, against plain diffusers with the same hook configured (`enable_cache`):
- one worker, CFG Parallel (each rank one branch under its own cache context), Data Parallel: bit-identical.
- Shard TP and Context Parallel: TOLERANCE, as without caching (a split matmul or attention sums in another
  order), with the same steps skipped (a different skip would differ by about the cache's own effect, which
  each test also checks is far larger).
Each test first checks that the cache changed the image (it skipped something), so equality is not vacuous.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from lora_fixtures import fuse, load, make

from backend.controller import api
from backend.families import flux1, qwenimage
from backend.protocol.errors import CompileError, ParallelError
from backend.protocol.spec import MODE_CHOICES, SampleRequest
from backend.worker.step_cache import config

TOLERANCE = 1e-4
FOX, NEG = "a red fox in the snow", "blurry"
STEPS = 10
# (model, kind, threshold): thresholds at which the tiny random-weight models skip steps
CASES = [("tiny-flux", "first block", 0.5), ("tiny-flux", "taylorseer", 0.0), ("tiny-flux", "magcache", 0.0),
         ("tiny-qwenimage", "first block", 0.5), ("tiny-qwenimage", "taylorseer", 0.0),
         ("tiny-flux2", "taylorseer", 0.0)]
GUIDANCE = {"tiny-flux": 0.0, "tiny-qwenimage": 4.0, "tiny-flux2": 1.0}
# the modules TaylorSeer extrapolates; FLUX.2 [klein]: diffusers' default (each block's attention)
TAYLORSEER_MODULES = {"tiny-flux": flux1.TAYLORSEER_MODULES, "tiny-qwenimage": qwenimage.TAYLORSEER_MODULES}


def _spec(tiny_models, name="tiny-flux", **kw):
    return api.make_spec(name, [str(tiny_models)], **kw)


def _cached(spec, kind, threshold=0.0, true_cfg=1.0):
    return api.sampling_options(spec, true_cfg_scale=true_cfg, step_cache=kind, cache_threshold=threshold)[0]


def _request(name="tiny-flux", **kw) -> SampleRequest:
    return SampleRequest(**{"prompt": FOX, "width": 64, "height": 64, "steps": STEPS, "guidance": GUIDANCE[name],
                            "seed": 3, **kw})


def _plain(tiny_models, name, kind, threshold, loras=(), true_cfg=1.0, seeds=(3,)) -> np.ndarray:
    """What a plain diffusers script makes with the same hook (and LoRAs fused), one call per image."""
    pipe = load(tiny_models, name)
    fuse(pipe, loras, ["transformer"])
    if loras:
        pipe.unload_lora_weights()
    if kind != "off":
        pipe.transformer.enable_cache(config(kind, threshold, STEPS, TAYLORSEER_MODULES.get(name, ())))
    kw = {"prompt": FOX, "num_inference_steps": STEPS, "height": 64, "width": 64, "output_type": "np"}
    if name == "tiny-qwenimage":
        kw.update(true_cfg_scale=GUIDANCE[name], negative_prompt="")
    else:
        kw.update(guidance_scale=GUIDANCE[name])
    if true_cfg > 1:
        kw.update(true_cfg_scale=true_cfg, negative_prompt=NEG)
    out = []
    with torch.inference_mode():
        for seed in seeds:
            out.append(pipe(**kw, generator=[torch.Generator("cpu").manual_seed(seed)]).images)
    return np.concatenate(out)


# ---- checked before any worker starts

@pytest.mark.unit
def test_step_cache_is_checked_and_said(tiny_models):
    spec, text = api.sampling_options(_spec(tiny_models), step_cache="first block")
    assert spec.step_cache == "first block" and "threshold 0.08" in text and "not the same pixels" in text
    assert api.sampling_options(_spec(tiny_models))[0].step_cache == "off", "off by default"
    qwen = api.sampling_options(_spec(tiny_models, "tiny-qwenimage"), step_cache="taylorseer")[1]
    assert "attention and feed-forward outputs" in qwen, "Qwen-Image's TaylorSeer extrapolates its feed-forwards too"
    klein = api.sampling_options(_spec(tiny_models, "tiny-flux2"), step_cache="taylorseer")[1]
    assert "blocks' attention outputs" in klein
    with pytest.raises(ParallelError, match=r"'first block' does not suit SD3 .*FLUX\.1, Qwen-Image.*step_cache to off"):
        api.sampling_options(_spec(tiny_models, "tiny-sd3"), step_cache="first block")
    with pytest.raises(ParallelError, match=r"'magcache' does not suit Qwen-Image.*use first block or taylorseer"):
        api.sampling_options(_spec(tiny_models, "tiny-qwenimage"), step_cache="magcache")
    with pytest.raises(ParallelError, match=r"cache_threshold: 0.1 means nothing to taylorseer"):
        api.sampling_options(_spec(tiny_models), step_cache="taylorseer", cache_threshold=0.1)
    with pytest.raises(ParallelError, match=r"cache_threshold: -1.0 is out of range"):
        api.sampling_options(_spec(tiny_models), step_cache="first block", cache_threshold=-1.0)
    with pytest.raises(ParallelError, match=r"step_cache: 'teacache' is not one of off, first block"):
        api.sampling_options(_spec(tiny_models), step_cache="teacache")


@pytest.mark.unit
def test_step_cache_is_refused_in_compiled_mode_with_the_reason_and_runs_in_every_eager_mode(tiny_models):
    for kind in ("first block", "taylorseer", "magcache"):
        compiled, _ = api.with_mode(_cached(_spec(tiny_models), kind), "compiled")
        with pytest.raises(CompileError, match=rf"step_cache: '{kind}' cannot run in compiled mode: .*recompiles"):
            api.checked(compiled)
        for mode in [m for m in MODE_CHOICES if m != "compiled"]:  # the hooks decide in Python between steps
            assert api.checked(api.with_mode(_cached(_spec(tiny_models), kind), mode)[0]).step_cache == kind


# ---- in the worker

@pytest.mark.workers
@pytest.mark.parametrize("name,kind,threshold", CASES)
def test_each_cache_kind_equals_plain_diffusers_with_the_same_hook(tiny_models, name, kind, threshold):
    images = api.sample(_cached(_spec(tiny_models, name), kind, threshold), _request(name))
    assert not np.array_equal(images, _plain(tiny_models, name, "off", 0.0)), "the cache skipped nothing"
    assert np.array_equal(images, _plain(tiny_models, name, kind, threshold))
    again = api.sample(_cached(_spec(tiny_models, name), kind, threshold), _request(name))
    assert np.array_equal(again, images), "the hooks' state starts afresh every call"


@pytest.mark.workers
def test_turning_the_cache_off_or_changing_it_never_reloads(tiny_models):
    spec = _spec(tiny_models)
    plain = api.sample(spec, _request())
    loads = api.worker_info()[0]["loads"]
    api.sample(_cached(spec, "first block", 0.5), _request())
    assert np.array_equal(api.sample(_cached(spec, "magcache"), _request()),
                          _plain(tiny_models, "tiny-flux", "magcache", 0.0))
    assert np.array_equal(api.sample(spec, _request()), plain), "off takes the hooks off again"
    assert api.worker_info()[0]["loads"] == loads


@pytest.mark.workers
def test_cfg_parallel_with_each_step_cache_is_bit_identical(tiny_models):
    for kind, threshold in [("first block", 0.5), ("taylorseer", 0.0), ("magcache", 0.0)]:
        spec = _cached(_spec(tiny_models), kind, threshold, true_cfg=4.0)
        images = api.sample(api.cfg_parallel(spec)[0], _request(negative_prompt=NEG))
        assert np.array_equal(images, _plain(tiny_models, "tiny-flux", kind, threshold, true_cfg=4.0)), kind
        assert not np.array_equal(images, _plain(tiny_models, "tiny-flux", "off", 0.0, true_cfg=4.0)), kind


@pytest.mark.workers
@pytest.mark.parametrize("layout", ["context", "tp"])
def test_split_passes_take_the_same_skip_decision_on_every_rank(tiny_models, layout):
    """First block cache decides from the data: every rank of a split pass decides from the whole sequence's
    sums (a rank deciding alone would desynchronise the collectives, or skip differently). TaylorSeer and MagCache
    decide by the step number: the same on every rank by construction, and the same image as one process."""
    uncached = _plain(tiny_models, "tiny-flux", "off", 0)
    for kind, threshold in [("first block", 0.5), ("taylorseer", 0.0), ("magcache", 0.0)]:
        spec = _cached(_spec(tiny_models), kind, threshold)
        split = api.context_parallel(spec, 2, "ulysses")[0] if layout == "context" else api.shard(spec, 2)[0]
        images = api.sample(split, _request())
        want = _plain(tiny_models, "tiny-flux", kind, threshold)
        # first block: a rank skipping other steps would differ by about the cache's effect, so that is far above the
        # tolerance; the step-number kinds skip alike by construction, and need only to have changed the image
        assert np.abs(want - uncached).max() > (100 if kind == "first block" else 10) * TOLERANCE, kind
        assert np.abs(images - want).max() <= TOLERANCE, kind
        workers = api.worker_info()
        assert len(workers) == 2 and workers[0]["steps"] == workers[1]["steps"], kind


@pytest.mark.workers
def test_data_parallel_replicas_and_loras_keep_the_cached_image(tiny_models, tmp_path_factory):
    spec = _cached(_spec(tiny_models), "taylorseer")
    images = api.sample(api.replicate(spec, 2)[0], _request(batch_size=2))
    assert np.array_equal(images, _plain(tiny_models, "tiny-flux", "taylorseer", 0.0, seeds=(3, 4)))
    lora = str(make(tiny_models, "tiny-flux", "diffusers", tmp_path_factory.mktemp("loras"), seed=7)[0])
    with_lora = api.with_lora(_cached(_spec(tiny_models), "first block", 0.5), lora, 0.8, 0.0)[0]
    assert np.array_equal(api.sample(with_lora, _request()),
                          _plain(tiny_models, "tiny-flux", "first block", 0.5, loras=[(lora, 0.8)]))


# ---- the 2026 families: which hooks apply is declared by each family (no list of family names here)

NEW = {"tiny-qwenimage21": dict(width=64, height=64, guidance=1.0),  # one pass, as its templates run it
       "tiny-ltx2": dict(width=64, height=64, frames=9, guidance=3.0, frame_rate=25.0)}  # batched CFG, with sound


@pytest.mark.unit
def test_new_families_take_the_caches_diffusers_hooks_fit_and_refuse_the_others_saying_why(tiny_models):
    for name, why in (("tiny-qwenimage21", "no entry for QwenImage21TransformerBlock"),
                      ("tiny-krea2", "Krea2Pipeline calls its transformer without the cache contexts"),
                      ("tiny-ideogram4", "calls its two transformers without the cache contexts"),
                      ("tiny-flux3", "modular FLUX 3 blocks call the transformer without"),
                      ("tiny-ltx2", "no entry for LTX2VideoTransformerBlock"),
                      ("tiny-minimax-h3", "modular MiniMax H3 blocks")):
        with pytest.raises(ParallelError, match=rf"'first block' does not suit .*{why}.*step_cache to off"):
            api.sampling_options(_spec(tiny_models, name), step_cache="first block")
    for name in NEW:
        text = api.sampling_options(_spec(tiny_models, name), step_cache="taylorseer")[1]
        assert "attention and feed-forward outputs" in text


@pytest.mark.workers
@pytest.mark.parametrize("name", list(NEW))
def test_taylorseer_on_the_new_families_equals_diffusers_own_hook_on_plain_diffusers(tiny_models, name):
    """TaylorSeer (full steps 1-3, then every 5th) on Qwen-Image 2.1's blocks and on both of LTX-2's streams: the
    pack's frames (and LTX-2's sound) equal plain diffusers' pipeline with the same hook within 1e-4, and differ
    from the uncached ones by over ten times that (it extrapolated: 2e-3 on tiny-qwenimage21)."""
    from backend.families import ltx2, qwenimage21

    kw = NEW[name]
    req = SampleRequest(prompt=FOX, steps=STEPS, seed=3, **kw)
    spec = _cached(_spec(tiny_models, name), "taylorseer")
    out = api.run_sample_outputs(api.prepare_sample(spec, req))
    uncached = api.run_sample_outputs(api.prepare_sample(_spec(tiny_models, name), req))
    pipe = load(tiny_models, name)
    modules = (ltx2 if "ltx2" in name else qwenimage21).TAYLORSEER_MODULES
    pipe.transformer.enable_cache(config("taylorseer", 0.0, STEPS, modules))
    call = dict(prompt=FOX, num_inference_steps=STEPS, height=kw["height"], width=kw["width"], output_type="np",
                generator=[torch.Generator("cpu").manual_seed(3)])
    if "ltx2" in name:
        call.update(ltx2.OFF, num_frames=kw["frames"], frame_rate=kw["frame_rate"], guidance_scale=kw["guidance"],
                    audio_guidance_scale=kw["guidance"])
    with torch.inference_mode():
        plain = pipe(**call)
    pixels = (plain.frames[0] if "ltx2" in name else plain.images[..., :3]).reshape(out["images"].shape)
    assert np.abs(out["images"] - pixels).max() <= TOLERANCE
    assert np.abs(out["images"] - uncached["images"]).max() > 10 * TOLERANCE, "the cache extrapolated nothing"
    if "ltx2" in name:
        assert np.abs(out["audio"][0] - plain.audio[0].numpy()).max() <= TOLERANCE
