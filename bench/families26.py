"""The 2026 families against plain diffusers (issues 36 and 37): Qwen-Image 2.1, Krea 2, LTX-2 and MiniMax H3.

Each row is measured as the Z-Image and Wan rows are, in the same run and in alternating rounds: `api.sample` (one
worker) against the plain script's call of diffusers' own pipeline (`QwenImage21Pipeline`, `Krea2Pipeline`,
`LTX2Pipeline`, `MiniMaxH3ModularPipeline`), with the same call in a second, identical plain process as the A/A
control (bench/figures.py `against_plain`), and the CPU seconds of each side beside the wall-time ratio. The layout
rows (CFG Parallel 2, Context Parallel 2) read their target on the worker's denoising phase, as the Wan rows do
(bench/video.py): it is the part the layouts split. A layout the pack refuses for a family gets a row that says so,
with the refusal's own words, and is measured as soon as the pack accepts it.

Models: the images run the families' tiny builders (backend/families/<id>/tiny.py) at a size where one image takes
about a second on one core; the videos run `dit-ltx2` and `dit-minimax-h3`, made here from the tiny folders with a
wider and deeper transformer (8 heads of 64, 6 blocks; LTX-2's sound stream 8 heads of 32), so that the denoising
is most of a video as in the real models (random weights, seeded). The throughput rows run a small video (a fixed
cost of ours still shows there); the layout rows a bigger one, whose denoising takes seconds on one worker, as
dit-wan's layout rows had: at a third of a second the 2-rank exchanges outweighed the split work. Each layout row
has an A/A control: a second, identical one-worker group in the same rounds (its denoising against the first's).
`--quick` runs the tiny folders at their smallest sizes: it only checks that the rows run.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable

from .common import (
    Ctx,
    alternate,
    cpu_seconds,
    median,
    not_available,
    row,
    spread,
    summary,
    target,
    two_workers,
)
from .figures import _noise_note as twin_note
from .figures import against_plain

THROUGHPUT_TARGET = target(">=", 0.98)
CFG_TARGET = target(">=", 1.6)
CP_TARGET = target(">=", 1.5)
QWEN = ("qwenimage21_throughput", "Qwen-Image 2.1: warm throughput through backend.api vs plain QwenImage21Pipeline()")
KREA = ("krea2_throughput", "Krea 2: warm throughput through backend.api vs plain Krea2Pipeline()")
LTX = ("ltx2_throughput", "LTX-2: one video with sound through backend.api (1 worker) vs plain LTX2Pipeline()")
LTX_CFG = ("ltx2_cfg_parallel", "LTX-2: denoising of one video with CFG, 1 worker ÷ CFG Parallel (2 workers)")
LTX_CP = ("ltx2_context_parallel", "LTX-2: denoising of one video, 1 worker ÷ Context Parallel 2 (Ulysses)")
MM = ("minimax_h3_throughput", "MiniMax H3: one video with sound through backend.api (1 worker) vs plain "
                               "MiniMaxH3ModularPipeline()")
MM_CFG = ("minimax_h3_cfg_parallel", "MiniMax H3: denoising of one video, 1 worker ÷ CFG Parallel (2 workers)")
MM_CP = ("minimax_h3_context_parallel", "MiniMax H3: denoising of one video, 1 worker ÷ Context Parallel 2 (Ulysses)")
IMAGE_ROWS = ((QWEN, THROUGHPUT_TARGET), (KREA, THROUGHPUT_TARGET))
VIDEO_ROWS = ((LTX, THROUGHPUT_TARGET), (LTX_CFG, CFG_TARGET), (LTX_CP, CP_TARGET), (MM, THROUGHPUT_TARGET),
              (MM_CFG, CFG_TARGET), (MM_CP, CP_TARGET))
PROMPT, NEGATIVE = "a red fox running through fresh snow", "blurry, low quality"
ROUNDS = 5  # at most, after 1 warm-up (as the Wan rows)
# What LTX-2's worker passes beside the guidance (backend/families/ltx2 OFF: STG, modality isolation and rescale off)
LTX_OFF = {"stg_scale": 0.0, "modality_scale": 1.0, "guidance_rescale": 0.0, "audio_stg_scale": 0.0,
           "audio_modality_scale": 1.0, "audio_guidance_rescale": 0.0, "spatio_temporal_guidance_blocks": None}
# The transformers of the dit- folders, sized so that one worker's denoising takes seconds on one CPU thread as
# dit-wan's did for its layout rows (8 heads of 64, 6 blocks; a 2-rank layout's exchanges then weigh what they
# would on a real model, not 2x the work): config changes per component (the rest is the tiny folder's)
# LTX-2's sound stream at half the video's width as in the published model (8 heads of 32; the attention between
# the streams runs the video's 8 heads over it, so its width must split into them)
_DIT_LTX2 = {"transformer": {"num_attention_heads": 8, "attention_head_dim": 64, "cross_attention_dim": 512,
                             "num_layers": 6, "audio_num_attention_heads": 8, "audio_attention_head_dim": 32,
                             "audio_cross_attention_dim": 256},
             "connectors": {"video_connector_num_attention_heads": 8, "video_connector_attention_head_dim": 64,
                            "video_hidden_dim": 512, "audio_connector_num_attention_heads": 8,
                            "audio_connector_attention_head_dim": 32, "audio_hidden_dim": 256}}
_MM_DIT = {"num_attention_heads": 8, "attention_head_dim": 64, "hidden_size": 512, "ffn_dim": 2048, "num_layers": 6}
_DIT_MINIMAX = {"transformer": _MM_DIT, "transformer_ref": _MM_DIT}


def dit_folder(ctx: Ctx, tiny: str, name: str, changes: dict[str, dict]) -> str:
    """`name` in the bench's models folder (made once): the tiny folder `tiny` (built if missing) with each
    component of `changes` made anew from its config with those changes (random weights, seeded). Works for a
    DiffusionPipeline folder and a modular one alike: each component is a subfolder with its own config."""
    import torch

    from backend.tiny_models import build_all

    build_all(ctx.models_dir, families=(tiny,))
    target_dir = ctx.models_dir / name
    made = json.dumps(changes, sort_keys=True)  # a folder made with other changes is made again
    if (target_dir / ".complete").exists() and (target_dir / ".complete").read_text() == made:
        return name
    tmp = target_dir.with_name(f"{name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(ctx.models_dir / f"tiny-{tiny}", tmp)
    for component, change in changes.items():
        config = json.loads((tmp / component / "config.json").read_text())
        cls = _component_class(config["_class_name"])
        torch.manual_seed(0)
        model = cls.from_config({**config, **change}).eval()
        shutil.rmtree(tmp / component)
        model.save_pretrained(tmp / component, safe_serialization=True)
    (tmp / ".complete").write_text(made)
    shutil.rmtree(target_dir, ignore_errors=True)
    os.replace(tmp, target_dir)
    return name


def _component_class(class_name: str):
    import diffusers

    if hasattr(diffusers, class_name):
        return getattr(diffusers, class_name)
    from diffusers.pipelines import ltx2

    return getattr(ltx2, class_name)


# ---- images: Qwen-Image 2.1 and Krea 2 against plain diffusers


def images(ctx: Ctx) -> list[dict]:
    """Qwen-Image 2.1 at guidance 1 (its templates' cfg 1: one pass per step) and Krea 2 at guidance 0 (Turbo: one
    pass), one image per call, each against its plain pipeline and the plain pipeline's twin."""
    from backend.tiny_models import build_all

    build_all(ctx.models_dir, families=("qwenimage21", "krea2"))
    # (row, folder, side, steps, guidance, the pipeline's name for the guidance); one image takes ~0.8 s and ~1.2 s
    cases = ((QWEN, "tiny-qwenimage21", 512, 4, 1.0, "true_cfg_scale"),
             (KREA, "tiny-krea2", 256, 4, 0.0, "guidance_scale"))
    rows = []
    for ids, model, side, steps, guidance, guidance_arg in cases:
        if ctx.quick and ids == KREA:  # the smoke test: one family runs this code path (a worker start less)
            rows.append(not_available(*ids, "--quick runs Qwen-Image 2.1's row only, the same code path",
                                      THROUGHPUT_TARGET))
            continue
        side, steps = (64, 2) if ctx.quick else (side, steps)
        rows.append(_against_plain_row(ctx, ids, model, dict(
            width=side, height=side, steps=steps, guidance=guidance), {"guidance_arg": guidance_arg},
            f"{model} {side}x{side}, {steps} steps, guidance {guidance:g} (one pass per step)", "s/image"))
    return rows


