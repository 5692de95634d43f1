"""One Wan video sooner: Context Parallel 2 and CFG Parallel against one worker, and the pack against plain diffusers.

All three from one run: the worker groups (one worker; Context Parallel 2; CFG Parallel) and the plain script are
started together (untimed), then every contestant draws one video per round, in alternating rounds
(bench/common.py `alternate`). The model is `dit-wan`, made here from tiny-wan: its UMT5 text encoder and scheduler
with a wider transformer (4 heads of 64, 4 blocks) and a Wan VAE 4 channels wide throughout (random weights,
seeded), so that the transformer dominates the video's time as in the real 1.3B and 14B models (tiny-wan's own VAE
took 28 of 35 s at this size). The workload is video-shaped: 33 frames
of 320x192, 9 latent frames × 12 × 20 patches = 2160 video tokens next to 512 text tokens. `--quick` uses tiny-wan
at 5 frames of 32x32: it only checks that the figure runs.
"""

from __future__ import annotations

import os
import shutil

from .common import (
    Ctx,
    PlainServer,
    alternate,
    median,
    not_available,
    paired,
    row,
    summary,
    target,
    two_workers,
)
from .speed import Groups

CP = ("wan_context_parallel", "Wan: one video, 1 worker ÷ Context Parallel 2 (Ulysses, video tokens)")
CFG = ("wan_cfg_parallel", "Wan: one video with CFG, 1 worker ÷ CFG Parallel (2 workers)")
PLAIN = ("wan_throughput", "Wan: one video through backend.api (1 worker) vs plain WanPipeline()")
CP_TARGET = target(">=", 1.6)
CFG_TARGET = target(">=", 1.6)
PLAIN_TARGET = target(">=", 0.98)
PROMPT, NEGATIVE = "a red fox running through fresh snow", "blurry, low quality"


def dit_wan(ctx: Ctx) -> str:
    """'dit-wan' in the bench's models folder (made once from tiny-wan, built here if missing)."""
    from backend.tiny_models import build_all

    build_all(ctx.models_dir, families=("wan",))
    if ctx.quick:
        return "tiny-wan"
    target_dir = ctx.models_dir / "dit-wan"
    if not (target_dir / "model_index.json").exists() or (target_dir / "vae" / "config.json").read_text().count(
            '"base_dim": 8'):  # made before the VAE was narrowed: again
        import torch
        from diffusers import AutoencoderKLWan, WanPipeline, WanTransformer3DModel

        tiny = WanPipeline.from_pretrained(ctx.models_dir / "tiny-wan", local_files_only=True, use_safetensors=True)
        torch.manual_seed(0)
        transformer = WanTransformer3DModel(
            patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=64, in_channels=tiny.vae.config.z_dim,
            out_channels=tiny.vae.config.z_dim, text_dim=tiny.text_encoder.config.d_model, freq_dim=64, ffn_dim=1024,
            num_layers=4, rope_max_seq_len=256).eval()
        z_dim = tiny.vae.config.z_dim
        vae = AutoencoderKLWan(base_dim=4, z_dim=z_dim, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                               temperal_downsample=[False, True, True], latents_mean=[0.0] * z_dim,
                               latents_std=[1.0] * z_dim).eval()
        pipe = WanPipeline(tokenizer=tiny.tokenizer, text_encoder=tiny.text_encoder, vae=vae,
                           scheduler=tiny.scheduler, transformer=transformer)
        tmp = target_dir.with_name("dit-wan.tmp")
        pipe.save_pretrained(tmp)
        shutil.rmtree(target_dir, ignore_errors=True)
        os.replace(tmp, target_dir)
    return "dit-wan"


def video(ctx: Ctx) -> list[dict]:
    if why := two_workers(ctx):
        return [not_available(*CP, why, CP_TARGET), not_available(*CFG, why, CFG_TARGET),
                not_available(*PLAIN, why, PLAIN_TARGET)]
    from backend.controller import api
    from backend.protocol.spec import SampleRequest

    model = dit_wan(ctx)
    frames, width, height, steps = (5, 32, 32, 2) if ctx.quick else (33, 320, 192, 4)
    one = api.make_spec(model, [str(ctx.models_dir)])
    specs = {"one": one, "cp": api.context_parallel(one, 2, "ulysses")[0], "cfg": api.cfg_parallel(one)[0]}

    def request(r: int, guidance: float) -> SampleRequest:
        return SampleRequest(prompt=PROMPT, negative_prompt=NEGATIVE, width=width, height=height, frames=frames,
                             steps=steps, guidance=guidance, seed=5000 + r)

    groups = Groups(ctx, specs)
    plain = PlainServer(ctx, model)
    try:
        plain.wait_ready()

        def ours(name: str, guidance: float):
            return lambda r: groups.sample(name, request(r, guidance))[0]

        contestants = {"one": ours("one", 1.0), "cp": ours("cp", 1.0), "one_cfg": ours("one", 5.0),
                       "cfg": ours("cfg", 5.0),
                       "plain_cfg": lambda r: plain.call(5000 + r, width=width, height=height, steps=steps,
                                                         frames=frames, guidance=5.0, prompt=PROMPT,
                                                         negative_prompt=NEGATIVE)["call_s"]}
        times = alternate(contestants, ctx.repeats, ctx.warmup)
        phases = {k: groups.latency(k, request(0, 1.0 if k == "cp" else 5.0)) for k in specs}
    finally:
        groups.close()
        plain.close()
    tokens = ((frames - 1) // 4 + 1) * (width // 16) * (height // 16)
    workload = f"{model}, {frames} frames of {width}x{height} ({tokens} video tokens + 512 text tokens), {steps} steps"
    common = {"repeats": ctx.repeats, "phases_s": phases}

    def ratio(base: str, contender: str) -> float:
        return median(times[base]) / median(times[contender])

    return [
        row(*CP, ratio=ratio("one", "cp"), ratio_of="one worker s/video ÷ Context Parallel 2 s/video; higher is faster",
            ours=summary(times["cp"], "s"), plain=summary(times["one"], "s"), tgt=CP_TARGET,
            details={"workload": f"{workload}, guidance 1 (one pass per step)",
                     "paired_ratio_median": paired(times["one"], times["cp"]), **common}),
        row(*CFG, ratio=ratio("one_cfg", "cfg"), ratio_of="one worker s/video ÷ CFG Parallel s/video; higher is faster",
            ours=summary(times["cfg"], "s"), plain=summary(times["one_cfg"], "s"), tgt=CFG_TARGET,
            details={"workload": f"{workload}, guidance 5 with a negative prompt (two passes per step)",
                     "paired_ratio_median": paired(times["one_cfg"], times["cfg"]), **common}),
        row(*PLAIN, ratio=ratio("plain_cfg", "one_cfg"),
            ratio_of="plain WanPipeline() s/video ÷ ours (api.sample, one worker) s/video; higher is faster",
            ours=summary(times["one_cfg"], "s"), plain=summary(times["plain_cfg"], "s"), tgt=PLAIN_TARGET,
            details={"workload": f"{workload}, guidance 5 with a negative prompt",
                     "paired_ratio_median": paired(times["plain_cfg"], times["one_cfg"]), **common}),
    ]
