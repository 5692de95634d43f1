"""One image sooner: CFG Parallel, Context Parallel, the prompt-embedding cache, batched sampling, warm start.

Each figure is a ratio measured in the same run, in alternating rounds (bench/common.py `alternate`): the
parallel modes against one worker, the prompt cache against the same worker without it (and plain diffusers),
batched calls against one call per image, a warm-started first image against the plain script's cold one.

The parallel figures need a model whose transformer dominates its time, as real ones do (FLUX.1-dev: 28 steps of
a 12B transformer, then one VAE decode). The suite's `small-flux` spends most of its time in its VAE decoder by
design, so they use `dit-flux`: small-flux's transformer with tiny-flux's VAE and text encoders, made here from
the two folders (no training, no download). `--quick` uses tiny-flux at 64x64 for everything: it only checks that
the figures run.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .comfy import PROMPT
from .common import (
    Ctx,
    PlainServer,
    alternate,
    median,
    not_available,
    paired,
    plain_cold,
    row,
    summary,
    target,
    two_workers,
)

NEGATIVE = "blurry, low quality"

CFG = ("cfg_parallel", "CFG Parallel: one image, 1 worker ÷ 2 workers (true CFG split)")
CFG_TARGET = target(">=", 1.6)
CP = ("context_parallel", "Context Parallel: one large image, 1 worker ÷ 2 workers (Ulysses)")
CP_TARGET = target(">=", 1.4)
CACHE = ("prompt_cache", "Prompt cache: seed sweep of one prompt with offload 'model', without ÷ with the cache")
CACHE_TARGET = target(">=", 1.3)
BATCHED = ("batched", "Batched sampling: 4 images, one call per image ÷ one call")
WARM = ("warm_start", "Warm start: first image after a warm start ÷ plain process start + import + load + image")


def dit_model(ctx: Ctx) -> str:
    """'dit-flux' in the bench's models folder (made once): small-flux's transformer and tiny-flux's text encoders
    (both take 32-wide text features and 16 latent channels), with tiny-flux's VAE made 4 channels wide and
    without its mid-block attention: at 1536² (36 864 latent pixels) the original would cost more than the
    transformer, where a real model's VAE costs a few percent of an image. Random weights, seeded."""
    if ctx.quick:
        return "tiny-flux"
    target_dir = ctx.models_dir / "dit-flux"
    if not (target_dir / "model_index.json").exists():
        import torch
        from diffusers import AutoencoderKL, FluxPipeline, FluxTransformer2DModel

        transformer = FluxTransformer2DModel.from_pretrained(ctx.models_dir / "small-flux", subfolder="transformer",
                                                             local_files_only=True, use_safetensors=True)
        config = {**AutoencoderKL.load_config(ctx.models_dir / "tiny-flux" / "vae"), "mid_block_add_attention": False,
                  "block_out_channels": [4, 4, 4, 4]}
        torch.manual_seed(0)
        vae = AutoencoderKL.from_config(config)
        pipe = FluxPipeline.from_pretrained(ctx.models_dir / "tiny-flux", transformer=transformer, vae=vae,
                                            local_files_only=True, use_safetensors=True)
        tmp = target_dir.with_name("dit-flux.tmp")
        pipe.save_pretrained(tmp)
        os.replace(tmp, target_dir)
    return "dit-flux"


def _request(ctx: Ctx, seed: int, width: int, height: int, steps: int, **kw):
    from backend.protocol.spec import SampleRequest

    return SampleRequest(**{"prompt": PROMPT, "width": width, "height": height, "steps": steps, "guidance": 0.0,
                            "seed": seed, **kw})


class Groups:
    """Worker groups side by side (each its own processes), as the data-parallel figure runs them: started at
    once (not timed), sampled in alternating rounds, closed together."""

    def __init__(self, ctx: Ctx, specs: dict):
        from backend.controller import api, group

        self.api, self.specs, self.groups = api, {k: api.checked(s) for k, s in specs.items()}, {}
        self.last_latency: dict[str, dict] = {}  # where each group's last sample spent its time (worker phases)
        with ThreadPoolExecutor(max_workers=len(specs)) as pool:
            futures = {k: pool.submit(self._start, group.WorkerGroup(api.group_config(s))) for k, s in
                       self.specs.items()}
            try:
                for k, fut in futures.items():
                    self.groups[k] = fut.result()
            except BaseException:
                self.close()
                raise

    @staticmethod
    def _start(g):
        g.start()
        return g

    def sample(self, name: str, req, spec=None) -> tuple[float, np.ndarray]:
        """Seconds for one request on group `name` (images back in this process), and the images; `spec`: another
        description the same group runs without reloading (a sampling option)."""
        spec = self.specs[name] if spec is None else self.api.checked(spec)
        self.api.check_request(spec, req)
        t0 = time.perf_counter()
        results = self.groups[name].sample(spec, req)
        seconds = time.perf_counter() - t0
        self.last_latency[name] = next(r.value["latency"] for r in results if "images" in r.arrays)
        return seconds, np.concatenate([r.arrays["images"] for r in results if "images" in r.arrays])

    def latency(self, name: str, req, spec=None) -> dict:
        results = self.groups[name].sample(self.specs[name] if spec is None else self.api.checked(spec), req)
        return next(r.value["latency"] for r in results if "images" in r.arrays)

    def info(self, name: str) -> list[dict]:
        return [r.value for r in self.groups[name].info()]

    def close(self) -> None:
        for g in self.groups.values():
            g.close()