def _against_plain_row(ctx: Ctx, ids: tuple[str, str], model: str, shape: dict, plain_extra: dict, workload: str,
                       unit: str, **request) -> dict:
    """One `against_plain` row: `shape` (width, height, steps, guidance, frames) and `request` (more of the
    SampleRequest) for ours, the same plus `plain_extra` (the pipeline's own argument names) for plain."""
    from backend.controller import api
    from backend.protocol.spec import SampleRequest

    spec = api.make_spec(model, [str(ctx.models_dir)])

    def api_call(r: int, progress) -> None:
        api.sample(spec, SampleRequest(prompt=PROMPT, seed=1000 + r, **shape, **request), progress)

    def plain_call(plain, r: int) -> dict:
        negative = {"negative_prompt": request["negative_prompt"]} if request.get("negative_prompt") else {}
        return plain.call(1000 + r, prompt=PROMPT, **shape, **negative, **plain_extra)

    times, details = against_plain(ctx, model, api_call, plain_call, plain_args=_plain_args(model))
    return row(*ids, ratio=median(times["plain"]) / median(times["api"]), tgt=THROUGHPUT_TARGET,
               ratio_of=f"plain pipeline {unit} ÷ api.sample {unit} (ratio of medians); ≥ 1 is as fast as plain",
               ours=summary(times["api"], unit), plain=summary(times["plain"], unit), notes=_noise_note(details),
               details={"workload": workload, **details})


