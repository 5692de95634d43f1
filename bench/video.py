"""One Wan video sooner: Context Parallel 2 and CFG Parallel against one worker, and the pack against plain diffusers.

All from one run: the worker groups (one worker; Context Parallel 2; CFG Parallel) and the plain script are started
together (untimed), then every contestant draws one video per round, in alternating rounds (bench/common.py
`alternate`). The model is `dit-wan`, made here from tiny-wan: its UMT5 text encoder and scheduler with a wider
transformer (4 heads of 64, 4 blocks) and a Wan VAE 4 channels wide throughout (random weights, seeded). The
workload is video-shaped: 33 frames of 320x192, 9 latent frames × 12 × 20 patches = 2160 video tokens next to 512
text tokens. `--quick` uses tiny-wan at 5 frames of 32x32: it only checks that the figure runs.

What the layouts split is the denoising; the VAE decode runs whole on the first rank, and the text encoding on every
rank. In the real models the denoising is over 99 % of a video's FLOPs (`real_shares`, counted from the shipped
configs); in a bench model small enough for a CPU run of minutes it cannot be: dit-wan's VAE decode takes about as
long as its 4 steps. So each layout has two rows: its denoising (the worker's own phase, every round), on which the
target is read because it is the part that carries over to a real video, and the whole video as measured here, with
what it would come to at a real model's unsplit share (`projected`).
"""

from __future__ import annotations

import json
import os
import shutil
import time

from .common import (
    Ctx,
    PlainServer,
    alternate,
    cpu_seconds,
    median,
    not_available,
    row,
    spread,
    summary,
    target,
    two_workers,
    version,
)
from .speed import Groups

CP = ("wan_context_parallel", "Wan: denoising of one video, 1 worker ÷ Context Parallel 2 (Ulysses, video tokens)")
CP_VIDEO = ("wan_context_parallel_video", "Wan: one whole video (denoising + unsplit VAE decode), 1 worker ÷ Context "
                                          "Parallel 2")
CFG = ("wan_cfg_parallel", "Wan: denoising of one video with CFG, 1 worker ÷ CFG Parallel (2 workers)")
CFG_VIDEO = ("wan_cfg_parallel_video", "Wan: one whole video with CFG (denoising + unsplit VAE decode), 1 worker ÷ "
                                       "CFG Parallel")
PLAIN = ("wan_throughput", "Wan: one video through backend.api (1 worker) vs plain WanPipeline()")
CP_TARGET = target(">=", 1.6)
CFG_TARGET = target(">=", 1.6)
PLAIN_TARGET = target(">=", 0.98)
PROMPT, NEGATIVE = "a red fox running through fresh snow", "blurry, low quality"
ROUNDS = 5  # at most, after 1 warm-up: 5 contestants, ~47 CPU seconds a round (~5 min with the starts)

# The published workloads (name, config folder in backend/configs, width, height, frames, steps); all with CFG (two
# transformer passes per step). Wan 2.1 14B has the shape of each of Wan 2.2 A14B's two experts (one runs per step).
REAL = (
    ("Wan 2.1 T2V 1.3B, 832x480 × 81 frames, 50 steps", "wan21-t2v-1.3b", 832, 480, 81, 50),
    ("Wan 2.1 T2V 1.3B, 1280x720 × 81 frames, 50 steps", "wan21-t2v-1.3b", 1280, 720, 81, 50),
    ("Wan 2.1 T2V 14B, 1280x720 × 81 frames, 50 steps", "wan22-t2v-a14b", 1280, 720, 81, 50),
    ("Wan 2.2 T2V A14B, 1280x720 × 81 frames, 40 steps", "wan22-t2v-a14b", 1280, 720, 81, 40),
    ("Wan 2.2 TI2V 5B, 1280x704 × 121 frames, 50 steps", "wan22-ti2v-5b", 1280, 704, 121, 50),
)


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


def real_shares(ctx: Ctx) -> list[dict]:
    """`count_real` once per diffusers, transformers and torch version (kept beside the bench's models)."""
    versions = "-".join(str(version(d)) for d in ("diffusers", "transformers", "torch"))
    kept = ctx.models_dir / f"wan-real-flops-{versions}.json"
    if kept.exists():
        return json.loads(kept.read_text())
    shares = count_real()
    tmp = kept.with_suffix(".tmp")
    tmp.write_text(json.dumps(shares, indent=1))
    os.replace(tmp, kept)
    return shares