def _pair(ctx: Ctx, one, two, req_of: Callable[[int], object], rounds: int) -> tuple[dict, float, dict]:
    """One worker against a 2-rank layout, alternating; returns times, the largest image difference, and where
    each side's time went (its last round)."""
    groups = Groups(ctx, {"one": one, "two": two})
    images: dict[str, np.ndarray] = {}
    try:
        def contestant(name: str) -> Callable[[int], float]:
            def run(r: int) -> float:
                seconds, images[name] = groups.sample(name, req_of(r))
                return seconds
            return run

        times = alternate({"one": contestant("one"), "two": contestant("two")}, rounds, ctx.warmup)
        phases = {k: groups.latency(k, req_of(0)) for k in ("one", "two")}
    finally:
        groups.close()
    return times, float(np.abs(images["one"] - images["two"]).max()), phases


def cfg_parallel(ctx: Ctx) -> list[dict]:
    if why := two_workers(ctx):
        return [not_available(*CFG, why, CFG_TARGET)]
    from backend.controller import api

    model = dit_model(ctx)
    width, steps = (ctx.width, ctx.steps) if ctx.quick else (512, 8)
    one, _ = api.sampling_options(api.make_spec(model, [str(ctx.models_dir)]), true_cfg_scale=4.0)
    two, _ = api.cfg_parallel(one)
    times, diff, phases = _pair(ctx, one, two, lambda r: _request(ctx, 2000 + r, width, width, steps,
                                                                   negative_prompt=NEGATIVE), ctx.repeats)
    t1, t2 = median(times["one"]), median(times["two"])
    return [row(*CFG, ratio=t1 / t2, ratio_of="one worker s/image ÷ CFG Parallel (2 workers) s/image; higher is faster",
                ours=summary(times["two"], "s"), plain=summary(times["one"], "s"), tgt=CFG_TARGET,
                details={"workload": f"{model} {width}x{width}, {steps} steps, FLUX.1 true CFG 4.0 with a negative "
                                     "prompt (two transformer passes per step)",
                         "max_abs_pixel_difference": diff, "phases_one_s": phases["one"],
                         "phases_two_s": phases["two"], "repeats": ctx.repeats,
                         "paired_ratio_median": paired(times["one"], times["two"])})]