def _plain_args(model: str) -> tuple[str, ...]:
    """The plain script's load options: MiniMax H3 is a modular pipeline (its t2va workflow)."""
    return ("--modular", "t2va") if "minimax" in model else ()


def _noise_note(details: dict) -> list[str]:
    cpu = details["cpu_s_per_image_median"]
    return twin_note(details) + [f"CPU seconds per call: ours {cpu['api']:.3f} (controller + worker), plain "
                            f"{cpu['plain']:.3f}" + (f", twin {cpu['twin']:.3f}" if "twin" in cpu else "")]


# ---- videos: LTX-2 and MiniMax H3 against plain diffusers, CFG Parallel 2 and Context Parallel 2


def videos(ctx: Ctx) -> list[dict]:
    """LTX-2 (dit-ltx2: 33 frames of 320x192, 4 steps, guidance 3 with a negative prompt, CFG on a doubled batch)
    and MiniMax H3 (dit-minimax-h3: its shortest video, 124 frames, at 128x128, 4 steps; guidance distilled, one
    pass), each against its plain pipeline, then its layouts against one worker: LTX-2's CFG Parallel at 768x512 ×
    33 frames and its Context Parallel at 768x512 × 121 (LTX-2's default video), MiniMax H3's at 256x256."""
    rows: list[dict] = []
    ltx = "tiny-ltx2" if ctx.quick else dit_folder(ctx, "ltx2", "dit-ltx2", _DIT_LTX2)
    mm = "tiny-minimax-h3" if ctx.quick else dit_folder(ctx, "minimax-h3", "dit-minimax-h3", _DIT_MINIMAX)
    if ctx.quick:
        from backend.tiny_models import build_all

        build_all(ctx.models_dir, families=("ltx2", "minimax-h3"))
    # the throughput rows: a small video (about a second of CPU), where a fixed cost of ours would still show; the
    # layout rows: more video tokens, so that one worker's denoising takes seconds, as a real video's steps do, and
    # the 2-rank exchanges weigh less: LTX-2's CFG Parallel at 1920 (768x512 x 33), its Context Parallel, which
    # splits the tokens, at LTX-2's default video (121 frames of 768x512, workflows/ltx2_t2v_sound.json: 6144, next
    # to the prompt's 1024; the LTX-2.3 templates' second stage, 1280x704 x 121, has 14,080), MiniMax H3 4x its
    # throughput row's
    ltx_shape = dict(width=64, height=64, frames=9, steps=2) if ctx.quick else dict(width=320, height=192,
                                                                                    frames=33, steps=4)
    ltx_cfg = ltx_shape if ctx.quick else dict(ltx_shape, width=768, height=512)
    ltx_cp = ltx_shape if ctx.quick else dict(ltx_cfg, frames=121)
    mm_shape = dict(width=32, height=32, frames=124, steps=2) if ctx.quick else dict(width=128, height=128,
                                                                                     frames=124, steps=4)
    mm_layout = mm_shape if ctx.quick else dict(mm_shape, width=256, height=256)
    ltx_plain = {"frame_rate": 25.0, "extra": {**LTX_OFF, "audio_guidance_scale": 3.0}}  # as the worker passes
    rows.append(_against_plain_row(
        ctx, LTX, ltx, {**ltx_shape, "guidance": 3.0}, ltx_plain,
        _video_text(ltx, ltx_shape, "guidance 3 with a negative prompt (CFG: a doubled batch), 25 fps"), "s/video",
        negative_prompt=NEGATIVE, frame_rate=25.0))
    rows.append(_against_plain_row(ctx, MM, mm, {**mm_shape, "guidance": 1.0}, {},
                                   _video_text(mm, mm_shape, "guidance distilled (one pass per step), 24 fps"),
                                   "s/video"))
    # the templates' 25 fps for the layouts too: Context Parallel 2 splits the video's tokens; the sound's audio
    # latents (25 a second: as many as the frames, odd) run whole on every rank
    for shape, layout in ((ltx_cfg, (LTX_CFG, CFG_TARGET, "cfg", 3.0)), (ltx_cp, (LTX_CP, CP_TARGET, "cp", 1.0))):
        rows += _layouts(ctx, ltx, shape, {"negative_prompt": NEGATIVE, "frame_rate": 25.0}, (layout,))
    rows += _layouts(ctx, mm, mm_layout, {}, ((MM_CFG, CFG_TARGET, "cfg", 1.0), (MM_CP, CP_TARGET, "cp", 1.0)))
    return rows


