"""fp8 storage and step caching: what each buys, against the same pack without it, in the same run.

- fp8 storage: one worker holding a FLUX.1-shaped model with its transformer stored in bfloat16, another with it
  in fp8 (dtype float8_e4m3fn, bfloat16 compute). Each worker's RSS is sampled while it loads the model and draws
  its first image; what the model adds is counted above the worker's RSS after a tiny model's first image (the
  imports). Reported: the peak while loading and drawing, and what the worker holds afterwards; speed per image in
  alternating rounds; the pixel difference (max and PSNR) between the two images of each round.
- step caching: FLUX.1- and Qwen-Image-shaped models (random weights) at 28 steps, one worker, each cache kind
  that suits the model at its default threshold against no caching, alternating; PSNR of each cached image
  against the uncached one of the same seed.

The models are bench-only and built here (random weights, seeded): `wide-flux` (tiny-flux's text encoders and
VAE with a 1024-wide transformer of 4 double and 8 single blocks, ~650 MB in bfloat16) for memory, `dit-flux`
(bench/speed.py) and `dit-qwen-light-vae` (tiny-qwenimage with a 96-wide, 4-block transformer and a 4-channel VAE) for
caching.
"""

from __future__ import annotations

import math
import os
import threading
import time

import numpy as np

from .common import Ctx, alternate, log, median, paired, qty, row, summary, target
from .speed import Groups, dit_model

FP8 = ("fp8_storage", "fp8 storage: worker memory for the model, transformer in fp8 ÷ in bfloat16 (peak while "
                      "loading and drawing)")
FP8_HELD = ("fp8_storage_held", "fp8 storage: worker memory held after the first image, fp8 ÷ bfloat16")
FP8_SPEED = ("fp8_storage_speed", "fp8 storage: s/image, fp8 storage ÷ bfloat16 storage")
FP8_TARGET = target("<=", 0.55)
CACHE_FLUX = ("step_cache_flux", "Step caching, FLUX.1-shaped, 28 steps: s/image uncached ÷ cached (best kind)")
CACHE_QWEN = ("step_cache_qwen", "Step caching, Qwen-Image-shaped, 28 steps: s/image uncached ÷ cached (best kind)")
CACHE_TARGET = target(">=", 1.6)
PROMPT = "a lighthouse on a cliff at dusk, oil painting"
MB = 1e6


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """Peak signal-to-noise ratio in dB of two images in 0..1 (inf when equal)."""
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(1 / mse)


def _request(seed: int, width: int, steps: int, guidance: float, **kw):
    from backend.protocol.spec import SampleRequest

    return SampleRequest(prompt=PROMPT, width=width, height=width, steps=steps, guidance=guidance, seed=seed, **kw)


def _build(ctx: Ctx, name: str, base: str, **make) -> str:
    """`name` in the bench's models folder (made once): `base` with the components each `make[...]()` returns."""
    target_dir = ctx.models_dir / name
    if not (target_dir / "model_index.json").exists():
        import torch
        from diffusers import DiffusionPipeline

        torch.manual_seed(0)
        pipe = DiffusionPipeline.from_pretrained(ctx.models_dir / base, **{k: f() for k, f in make.items()},
                                                 local_files_only=True, use_safetensors=True)
        tmp = target_dir.with_name(name + ".tmp")
        pipe.save_pretrained(tmp)
        os.replace(tmp, target_dir)
    return name


def wide_flux(ctx: Ctx) -> str:
    if ctx.quick:
        return "tiny-flux"

    def make():
        import torch
        from diffusers import FluxTransformer2DModel

        return FluxTransformer2DModel(patch_size=1, in_channels=16, num_layers=4, num_single_layers=8,
                                      attention_head_dim=128, num_attention_heads=8, joint_attention_dim=32,
                                      pooled_projection_dim=32, guidance_embeds=False,
                                      axes_dims_rope=(16, 56, 56)).to(torch.bfloat16).eval()

    return _build(ctx, "wide-flux", "tiny-flux", transformer=make)