def context_parallel(ctx: Ctx) -> list[dict]:
    if why := two_workers(ctx):
        return [not_available(*CP, why, CP_TARGET)]
    from backend.controller import api

    model = dit_model(ctx)
    width, steps = (ctx.width, ctx.steps) if ctx.quick else (1536, 4)
    one = api.make_spec(model, [str(ctx.models_dir)])
    two, _ = api.context_parallel(one, 2, "ulysses")
    rounds = min(ctx.repeats, 5)
    times, diff, phases = _pair(ctx, one, two, lambda r: _request(ctx, 3000 + r, width, width, steps), rounds)
    t1, t2 = median(times["one"]), median(times["two"])
    tokens = (width // 16) ** 2
    return [row(*CP, ratio=t1 / t2,
                ratio_of="one worker s/image ÷ Context Parallel (2 workers, Ulysses) s/image; higher is faster",
                ours=summary(times["two"], "s"), plain=summary(times["one"], "s"), tgt=CP_TARGET,
                details={"workload": f"{model} {width}x{width} ({tokens} image tokens + 512 text tokens), {steps} "
                                     "steps, guidance 0", "max_abs_pixel_difference": diff,
                         "phases_one_s": phases["one"], "phases_two_s": phases["two"], "repeats": rounds,
                         "paired_ratio_median": paired(times["one"], times["two"])})]


def prompt_cache(ctx: Ctx) -> list[dict]:
    from backend.controller import api

    cached = api.make_spec(ctx.model, [str(ctx.models_dir)], offload="model")
    specs = {"cache": cached, "nocache": api.sampling_options(cached, prompt_cache=False)[0]}
    groups = Groups(ctx, {"worker": cached})  # one worker runs both: the option needs no reload
    plain = None if ctx.exclusive else PlainServer(ctx, ctx.model, args=("--offload", "model"))
    try:
        def ours(name: str) -> Callable[[int], float]:
            return lambda r: groups.sample("worker", _request(ctx, 4000 + r, ctx.width, ctx.height, ctx.steps),
                                           specs[name])[0]

        contestants = {"cache": ours("cache"), "nocache": ours("nocache")}
        if plain is not None:
            plain.wait_ready()
            contestants["plain"] = lambda r: plain.call(4000 + r)["call_s"]
        times = alternate(contestants, ctx.repeats, ctx.warmup)
        stats = groups.info("worker")[0]["prompt_cache"]
        phases = {k: groups.latency("worker", _request(ctx, 4999, ctx.width, ctx.height, ctx.steps), specs[k])
                  for k in specs}
    finally:
        groups.close()
        if plain is not None:
            plain.close()
    with_cache, without = median(times["cache"]), median(times["nocache"])
    details = {"workload": f"{ctx.shape_text()}, offload 'model', one prompt, a new seed each round",
               "cache_stats": stats, "phases_cache_s": phases["cache"], "phases_nocache_s": phases["nocache"],
               "paired_ratio_median": paired(times["nocache"], times["cache"]), "repeats": ctx.repeats}
    if "plain" in times:
        details["plain_diffusers_s_per_image"] = summary(times["plain"], "s")
        details["plain_over_cache"] = median(times["plain"]) / with_cache
    notes = []
    if ctx.kind == "cpu":
        notes.append("on the CPU offload 'model' moves nothing (the 'chip' is host memory), so only the text "
                     "encoders' compute is saved; on a TPU or GPU a hit also skips moving them to the chip")
    return [row(*CACHE, ratio=without / with_cache,
                ratio_of="ours without the cache s/image ÷ ours with it (plain diffusers with offload in details); "
                         "higher is faster",
                ours=summary(times["cache"], "s"), plain=summary(times["nocache"], "s"), tgt=CACHE_TARGET,
                details=details, notes=notes)]


def batched(ctx: Ctx) -> list[dict]:
    from backend.controller import api

    per_image = api.make_spec(ctx.model, [str(ctx.models_dir)])
    specs = {"per_image": per_image, "batched": api.sampling_options(per_image, batched=True)[0]}
    groups = Groups(ctx, {"worker": per_image})  # one worker runs both: the option needs no reload
    images: dict[str, np.ndarray] = {}
    try:
        def run(name: str) -> Callable[[int], float]:
            def go(r: int) -> float:
                seconds, images[name] = groups.sample("worker", _request(ctx, 5000 + r, ctx.width, ctx.height,
                                                                         ctx.steps, batch_size=4), specs[name])
                return seconds
            return go

        times = alternate({"per_image": run("per_image"), "batched": run("batched")}, ctx.repeats, ctx.warmup)
    finally:
        groups.close()
    diff = float(np.abs(images["per_image"] - images["batched"]).max())
    return [row(*BATCHED, ratio=median(times["per_image"]) / median(times["batched"]),
                ratio_of="4 images as 4 calls s ÷ as one batched call s (one worker); higher is faster",
                ours=summary(times["batched"], "s"), plain=summary(times["per_image"], "s"),
                details={"workload": f"{ctx.shape_text()}, batch 4", "max_abs_pixel_difference": diff,
                         "bit_identical": diff == 0.0, "repeats": ctx.repeats,
                         "paired_ratio_median": paired(times["per_image"], times["batched"])})]


def warm_start(ctx: Ctx) -> list[dict]:
    """The first image when the worker was started with ComfyUI (COMFYUI_TPU_WARM_START=1; the start is not
    timed, as it overlaps ComfyUI's own start) against the plain script's cold image."""
    from backend.controller import api, group
    from backend.protocol.spec import GroupConfig

    spec = api.checked(api.make_spec(ctx.model, [str(ctx.models_dir)]))
    req = _request(ctx, 0, ctx.width, ctx.height, ctx.steps)

    def ours(_r: int) -> float:
        api.shutdown()
        group.get_group(GroupConfig(kind=spec.kind, world_size=1))  # what api.warm_start does in the background
        t0 = time.perf_counter()
        api.sample(spec, req)
        seconds = time.perf_counter() - t0
        api.shutdown()
        return seconds

    times = alternate({"ours": ours, "plain": lambda r: plain_cold(ctx, ctx.model)["wall_s"]}, ctx.cold_repeats,
                      ctx.cold_warmup)
    api.shutdown()
    return [row(*WARM, ratio=median(times["ours"]) / median(times["plain"]),
                ratio_of="ours s (load + first image in an already started worker) ÷ plain cold s; lower is better",
                ours=summary(times["ours"], "s"), plain=summary(times["plain"], "s"),
                details={"workload": ctx.shape_text(), "repeats": ctx.cold_repeats,
                         "measured": "the worker group is started first, untimed (as COMFYUI_TPU_WARM_START=1 does "
                                     "while ComfyUI starts); then api.sample: load + one image back"})]