def _video_text(model: str, shape: dict, what: str) -> str:
    return f"{model}, {shape['frames']} frames of {shape['width']}x{shape['height']}, {shape['steps']} steps, {what}"


def _layout_spec(one, layout: str):
    """The 2-rank spec of `layout` ("cfg", "cp"), or the pack's refusal (its own message)."""
    from backend.controller import api
    from backend.protocol.errors import InputError

    try:
        two = api.cfg_parallel(one)[0] if layout == "cfg" else api.context_parallel(one, 2, "ulysses")[0]
        return api.checked(two)
    except InputError as e:
        return f"{type(e).__name__}: {e}"


def _even_prompt(groups, shape: dict, request: dict) -> str:
    """The bench's prompt, or it with one more token, whichever Context Parallel 2 splits evenly: MiniMax H3's
    packed sequence holds the prompt's tokens, and the pack refuses an odd count naming this very fix (a word more
    or less). Probed with two steps (MiniMax H3 takes no fewer); every contestant then runs the same prompt."""
    from backend.protocol.errors import ParallelError
    from backend.protocol.spec import SampleRequest

    for prompt in (PROMPT, PROMPT + ",", PROMPT + " at dusk", PROMPT + ", at dusk"):
        try:
            groups.sample("cp", SampleRequest(prompt=prompt, seed=1, **{**shape, **request, "steps": 2}))
            return prompt
        except ParallelError:
            continue
    return PROMPT  # the runs then fail with the pack's own message