def dit_qwen(ctx: Ctx) -> str:
    """tiny-qwenimage with a 96-wide, 4-block transformer and its VAE made 4 channels wide: at 512² the tiny
    VAE (Qwen-Image's Wan-style causal 3D convolutions, 8 channels) took 44 % of an image, where a real model's VAE
    takes a few per cent (as for dit-flux, bench/speed.py)."""
    from backend.tiny_models import build_all

    build_all(ctx.models_dir, families=("qwenimage",), size="tiny")
    if ctx.quick:
        return "tiny-qwenimage"

    def transformer():
        from diffusers import QwenImageTransformer2DModel

        return QwenImageTransformer2DModel(patch_size=2, in_channels=16, out_channels=4, num_layers=4,
                                           attention_head_dim=24, num_attention_heads=4, joint_attention_dim=32,
                                           axes_dims_rope=(8, 8, 8)).eval()

    def vae():
        from diffusers import AutoencoderKLQwenImage

        config = AutoencoderKLQwenImage.load_config(ctx.models_dir / "tiny-qwenimage" / "vae")
        return AutoencoderKLQwenImage.from_config({**config, "base_dim": 4, "dim_mult": [1, 1, 1, 1]}).eval()

    return _build(ctx, "dit-qwen-light-vae", "tiny-qwenimage", transformer=transformer, vae=vae)


# ---- fp8 storage

def _memory(ctx: Ctx, groups: Groups, name: str, spec, req, warm=None, load_first: bool = False) -> dict:
    """What `spec` adds to group `name`'s worker RSS: at its peak while loading and drawing one image, and after
    (counted from the RSS after `warm`'s first image: tiny-flux unless given); `load_first`: also at the peak while
    loading alone and once loaded (a load request before the image)."""
    import psutil

    from backend.controller import api

    warm = warm or api.make_spec("tiny-flux", [str(ctx.models_dir)])
    groups.sample(name, _request(1, 64, 2, 0.0), warm)  # imports and first-call allocations
    proc = psutil.Process(groups.info(name)[0]["pid"])
    before = proc.memory_info().rss
    peak, stop = [before], threading.Event()

    def watch() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            time.sleep(0.002)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    load = {}
    try:
        if load_first:
            groups.groups[name].load(groups.api.checked(spec))
            load = {"load_peak_mb": (peak[0] - before) / MB, "loaded_mb": (proc.memory_info().rss - before) / MB}
        groups.sample(name, req, spec)
    finally:
        stop.set()
        watcher.join()
    after = proc.memory_info().rss
    return {"before_mb": before / MB, **load, "peak_mb": (peak[0] - before) / MB, "held_mb": (after - before) / MB}


def fp8_storage(ctx: Ctx) -> list[dict]:
    from backend.controller import api

    model = wide_flux(ctx)
    width, steps = (ctx.width, ctx.steps) if ctx.quick else (256, 4)
    roots = [str(ctx.models_dir)]
    specs = {"bf16": api.make_spec(model, roots, dtype="bfloat16"),
             "fp8": api.make_spec(model, roots, dtype="float8_e4m3fn")}
    warm = api.make_spec("tiny-flux", roots)
    groups = Groups(ctx, {"bf16": warm, "fp8": warm})
    images: dict[str, dict[int, np.ndarray]] = {"bf16": {}, "fp8": {}}
    try:
        memory = {k: _memory(ctx, groups, k, specs[k], _request(0, width, steps, 0.0)) for k in ("bf16", "fp8")}

        def run(name: str):
            def go(r: int) -> float:
                seconds, images[name][r] = groups.sample(name, _request(6000 + r, width, steps, 0.0), specs[name])
                return seconds
            return go

        times = alternate({"bf16": run("bf16"), "fp8": run("fp8")}, ctx.repeats, ctx.warmup)
    finally:
        groups.close()
    log(f"fp8_storage: {memory}")
    peak = memory["fp8"]["peak_mb"] / memory["bf16"]["peak_mb"]
    held = memory["fp8"]["held_mb"] / memory["bf16"]["held_mb"]
    t_bf16, t_fp8 = median(times["bf16"]), median(times["fp8"])
    diffs = [(float(np.abs(images["fp8"][r] - images["bf16"][r]).max()), psnr(images["fp8"][r], images["bf16"][r]))
             for r in range(ctx.repeats)]
    details = {"workload": f"{model}, {width}x{width}, {steps} steps, guidance 0, one worker each",
               "memory_mb": memory, "disk_mb": _disk_mb(ctx, model),
               "pixel_difference_fp8_vs_bf16": {"max_abs": max(d for d, _ in diffs),
                                                "psnr_db_min": min(p for _, p in diffs)},
               "repeats": ctx.repeats}
    notes = ["the transformer is read from its safetensors file straight into fp8 (no bfloat16 copy, the file's pages "
             "released as it goes), and the CPU worker has glibc return freed blocks of 1 MiB or more (layerwise "
             "casting allocates every layer's weights anew at each call); on a TPU or GPU the weights reach the "
             "device already in fp8"]
    return [row(*FP8, ratio=peak, ratio_of="MB the model adds at the worker's RSS peak, fp8 ÷ bfloat16",
                ours=qty(round(memory["fp8"]["peak_mb"]), "MB"), plain=qty(round(memory["bf16"]["peak_mb"]), "MB"),
                tgt=FP8_TARGET, details=details, notes=notes),
            row(*FP8_HELD, ratio=held, ratio_of="MB the worker holds for the model after its first image, fp8 ÷ "
                                               "bfloat16", ours=qty(round(memory["fp8"]["held_mb"]), "MB"),
                plain=qty(round(memory["bf16"]["held_mb"]), "MB"), tgt=FP8_TARGET, details=details),
            row(*FP8_SPEED, ratio=t_fp8 / t_bf16, ratio_of="fp8 storage s/image ÷ bfloat16 s/image; lower is faster",
                ours=summary(times["fp8"], "s"), plain=summary(times["bf16"], "s"),
                details={**details, "paired_ratio_median": paired(times["fp8"], times["bf16"])})]


