"""One image sooner: CFG Parallel, Context Parallel, the prompt-embedding cache, batched sampling, the latency
report and warm start.

Tolerances, against one worker (float32 images in 0..1):
- CFG Parallel, two-branch families (FLUX.1 true CFG, Qwen-Image): bit-identical (the same arithmetic, split).
- CFG Parallel, batch families (SD3, SDXL): each rank runs half of the doubled batch, and half a batch rounds
  differently in the last bits: max abs diff <= CFG_BATCH_TOLERANCE (seen ~3e-6).
- Context Parallel: attention over shards sums in another order: <= CP_TOLERANCE (seen ~1e-6).
- Batched sampling: a batch of 4 against 4 calls: <= BATCHED_TOLERANCE (seen ~2e-6); never promised identical.
- Prompt cache: bit-identical (the cached tensors are what the first call computed, under inference mode).

Two-worker tests run 2 CPU processes over gloo. World-size-1 references are drawn once (module fixture).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from backend.controller import api, capacity, group, layouts
from backend.protocol import settings
from backend.protocol.errors import Interrupted, ParallelError
from backend.protocol.messages import Step
from backend.protocol.spec import Layout, PipelineSpec, SampleRequest
from backend.worker.cfg_parallel import two_passes
from backend.worker.prompt_cache import PromptCache, text_encoder_state

CFG_BATCH_TOLERANCE = 1e-4
CP_TOLERANCE = 1e-4
BATCHED_TOLERANCE = 1e-4
FOX, NEG = "a red fox in the snow", "blurry"
DEMO = Path(__file__).resolve().parent.parent / "workflows" / "api" / "tiny_demo.json"


def _request(**kw) -> SampleRequest:
    base = dict(prompt=FOX, negative_prompt=NEG, width=64, height=64, steps=2, guidance=5.0, seed=11)
    return SampleRequest(**{**base, **kw})


def _spec(tiny_models, name="tiny-flux", **kw) -> PipelineSpec:
    return api.make_spec(name, [str(tiny_models)], **kw)


def _flux_true_cfg(tiny_models) -> PipelineSpec:
    return api.sampling_options(_spec(tiny_models), true_cfg_scale=4.0)[0]


# ---- plans: checked before anything starts

@pytest.mark.unit
def test_layout_rank_order_is_tp_then_context_then_cfg_then_replica():
    layouts = [Layout(2, 16, r, cp_degree=2, cfg_degree=2) for r in range(16)]
    assert [lay.tp_rank for lay in layouts[:8]] == [0, 1] * 4
    assert [lay.cp_rank for lay in layouts[:8]] == [0, 0, 1, 1] * 2
    assert [lay.cfg_rank for lay in layouts[:8]] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [lay.replica for lay in layouts] == [0] * 8 + [1] * 8
    assert [r for r, lay in enumerate(layouts) if lay.leader] == [0, 8]
    assert layouts[0].replicas == 2 and layouts[0].model_ranks == 8
    req = _request(batch_size=3)
    assert [len(lay.my_share(req)) for lay in layouts] == [2] * 8 + [1] * 8, "a replica's ranks share its images"


@pytest.mark.unit
def test_cfg_parallel_applies_to_two_pass_families_only(tiny_models):
    for name in ("tiny-sd3", "tiny-sdxl", "tiny-qwenimage", "tiny-flux"):
        spec, text = api.cfg_parallel(_spec(tiny_models, name))
        assert spec.cfg_parallel == 2 and spec.world_size == 2 and "CFG Parallel on" in text
    assert "true_cfg_scale above 1 in Sampling Options" in api.cfg_parallel(_spec(tiny_models))[1]
    with pytest.raises(ParallelError) as e:  # tiny-flux2 is a distilled FLUX.2 [klein]: one pass per step
        api.cfg_parallel(_spec(tiny_models, "tiny-flux2"))
    assert "tiny-flux2" in str(e.value) and "one denoiser pass per step" in str(e.value)
    assert "Remove CFG Parallel" in str(e.value)


@pytest.mark.unit
def test_context_parallel_is_checked(tiny_models, monkeypatch):
    monkeypatch.setattr(capacity.os, "cpu_count", lambda: 8)
    for name in ("tiny-sd3", "tiny-sdxl"):
        with pytest.raises(ParallelError, match=r"no context-parallel plan.*FLUX.1, FLUX.1 Depth/Canny, FLUX.1 Fill, FLUX.1 Kontext, FLUX.2, FLUX.2 \[klein\], LTX-2, MiniMax H3, Qwen-Image.*CFG Parallel"):
            api.context_parallel(_spec(tiny_models, name), 2)
    spec, text = api.context_parallel(_spec(tiny_models), 2, "ring")
    assert (spec.cp_degree, spec.cp_mode, spec.world_size) == (2, "ring", 2) and "ring" in text
    assert "padded with masked tokens to a multiple of 2" in api.context_parallel(_spec(tiny_models, "tiny-qwenimage"), 2)[1]
    with pytest.raises(ParallelError, match=r"mode: 'ring' cannot be used with Qwen-Image.*masked.*Use 'ulysses'"):
        api.context_parallel(_spec(tiny_models, "tiny-qwenimage"), 2, "ring")
    with pytest.raises(ParallelError, match=r"degree: Ulysses splits the 2 attention heads of 'tiny-flux'.*use one of 2"):
        api.context_parallel(_spec(tiny_models), 4)
    with pytest.raises(ParallelError, match=r"cannot be combined with Shard TP"):
        api.context_parallel(layouts.plan_tp(_spec(tiny_models), 2)[0], 2)
    with pytest.raises(ParallelError, match=r"offload: 'model' cannot be combined with Context Parallel"):
        api.context_parallel(_spec(tiny_models, offload="model"), 2)
    with pytest.raises(ParallelError, match=r"mode: 'ring' needs .* Use 'ulysses' on cuda"):
        api.context_parallel(_spec(tiny_models).with_changes(kind="cuda"), 2, "ring")
    with pytest.raises(ParallelError, match=r"width/height: 48x48 makes 9 image tokens.*multiple of 2"):
        api.check_request(spec, _request(width=48, height=48))
    qwen = api.context_parallel(_spec(tiny_models, "tiny-qwenimage"), 2)[0]
    with pytest.raises(ParallelError, match=r"width/height: 48x48 makes 9 image tokens.*multiple of 2"):
        api.check_request(qwen, _request(width=48, height=48))  # odd image tokens: refused for every family
    api.check_request(qwen, _request(width=48, height=64))


@pytest.mark.unit
def test_layout_counts_every_split_and_data_parallel_auto_accounts_for_them(tiny_models, monkeypatch):
    gpus = capacity.Capacity("cuda", 8, None, "this host has 8 CUDA GPUs", True)
    monkeypatch.setattr(capacity, "host_capacity", lambda kind: gpus)  # as on an 8-GPU host
    cfg, _ = api.cfg_parallel(_spec(tiny_models, "tiny-qwenimage"))
    assert api.replicate(cfg, 0)[0].dp_replicas == 4, "auto = chips / (cfg × context × tp)"
    both, _ = api.context_parallel(cfg, 2)
    assert both.world_size == 4 and api.replicate(both, 0)[0].world_size == 8
    assert api.context_parallel(cfg, 0)[0].cp_degree == 2, "auto: the chips left after CFG, dividing the heads"
    with pytest.raises(ParallelError, match=r"replicas: 3 replicas × TP 1 × context 2 × CFG 2 = 12 workers"):
        api.replicate(both, 3)
    v5e = capacity.Capacity("tpu", 8, (1, 4, 8), "this host has 8 TPU v5e chips", True)  # TorchTPU: 1, 4 or 8
    monkeypatch.setattr(capacity, "host_capacity", lambda kind: v5e)
    assert api.replicate(cfg, 0)[0].world_size == 8 and api.context_parallel(cfg, 0)[0].cp_degree == 2
    with pytest.raises(ParallelError, match=r"1 replica × TP 1 × context 1 × CFG 2 = 2 workers, but TorchTPU "
                                            r"launches only 1, 4 or 8 .*use replicas 2 or 4"):
        api.checked(cfg.with_changes(kind="tpu"))
    # CFG Parallel (and Context Parallel) alone make 2 workers here: accepted with what Data Parallel after them
    # completes, as Shard TP is (CFG 2 × Data Parallel 2 = 4 is a group TorchTPU launches)
    again, text = api.cfg_parallel(_spec(tiny_models, "tiny-qwenimage"))
    assert "not 2: add Data Parallel after this node with replicas 2 or 4 (or 0 = auto)" in text
    assert api.replicate(again, 2)[0].world_size == 4
    assert "add Data Parallel after this node" in api.context_parallel(_spec(tiny_models, "tiny-qwenimage"), 2)[1]
    cpu = capacity.Capacity("cpu", 2, None, "this CPU host has 2 cores (one worker process each)", False)
    monkeypatch.setattr(capacity, "host_capacity", lambda kind: cpu)
    with pytest.raises(ParallelError, match=r"Connect Data Parallel after Shard TP, Context Parallel and CFG"):
        api.cfg_parallel(api.replicate(_spec(tiny_models, "tiny-sdxl"), 2)[0])


@pytest.mark.unit
def test_sampling_options_are_checked_and_said(tiny_models):
    spec, text = api.sampling_options(_spec(tiny_models), prompt_cache=False, batched=True, true_cfg_scale=3.5)
    assert (spec.prompt_cache, spec.batched, spec.true_cfg_scale) == (False, True, 3.5)
    assert "prompt_cache off" in text and "batched on" in text and "true_cfg_scale 3.5" in text
    assert spec.load_key() == _spec(tiny_models).load_key(), "sampling options never reload the weights"
    with pytest.raises(ParallelError, match=r"true_cfg_scale: only FLUX.1 .* Qwen-Image that is its true CFG scale"):
        api.sampling_options(_spec(tiny_models, "tiny-qwenimage"), true_cfg_scale=4.0)


@pytest.mark.unit
def test_two_passes_follows_the_pipelines_own_rule():
    import diffusers

    class Pipe:
        class config:  # noqa: N801  (like a diffusers config)
            is_distilled = False

        def __call__(self):  # names its two branches with the denoiser's cache_context, as diffusers' pipelines do
            return "cache_context('cond')", "cache_context('uncond')"

    pipe = Pipe()
    assert two_passes(pipe, "batch", {"guidance_scale": 5.0}) and not two_passes(pipe, "batch", {"guidance_scale": 1.0})
    assert two_passes(pipe, "branches", {"true_cfg_scale": 4.0, "negative_prompt": ""})
    assert not two_passes(pipe, "branches", {"true_cfg_scale": 4.0})  # no negative prompt: one pass
    assert not two_passes(pipe, "branches", {"true_cfg_scale": 1.0, "negative_prompt": "x"})
    assert two_passes(pipe, "branches", {"guidance_scale": 4.0})  # FLUX.2 klein base
    Pipe.config.is_distilled = True
    assert not two_passes(pipe, "branches", {"guidance_scale": 4.0})
    assert not two_passes(pipe, "", {"guidance_scale": 4.0})
    # diffusers' own classes: FLUX.1's image pipelines run true CFG without naming the branches
    true_cfg = {"true_cfg_scale": 4.0, "negative_prompt": ""}
    for name, split in (("FluxPipeline", True), ("FluxImg2ImgPipeline", False), ("FluxInpaintPipeline", False),
                        ("QwenImageImg2ImgPipeline", True), ("QwenImageInpaintPipeline", True),
                        ("QwenImageEditPipeline", True)):
        cls = getattr(diffusers, name)
        assert two_passes(object.__new__(cls), "branches", true_cfg) is split, name


# ---- the prompt cache, in process (a real tiny pipeline, no worker)

def _pipe(tiny_models, name):
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(str(tiny_models / name), dtype=torch.float32, local_files_only=True,
                                             use_safetensors=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


_CALLS = {  # the arguments the worker would pass, CFG on
    "tiny-flux": {"guidance_scale": 0.0, "true_cfg_scale": 4.0, "negative_prompt": NEG},
    "tiny-flux2": {"guidance_scale": 1.0},
    "tiny-sd3": {"guidance_scale": 5.0, "negative_prompt": NEG},
    "tiny-sdxl": {"guidance_scale": 5.0, "negative_prompt": NEG},
    "tiny-qwenimage": {"true_cfg_scale": 4.0, "negative_prompt": NEG},
}


def _draw(pipe, seed=3, **kw):
    with torch.inference_mode():
        return pipe(**{"prompt": FOX, "height": 64, "width": 64, "num_inference_steps": 2, "output_type": "np",
                       "generator": [torch.Generator("cpu").manual_seed(seed)], **kw}).images


@pytest.mark.unit
@pytest.mark.parametrize("name", list(_CALLS))
def test_cached_embeddings_give_the_same_pixels(tiny_models, name):
    pipe = _pipe(tiny_models, name)
    plain = _draw(pipe, **_CALLS[name])
    cache = PromptCache()
    cache.attach(pipe)
    with cache.using(True, ("weights",)):
        first = _draw(pipe, **_CALLS[name])
        misses = cache.misses
        second = _draw(pipe, seed=3, **_CALLS[name])
    assert misses >= 1 and cache.misses == misses and cache.hits == misses, cache.stats()
    assert np.array_equal(first, plain) and np.array_equal(second, plain), "cached embeddings changed the pixels"


@pytest.mark.unit
def test_what_makes_the_cache_encode_again(tiny_models):
    """Prompt, negative prompt, max_sequence_length, CFG on/off and the text encoders' weights (LoRA) are part
    of the key; the seed, steps and size are not; a new model empties it."""
    pipe = _pipe(tiny_models, "tiny-sd3")
    cache = PromptCache()
    cache.attach(pipe)
    base = {"negative_prompt": NEG, "guidance_scale": 5.0, "max_sequence_length": 32}

    def misses_of(context=("weights",), **kw):
        before = cache.misses
        with cache.using(True, context):
            _draw(pipe, **{**base, **kw})
        return cache.misses - before

    assert misses_of() == 1  # SD3 encodes prompt and negative prompt in one call
    assert misses_of(seed=9, num_inference_steps=3, height=48) == 0
    assert misses_of(prompt="another prompt") == 1
    assert misses_of(negative_prompt="dark") == 1
    assert misses_of(max_sequence_length=64) == 1
    assert misses_of(guidance_scale=1.0) == 1  # CFG off: no negative embeddings
    assert misses_of(context=("weights", "a LoRA")) == 1
    assert misses_of() == 0
    with cache.using(False, ("weights",)):
        _draw(pipe, prompt="never cached")
    assert cache.stats()["entries"] == 6 and misses_of(prompt="never cached") == 1
    cache.attach(_pipe(tiny_models, "tiny-sd3"))  # a model change
    assert cache.stats()["entries"] == 0 and cache.bytes == 0


@pytest.mark.unit
def test_text_encoder_state_follows_lora_settings(tiny_models):
    fields = [("loras", tuple, dataclasses.field(default=()))]
    with_loras = dataclasses.make_dataclass("WithLoras", fields, bases=(PipelineSpec,), frozen=True)
    spec = _spec(tiny_models)
    plain = with_loras(**dataclasses.asdict(spec))
    one = with_loras(**{**dataclasses.asdict(spec), "loras": (("style.safetensors", 1.0),)})
    weaker = with_loras(**{**dataclasses.asdict(spec), "loras": (("style.safetensors", 0.5),)})
    states = {text_encoder_state(s) for s in (plain, one, weaker)}
    assert len(states) == 3
    assert text_encoder_state(spec) != text_encoder_state(_spec(tiny_models, "tiny-sd3"))


@pytest.mark.unit
def test_cache_is_bounded_by_entries_and_bytes(tiny_models, monkeypatch):
    pipe = _pipe(tiny_models, "tiny-flux")
    monkeypatch.setenv(settings.PROMPT_CACHE_ENTRIES.name, "2")
    cache = PromptCache()
    cache.attach(pipe)
    with cache.using(True, ()):
        for prompt in ("one", "two", "three"):
            _draw(pipe, prompt=prompt, guidance_scale=0.0)
        assert cache.stats()["entries"] == 2 and cache.misses == 3
        _draw(pipe, prompt="one", guidance_scale=0.0)  # the oldest went first
        assert cache.misses == 4
    entry = cache.bytes // 2
    monkeypatch.setenv(settings.PROMPT_CACHE_ENTRIES.name, "100")
    monkeypatch.setenv(settings.PROMPT_CACHE_MB.name, str(1.5 * entry / 2**20))
    cache = PromptCache()
    cache.attach(pipe)
    with cache.using(True, ()):
        for prompt in ("one", "two", "three"):
            _draw(pipe, prompt=prompt, guidance_scale=0.0)
    assert cache.stats()["entries"] == 1 and cache.bytes == entry <= cache.max_bytes


@pytest.mark.unit
def test_with_model_offload_a_cached_prompt_never_runs_or_moves_the_text_encoders(tiny_models, monkeypatch):
    from accelerate.hooks import CpuOffload

    pipe = _pipe(tiny_models, "tiny-flux")
    pipe.enable_model_cpu_offload(device="cpu")
    names = {id(m): n for n, m in pipe.components.items() if isinstance(m, torch.nn.Module)}
    moved: list[str] = []
    ran: list[str] = []
    original = CpuOffload.pre_forward

    def pre_forward(self, module, *args, **kwargs):  # the hook that moves a model to the chip before it runs
        moved.append(names.get(id(module), "?"))
        return original(self, module, *args, **kwargs)

    monkeypatch.setattr(CpuOffload, "pre_forward", pre_forward)
    for name in ("text_encoder", "text_encoder_2"):
        getattr(pipe, name).register_forward_pre_hook(lambda m, a, name=name: ran.append(name))
    cache = PromptCache()
    cache.attach(pipe)
    with cache.using(True, ()):
        _draw(pipe, guidance_scale=0.0)
        assert {"text_encoder", "text_encoder_2"} <= set(ran) & set(moved)
        moved.clear()
        ran.clear()
        _draw(pipe, seed=4, guidance_scale=0.0)
    assert cache.hits == 1 and ran == []
    assert "transformer" in moved and not {"text_encoder", "text_encoder_2"} & set(moved), moved


# ---- worker processes

@pytest.fixture(scope="module")
def refs(tiny_models) -> dict[str, np.ndarray]:
    """Images from one worker (world size 1), drawn once for the module."""
    return {
        "qwen": api.sample(_spec(tiny_models, "tiny-qwenimage"), _request(guidance=4.0)),
        "qwen_cat": api.sample(_spec(tiny_models, "tiny-qwenimage"), _request(prompt="a cat", guidance=4.0)),
        "sd3": api.sample(_spec(tiny_models, "tiny-sd3"), _request()),
        "sd3_nocfg": api.sample(_spec(tiny_models, "tiny-sd3"), _request(guidance=1.0)),
        "sdxl": api.sample(_spec(tiny_models, "tiny-sdxl"), _request(batch_size=2)),
        "flux_true": api.sample(_flux_true_cfg(tiny_models), _request(guidance=0.0)),
        "flux4": api.sample(_spec(tiny_models), _request(guidance=0.0, batch_size=4)),
        "qwen21": api.sample(_spec(tiny_models, "tiny-qwenimage21"), _request(guidance=4.0)),  # KV cache per branch
        "krea2": api.sample(_spec(tiny_models, "tiny-krea2"), _request(guidance=0.5)),  # CFG above 0, unnamed
    }


@pytest.mark.workers
def test_batched_sampling_stays_within_tolerance_and_in_order(tiny_models, refs):
    spec = api.sampling_options(_spec(tiny_models), batched=True)[0]
    steps: list[tuple[int, int]] = []
    images = api.sample(spec, _request(guidance=0.0, batch_size=4),
                        lambda m: steps.append((m.step, m.total)) if isinstance(m, Step) else None)
    assert images.shape == refs["flux4"].shape
    assert np.abs(images - refs["flux4"]).max() <= BATCHED_TOLERANCE
    for i in range(4):  # each image keeps its own seed: closest to its own reference
        diffs = [np.abs(images[i] - refs["flux4"][j]).max() for j in range(4)]
        assert int(np.argmin(diffs)) == i
    assert steps == [(4, 8), (8, 8)], "one batched call: each step advances the bar by 4 images"


@pytest.mark.workers
def test_latency_report_and_prompt_cache_statistics(tiny_models):
    spec = _spec(tiny_models)
    api.sample(spec, _request(guidance=0.0, seed=1))
    before = api.worker_info()[0]["prompt_cache"]
    for seed in (2, 3, 4):  # a seed sweep of one prompt: encoded once
        api.sample(spec, _request(guidance=0.0, seed=seed))
    after = api.worker_info()[0]["prompt_cache"]
    assert after["hits"] - before["hits"] == 3 and after["misses"] == before["misses"], after
    assert after["entries"] >= 1 and after["bytes"] > 0 and after["max_entries"] >= 1
    latency = api.last_latency()
    assert set(latency) == {"start_s", "load_s", "text_s", "denoise_s", "vae_s", "handback_s", "total_s"}
    assert latency["start_s"] == 0.0, "the group was already running"
    assert latency["denoise_s"] > 0 and latency["vae_s"] > 0
    assert sum(v for k, v in latency.items() if k != "total_s") <= latency["total_s"] + 1e-3
    api.sample(_spec(tiny_models, "tiny-sd3"), _request())  # a model change empties the cache
    assert api.worker_info()[0]["prompt_cache"]["entries"] == 1


@pytest.mark.workers
def test_warm_start_starts_one_worker_in_the_background(tiny_models, monkeypatch):
    api.shutdown()
    monkeypatch.delenv(settings.WARM_START.name, raising=False)
    assert api.warm_start() is None and group.current_group() is None
    monkeypatch.setenv(settings.WARM_START.name, "1")
    thread = api.warm_start()
    assert isinstance(thread, threading.Thread)
    thread.join(180)
    warm = group.current_group()
    assert warm is not None and warm.config.world_size == 1
    api.sample(_spec(tiny_models), _request(guidance=0.0))
    assert group.current_group() is warm and api.last_latency()["start_s"] == 0.0, "the first prompt only loads"


@pytest.mark.workers
def test_a_failed_warm_start_is_logged_and_raises_nothing(monkeypatch, caplog):
    api.shutdown()
    monkeypatch.setenv(settings.WARM_START.name, "1")

    def broken(choice):
        raise RuntimeError("no device here")

    monkeypatch.setattr(api.devices, "resolve_kind", broken)
    with caplog.at_level(logging.ERROR, logger="comfyui_tpu"):
        api.warm_start().join(30)
    assert "warm start failed: no device here" in caplog.text and group.current_group() is None


@pytest.mark.workers
@pytest.mark.parametrize("name,ref", [("tiny-qwenimage", "qwen"), ("tiny-flux", "flux_true"),
                                      ("tiny-qwenimage21", "qwen21"), ("tiny-krea2", "krea2")])
def test_cfg_parallel_two_branch_families_are_bit_identical(tiny_models, refs, name, ref):
    spec = _flux_true_cfg(tiny_models) if name == "tiny-flux" else _spec(tiny_models, name)
    cfg, _ = api.cfg_parallel(spec)
    images = api.sample(cfg, _request(guidance={"tiny-flux": 0.0, "tiny-krea2": 0.5}.get(name, 4.0)))
    assert np.array_equal(images, refs[ref])
    workers = api.worker_info()
    assert len(workers) == 2 and workers[0]["steps"] == workers[1]["steps"]


@pytest.mark.workers
def test_cfg_parallel_batch_families_stay_within_tolerance(tiny_models, refs):
    sd3, _ = api.cfg_parallel(_spec(tiny_models, "tiny-sd3"))
    assert np.abs(api.sample(sd3, _request()) - refs["sd3"]).max() <= CFG_BATCH_TOLERANCE
    said: list[str] = []
    images = api.sample(sd3, _request(guidance=1.0), lambda m: said.append(getattr(m, "text", "")))
    assert np.array_equal(images, refs["sd3_nocfg"]), "without CFG both ranks run the whole call"
    assert any("runs one denoiser pass per step" in t for t in said), said
    sdxl, _ = api.cfg_parallel(_spec(tiny_models, "tiny-sdxl"))
    assert np.abs(api.sample(sdxl, _request(batch_size=2)) - refs["sdxl"]).max() <= CFG_BATCH_TOLERANCE


@pytest.mark.workers
def test_cancel_stops_both_cfg_ranks_at_the_same_step(tiny_models):
    cfg, _ = api.cfg_parallel(_spec(tiny_models, "tiny-qwenimage"))
    api.load(cfg)
    before = [w["steps"] for w in api.worker_info()]
    stop = threading.Event()
    with pytest.raises(Interrupted):
        api.sample(cfg, _request(guidance=4.0, steps=5000),
                   lambda m: stop.set() if isinstance(m, Step) and m.step >= 3 else None, stop.is_set)
    steps = [w["steps"] - b for w, b in zip(api.worker_info(), before, strict=True)]
    assert steps[0] == steps[1] >= 3 and steps[0] < 1000, f"the CFG peers stopped at different steps: {steps}"
    assert api.sample(cfg, _request(guidance=4.0)).shape == (1, 64, 64, 3), "the next request works"


@pytest.mark.workers
@pytest.mark.parametrize("name,mode,ref,prompt", [("tiny-flux", "ulysses", "flux4", FOX),
                                                  ("tiny-flux", "ring", "flux4", FOX),
                                                  ("tiny-qwenimage", "ulysses", "qwen_cat", "a cat")])
def test_context_parallel_matches_one_worker(tiny_models, refs, name, mode, ref, prompt):
    """'a cat' gives Qwen-Image an odd text length: padded with masked tokens to an even one."""
    cp, _ = api.context_parallel(_spec(tiny_models, name), 2, mode)
    guidance, batch = (0.0, 4) if name == "tiny-flux" else (4.0, 1)
    images = api.sample(cp, _request(prompt=prompt, guidance=guidance, batch_size=batch))
    assert images.shape == refs[ref].shape
    assert np.abs(images - refs[ref]).max() <= CP_TOLERANCE


@pytest.mark.workers
@pytest.mark.parametrize("name", ["tiny-flux", "tiny-flux2", "tiny-qwenimage"])
def test_context_parallel_splits_every_token_count_evenly_or_refuses_it(tiny_models, name):
    """TorchTPU's all_to_all_single takes equal splits only, so every family with Context Parallel gives each
    rank the same number of tokens. Prompts one token apart (one of the two lengths is odd): Qwen-Image's text,
    as long as the prompt, is padded with masked tokens, in eager and in compiled mode (its bucket a multiple of the
    degree too); FLUX pads to 512 itself. Both match one worker. A size with an odd number of image tokens is
    refused before any worker runs, naming the fix."""
    qwen = name == "tiny-qwenimage"
    requests = [_request(prompt=p, guidance=4.0 if qwen else 1.0, width=48, height=64) for p in ("a cat", "a cat cat")]
    one = _spec(tiny_models, name)
    refs = [api.sample(one, r) for r in requests]
    cp, _ = api.context_parallel(one, 2)
    layouts = [cp, api.with_compile(cp, "whole denoiser", "eager", "")[0]] if qwen else [cp]
    for spec in layouts:
        for req, ref in zip(requests, refs, strict=True):
            images = api.sample(spec, req)
            assert images.shape == ref.shape
            assert np.abs(images - ref).max() <= CP_TOLERANCE, (spec.compile, req.prompt)
    with pytest.raises(ParallelError, match=r"width/height: 48x48 makes 9 image tokens.*degree 2 cannot split "
                                            r"evenly.*multiple of 2"):
        api.sample(cp, _request(prompt="a cat", width=48, height=48))


# ---- through a real ComfyUI server

@pytest.mark.server
def test_sample_says_where_the_time_went_and_device_info_shows_it(server):
    from comfy_server import error_message, load_workflow

    wf = load_workflow(DEMO, **{"2.width": 64, "2.height": 64, "2.seed": 4242})
    wf["91"] = {"class_type": "TPUSamplingOptions", "inputs": {"pipeline": ["1", 0], "prompt_cache": True,
                                                               "batched": False, "true_cfg_scale": 1.0}}
    wf["2"]["inputs"]["pipeline"] = ["91", 0]
    result = server.run(wf, timeout=180)
    assert result["status"] == "success", f"{error_message(result)}\n{server.log_tail()}"
    texts = [m["data"]["text"] for m in result["messages"] if m["type"] == "progress_text" and m["data"]["node"] == "2"]
    assert texts and texts[-1].startswith("time ") and "denoise" in texts[-1] and "queue" in texts[-1], texts
    info = server.run({"90": {"class_type": "TPUDeviceInfo", "inputs": {}}}, timeout=60)
    data = json.loads(info["history"]["outputs"]["90"]["text"][0])
    assert {"queue_s", "start_s", "load_s", "text_s", "denoise_s", "vae_s", "handback_s"} <= set(data["last_prompt"])
    assert data["workers"][0]["prompt_cache"]["misses"] >= 1