def _layouts(ctx: Ctx, model: str, shape: dict, request: dict,
             layouts: tuple[tuple[tuple[str, str], dict, str, float], ...]) -> list[dict]:
    """Each accepted layout against one worker at that layout's guidance, in alternating rounds in one run; the
    target is read on the worker's denoising phase (every round), the whole video and each rank's CPU seconds beside
    it. A refused layout: a row with the refusal."""
    from backend.controller import api
    from backend.protocol.spec import SampleRequest

    from .speed import Groups

    one = api.make_spec(model, [str(ctx.models_dir)])
    rows, specs, runs = [], {}, []
    for ids, tgt, layout, guidance in layouts:
        two = _layout_spec(one, layout)
        if isinstance(two, str):
            rows.append(not_available(*ids, f"the pack refuses this layout for {model}: {two}", tgt))
        elif why := two_workers(ctx):
            rows.append(not_available(*ids, why, tgt))
        else:
            specs[layout] = two
            runs.append((ids, tgt, layout, guidance))
    if not runs:
        return rows
    specs["one"] = one
    aa = min(guidance for *_, guidance in runs)  # the A/A control: a second, identical worker at this guidance
    if not ctx.quick:  # (as the throughput rows' twin: not in the smoke test)
        specs["twin"] = one
    phases: dict[str, list[dict]] = {}
    rounds, warmup = min(ctx.repeats, ROUNDS), min(ctx.warmup, 1)
    groups = Groups(ctx, specs)
    try:
        pids = {k: [w["pid"] for w in groups.info(k)] for k in specs}
        prompt = _even_prompt(groups, shape, request) if "cp" in specs else PROMPT

        def contestant(name: str, group: str, guidance: float) -> Callable[[int], float]:
            def run(r: int) -> float:
                req = SampleRequest(prompt=prompt, seed=6000 + r, guidance=guidance, **shape, **request)
                cpu0 = [cpu_seconds([p]) for p in pids[group]]
                seconds = groups.sample(group, req)[0]
                if r >= 0:
                    cpu = [round(cpu_seconds([p]) - c, 3) for p, c in zip(pids[group], cpu0, strict=True)]
                    phases.setdefault(name, []).append({**groups.last_latency[group], "cpu_s_per_rank": cpu})
                return seconds
            return run

        contestants = {}
        for _ids, _tgt, layout, guidance in runs:
            contestants[f"one@{guidance:g}"] = contestant(f"one@{guidance:g}", "one", guidance)
            contestants[layout] = contestant(layout, layout, guidance)
        if "twin" in specs:
            contestants["twin"] = contestant("twin", "twin", aa)
        times = alternate(contestants, rounds, warmup)
    finally:
        groups.close()

    def phase(name: str, key: str) -> list[float]:
        return [p[key] for p in phases[name]]

    twin = {}
    if "twin" in phases:  # one worker against its twin, on the same phase: how far noise alone moves the ratio
        ratio = median(phase(f"one@{aa:g}", "denoise_s")) / median(phase("twin", "denoise_s"))
        twin = {"aa_denoise_ratio": ratio, "aa_guidance": aa, "aa_spread": spread(phase(f"one@{aa:g}", "denoise_s"),
                                                                                  phase("twin", "denoise_s")),
                "aa_twin_denoise_s": summary(phase("twin", "denoise_s"))}
    for ids, tgt, layout, guidance in runs:
        base = f"one@{guidance:g}"
        denoise = median(phase(base, "denoise_s")) / median(phase(layout, "denoise_s"))
        cpu = {k: [median(c) for c in zip(*phase(k, "cpu_s_per_rank"), strict=True)] for k in (base, layout)}
        whole = median(times[base]) / median(times[layout])
        rows.append(row(
            *ids, ratio=denoise, tgt=tgt,
            ratio_of="one worker's denoising s ÷ the 2-rank layout's (the worker's phase: from the call to the last "
                     "step, text encoding excluded), ratio of medians; higher is faster",
            ours=summary(phase(layout, "denoise_s")), plain=summary(phase(base, "denoise_s")),
            notes=[f"whole video {whole:.3f} (one worker {median(times[base]):.2f} s, the layout "
                   f"{median(times[layout]):.2f} s; the VAE decodes on the first rank only); CPU seconds a video "
                   f"per rank: one worker {cpu[base]}, the layout {cpu[layout]}",
                   f"A/A: one worker's denoising ÷ its twin's {twin['aa_denoise_ratio']:.3f} at guidance {aa:g} "
                   f"(per-round quartiles {twin['aa_spread']['paired_ratio_quartiles']})" if twin else
                   "A/A: not run (--quick)"],
            details={"workload": _video_text(model, shape, f"guidance {guidance:g}"),
                     **spread(phase(base, "denoise_s"), phase(layout, "denoise_s")), "whole_video_ratio": whole,
                     "whole_video_s": {base: summary(times[base]), layout: summary(times[layout])},
                     "vae_s_median": {k: median(phase(k, "vae_s")) for k in (base, layout)},
                     "cpu_s_per_video_per_rank_median": cpu, **twin, "rounds": rounds, "warmup": warmup}))
    return rows