def _disk_mb(ctx: Ctx, model: str) -> float:
    return sum(p.stat().st_size for p in (ctx.models_dir / model).rglob("*.safetensors")) / MB


# ---- step caching

def _caching(ctx: Ctx, fid: tuple[str, str], model: str, guidance: float) -> dict:
    from backend.controller import api

    width, steps = (ctx.width, ctx.steps) if ctx.quick else (512, 28)
    base = api.make_spec(model, [str(ctx.models_dir)])
    kinds = ["off", *base.family.step_caches]
    specs = {k: api.sampling_options(base, step_cache=k)[0] for k in kinds}
    groups = Groups(ctx, {"worker": base})  # one worker runs every kind: changing it never reloads
    images: dict[str, dict[int, np.ndarray]] = {k: {} for k in kinds}
    try:
        def run(kind: str):
            def go(r: int) -> float:
                seconds, images[kind][r] = groups.sample("worker", _request(7000 + r, width, steps, guidance),
                                                         specs[kind])
                return seconds
            return go

        rounds = min(ctx.repeats, 5)
        times = alternate({k: run(k) for k in kinds}, rounds, min(ctx.warmup, 1))
    finally:
        groups.close()
    per_kind = {}
    for k in kinds[1:]:
        quality = [psnr(images[k][r], images["off"][r]) for r in range(rounds)]
        per_kind[k] = {"speedup": median(times["off"]) / median(times[k]), "s_per_image": summary(times[k], "s"),
                       "psnr_db_median": median(quality), "psnr_db_min": min(quality),
                       "paired_speedup_median": paired(times["off"], times[k])}
    best = max(per_kind, key=lambda k: per_kind[k]["speedup"])
    log(f"{fid[0]}: " + ", ".join(f"{k} {v['speedup']:.2f}x PSNR {v['psnr_db_median']:.1f} dB"
                                  for k, v in per_kind.items()))
    return row(*fid, ratio=per_kind[best]["speedup"],
               ratio_of=f"uncached s/image ÷ {best} s/image (default threshold); every kind in details",
               ours=summary(times[best], "s"), plain=summary(times["off"], "s"), tgt=CACHE_TARGET,
               details={"workload": f"{model} {width}x{width}, {steps} steps, guidance {guidance:g}, one worker",
                        "best_kind": best, "kinds": per_kind, "repeats": rounds},
               notes=["random weights: the first block cache skips only when the first block's output changes less "
                      "than the threshold between steps, which a random-weight model's may not do as a trained "
                      "one's does; taylorseer and magcache skip by the step number alone"])


def step_cache(ctx: Ctx) -> list[dict]:
    return [_caching(ctx, CACHE_FLUX, dit_model(ctx), 0.0), _caching(ctx, CACHE_QWEN, dit_qwen(ctx), 4.0)]