def count_real() -> list[dict]:
    """FLOPs of a real Wan video, counted by torch's FlopCounterMode on the meta device (shapes only: no memory, no
    arithmetic) with diffusers' own modules built from the shipped configs: the denoising (steps × 2 CFG passes ×
    one transformer forward over the video's tokens and 512 text tokens) against what the layouts leave whole, the
    VAE decode and the UMT5 encoding of the prompt and the negative prompt. A few seconds of one core."""
    import torch
    from diffusers import AutoencoderKLWan, WanTransformer3DModel
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import UMT5Config, UMT5EncoderModel

    from backend.families import config_dir

    def flops(fn) -> int:
        counter = FlopCounterMode(display=False)
        with counter, torch.inference_mode():
            fn()
        return counter.get_total_flops()

    forward: dict[tuple, int] = {}
    out = []
    with torch.device("meta"):
        for name, folder, width, height, frames, steps in REAL:
            root = config_dir(folder)
            vae = AutoencoderKLWan.from_config(AutoencoderKLWan.load_config(root / "vae"))
            space, time_ = vae.config.scale_factor_spatial, vae.config.scale_factor_temporal
            z = torch.empty(1, vae.config.z_dim, (frames - 1) // time_ + 1, height // space, width // space)
            key = (folder, width, height, frames)
            if key not in forward:
                net = WanTransformer3DModel.from_config(WanTransformer3DModel.load_config(root / "transformer"))
                forward[key] = flops(lambda net=net, z=z: net(hidden_states=z, timestep=torch.tensor([500]),
                                                              encoder_hidden_states=torch.empty(1, 512, 4096),
                                                              return_dict=False))
            decode = flops(lambda vae=vae, z=z: vae.decode(z, return_dict=False))
            encoder = UMT5EncoderModel(UMT5Config.from_pretrained(root / "text_encoder"))
            text = 2 * flops(lambda encoder=encoder: encoder(input_ids=torch.zeros(1, 512, dtype=torch.long)))
            denoise = steps * 2 * forward[key]
            patch = 2 * space
            tokens = z.shape[2] * (height // patch) * (width // patch)
            out.append({"workload": name, "video_tokens": tokens, "denoise_tflop": round(denoise / 1e12),
                        "transformer_forward_tflop": round(forward[key] / 1e12, 1),
                        "vae_decode_tflop": round(decode / 1e12, 1), "text_encode_tflop": round(text / 1e12, 1),
                        "unsplit_share": (decode + text) / (denoise + decode + text)})
    return out


def projected(ratio: float, share: float) -> float:
    """The whole video's speed-up when only the denoising is split (Amdahl): `share` of it stays whole."""
    return 1 / ((1 - share) / ratio + share)


def video(ctx: Ctx) -> list[dict]:
    if why := two_workers(ctx):
        return [not_available(*r, why, t) for r, t in ((CP, CP_TARGET), (CP_VIDEO, None), (CFG, CFG_TARGET),
                                                        (CFG_VIDEO, None), (PLAIN, PLAIN_TARGET))]
    from backend.controller import api
    from backend.protocol.spec import SampleRequest

    model = dit_wan(ctx)
    frames, width, height, steps = (5, 32, 32, 2) if ctx.quick else (33, 320, 192, 4)
    shares = [] if ctx.quick else real_shares(ctx)
    one = api.make_spec(model, [str(ctx.models_dir)])
    specs = {"one": one, "cp": api.context_parallel(one, 2, "ulysses")[0], "cfg": api.cfg_parallel(one)[0]}
    rounds, warmup = min(ctx.repeats, ROUNDS), min(ctx.warmup, 1)

    def request(r: int, guidance: float) -> SampleRequest:
        return SampleRequest(prompt=PROMPT, negative_prompt=NEGATIVE, width=width, height=height, frames=frames,
                             steps=steps, guidance=guidance, seed=5000 + r)

    phases: dict[str, list[dict]] = {}  # per contestant, per measured round: the worker's phases and each rank's CPU
    plain_cpu: list[float] = []
    groups = Groups(ctx, specs)
    plain = PlainServer(ctx, model)
    try:
        plain.wait_ready()
        ranks = {k: groups.info(k) for k in specs}
        pids = {k: [w["pid"] for w in info] for k, info in ranks.items()}

        def ours(contestant: str, name: str, guidance: float):
            def run(r: int) -> float:
                cpu0 = [cpu_seconds([p]) for p in pids[name]]
                seconds = groups.sample(name, request(r, guidance))[0]
                if r >= 0:
                    cpu = [round(cpu_seconds([p]) - c, 3) for p, c in zip(pids[name], cpu0, strict=True)]
                    phases.setdefault(contestant, []).append({**groups.last_latency[name], "cpu_s_per_rank": cpu})
                return seconds
            return run

        def plain_video(r: int) -> float:
            out = plain.call(5000 + r, width=width, height=height, steps=steps, frames=frames, guidance=5.0,
                             prompt=PROMPT, negative_prompt=NEGATIVE)
            if r >= 0:
                plain_cpu.append(out["cpu_s"])
            return out["call_s"]

        contestants = {"one": ours("one", "one", 1.0), "cp": ours("cp", "cp", 1.0),
                       "one_cfg": ours("one_cfg", "one", 5.0), "cfg": ours("cfg", "cfg", 5.0),
                       "plain_cfg": plain_video}
        t0 = time.perf_counter()
        times = alternate(contestants, rounds, warmup)
        rounds_s = time.perf_counter() - t0
    finally:
        groups.close()
        plain.close()
    tokens = ((frames - 1) // 4 + 1) * (width // 16) * (height // 16)
    workload = f"{model}, {frames} frames of {width}x{height} ({tokens} video tokens + 512 text tokens), {steps} steps"

    def phase(contestant: str, key: str) -> list[float]:
        return [p[key] for p in phases[contestant]]

    def per_round(contestant: str) -> dict:
        return {"denoise_s": summary(phase(contestant, "denoise_s")), "vae_s": summary(phase(contestant, "vae_s")),
                "text_s": median(phase(contestant, "text_s")),
                "cpu_s_per_rank_median": [median(c) for c in zip(*phase(contestant, "cpu_s_per_rank"), strict=True)]}

    common = {"rounds": rounds, "warmup": warmup, "rounds_s": round(rounds_s, 1),
              "threads_per_rank": {k: [w["threads"] for w in info] for k, info in ranks.items()},
              "phases": {k: per_round(k) for k in phases}, "real_models": list(shares)}

    def layout_rows(ids: tuple, video_ids: tuple, tgt: dict, base: str, split: str, what: str,
                    guidance: str) -> list[dict]:
        denoise = median(phase(base, "denoise_s")) / median(phase(split, "denoise_s"))
        whole = median(times[base]) / median(times[split])
        at_real = {s["workload"]: round(projected(denoise, s["unsplit_share"]), 3) for s in shares}
        shape = f"{workload}, {guidance}"
        unsplit = (median(phase(base, "vae_s")) + median(phase(base, "text_s"))) / median(times[base])
        return [
            row(*ids, ratio=denoise, tgt=tgt,
                ratio_of=f"one worker's denoising s ÷ {what}'s (the worker's phase: from the call to the last step, "
                         "text encoding excluded), ratio of medians; higher is faster",
                ours=summary(phase(split, "denoise_s")), plain=summary(phase(base, "denoise_s")),
                details={"workload": shape, **spread(phase(base, "denoise_s"), phase(split, "denoise_s")),
                         "whole_video_ratio": whole, "bench_unsplit_share": unsplit,
                         "projected_whole_video_at_real_share": at_real, **common}),
            row(*video_ids, ratio=whole,
                ratio_of=f"one worker s/video ÷ {what} s/video (request to frames back), ratio of medians; higher is "
                         "faster; the VAE decode is not split",
                ours=summary(times[split], "s"), plain=summary(times[base], "s"),
                details={"workload": shape, **spread(times[base], times[split]), "denoising_ratio": denoise,
                         "bench_unsplit_share": unsplit,
                         "vae_s_median": {base: median(phase(base, "vae_s")), split: median(phase(split, "vae_s"))},
                         "projected_whole_video_at_real_share": at_real}),
        ]

    return [
        *layout_rows(CP, CP_VIDEO, CP_TARGET, "one", "cp", "Context Parallel 2", "guidance 1 (one pass per step)"),
        *layout_rows(CFG, CFG_VIDEO, CFG_TARGET, "one_cfg", "cfg", "CFG Parallel",
                     "guidance 5 with a negative prompt (two passes per step)"),
        row(*PLAIN, ratio=median(times["plain_cfg"]) / median(times["one_cfg"]),
            ratio_of="plain WanPipeline() s/video ÷ ours (api.sample, one worker) s/video, ratio of medians; higher is "
                     "faster",
            ours=summary(times["one_cfg"], "s"), plain=summary(times["plain_cfg"], "s"), tgt=PLAIN_TARGET,
            details={"workload": f"{workload}, guidance 5 with a negative prompt",
                     **spread(times["plain_cfg"], times["one_cfg"]), "rounds": rounds, "warmup": warmup,
                     "cpu_s_per_video_median": {"ours_worker": median([sum(p["cpu_s_per_rank"])
                                                                       for p in phases["one_cfg"]]),
                                                "plain": median(plain_cpu)}}),
    ]
