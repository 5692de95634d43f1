"""ComfyUI-TPU benchmarks: this pack against a plain diffusers script, measured side by side in the same run.

    bash bench/run.sh [--quick] [--figures comfyui,handback,...] [--repeats N] [--soak N] [--out DIR]

Every figure is a ratio against the plain diffusers baseline measured in the same run (alternating rounds,
median of several, warm-up excluded), because shared machines are noisy. Prints a table and writes
bench/results/<device>-<date>.json with the environment (versions, device, cores, CPU model, load).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from backend.protocol import settings

from . import families26, figures, fp8_cache, handback, load_memory, mfu, quantized, speed, video
from .common import (
    ROOT,
    Ctx,
    device_slug,
    environment,
    failed,
    fmt_row_value,
    log,
    models_key,
    qty_text,
    target_text,
)

CACHE = Path(settings.CACHE.raw()).expanduser()


@dataclasses.dataclass(frozen=True)
class Figure:
    """One function that measures one or more rows; `rows` names them (id, title, target) so that a figure
    that fails or is not selected still has a row for each."""

    name: str
    run: Callable[[Ctx], list[dict]]
    rows: tuple[tuple[str, str, dict | None], ...]


# To add a figure: write `f(ctx) -> list of rows` (common.row / common.not_available; measure ours against the
# plain script with common.alternate) and list it here with the ids, titles and targets of its rows.
FIGURES: tuple[Figure, ...] = (
    Figure("comfyui", figures.comfyui, ((*figures.MEMORY, figures.MEMORY_TARGET),
                                        (*figures.COMFY, figures.THROUGHPUT_TARGET),
                                        (*figures.API, figures.THROUGHPUT_TARGET),
                                        (*figures.NOISE, None))),
    Figure("zimage", figures.zimage, ((*figures.ZIMAGE, figures.THROUGHPUT_TARGET),)),
    Figure("handback", handback.figure, ((handback.ID, handback.TITLE, handback.TARGET),)),
    Figure("cold_start", figures.cold_start, ((*figures.COLD, figures.COLD_TARGET),)),
    Figure("data_parallel", figures.data_parallel, ((*figures.DP, figures.DP_TARGET),)),
    Figure("compile", figures.compile_figures, ((*figures.COMPILE_COLD, None),
                                                (*figures.COMPILE_WARM, figures.WARM_TARGET),
                                                (*figures.COMPILE_RECOMPILES, figures.RECOMPILE_TARGET))),
    Figure("load_memory", load_memory.figure, ((load_memory.ID, load_memory.TITLE, load_memory.TARGET),)),
    Figure("mfu", mfu.figure, ((*mfu.EAGER, None), (*mfu.COMPILED, None))),
    Figure("lora", figures.lora_strength, ((*figures.LORA, figures.LORA_TARGET),)),
    Figure("controlnet", figures.controlnet, ((*figures.CONTROLNET, figures.THROUGHPUT_TARGET),
                                              (*figures.CONTROLNET_RECOMPILES, figures.RECOMPILE_TARGET))),
    Figure("cfg_parallel", speed.cfg_parallel, ((*speed.CFG, speed.CFG_TARGET),)),
    Figure("context_parallel", speed.context_parallel, ((*speed.CP, speed.CP_TARGET),)),
    Figure("prompt_cache", speed.prompt_cache, ((*speed.CACHE, speed.CACHE_TARGET),)),
    Figure("batched", speed.batched, ((*speed.BATCHED, None),)),
    Figure("warm_start", speed.warm_start, ((*speed.WARM, None),)),
    Figure("fp8_storage", fp8_cache.fp8_storage, ((*fp8_cache.FP8, fp8_cache.FP8_TARGET),
                                                  (*fp8_cache.FP8_HELD, fp8_cache.FP8_TARGET),
                                                  (*fp8_cache.FP8_SPEED, None))),
    Figure("quantized", quantized.figure, ((*quantized.HELD, quantized.HELD_TARGET), (*quantized.PEAK, None),
                                           (*quantized.BYTES, quantized.HELD_TARGET),
                                           (*quantized.HELD4, quantized.HELD_TARGET),
                                           (*quantized.BYTES4, quantized.HELD_TARGET), (*quantized.SPEED, None),
                                           (*quantized.SPEED4, None), (*quantized.AA, None))),
    Figure("video", video.video, ((*video.CP, video.CP_TARGET), (*video.CP_VIDEO, None), (*video.CFG, video.CFG_TARGET),
                                  (*video.CFG_VIDEO, None), (*video.PLAIN, video.PLAIN_TARGET))),
    Figure("qwen_krea", families26.images, tuple((*ids, tgt) for ids, tgt in families26.IMAGE_ROWS)),
    Figure("ltx_minimax", families26.videos, tuple((*ids, tgt) for ids, tgt in families26.VIDEO_ROWS)),
    Figure("step_cache", fp8_cache.step_cache, ((*fp8_cache.CACHE_FLUX, fp8_cache.CACHE_TARGET),
                                                (*fp8_cache.CACHE_QWEN, fp8_cache.CACHE_TARGET))),
)
SOAK = Figure("soak", figures.soak, ((*figures.SOAK, None),))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    names = [f.name for f in FIGURES] + ["soak"]
    p = argparse.ArgumentParser(prog="bench/run.sh", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="tiny model at 64x64, 2 steps, few repeats, compile with aot_eager: checks that every figure "
                        "runs (the smoke test); the numbers mean little")
    p.add_argument("--figures", default="",
                   help=f"comma-separated subset of {', '.join(names)} or row ids (default: all; soak only with --soak)")
    p.add_argument("--repeats", type=int, help="measured rounds of the warm figures (default 7; --quick 3)")
    p.add_argument("--warmup", type=int, help="discarded rounds before them (default 2; --quick 1)")
    p.add_argument("--cold-repeats", type=int, help="measured cold starts (default 3; --quick 1)")
    p.add_argument("--threads", type=int, default=int(settings.WORKER_THREADS.raw() or 1),
                   help="torch threads of every process, ours and the baseline's (default 1)")
    p.add_argument("--compile-prompts", type=int, help="varied prompts of the recompile figure (default 100; --quick 5)")
    p.add_argument("--compile-repeats", type=int, help="cold compiles of each side (default 2; --quick 1)")
    p.add_argument("--compile-backend", help="torch.compile backend (default auto = inductor / tpu; --quick aot_eager)")
    p.add_argument("--soak", type=int, default=0, metavar="N", help="also send N prompts through ComfyUI and "
                                                                   "report RSS growth of ComfyUI and the workers")
    p.add_argument("--peak-tflops", type=float, help="peak bf16 TFLOP/s of the GPU for MFU (default: from its name)")
    p.add_argument("--models", help="folder for the bench's random-weight models (default: a cache folder)")
    p.add_argument("--out", default=str(ROOT / "bench" / "results"), help="folder for the JSON results")
    p.add_argument("--keep-scratch", action="store_true",
                   help="keep the scratch folder (logs of ComfyUI and the plain script; kept anyway on failure)")
    return p.parse_args(argv)


def make_ctx(args: argparse.Namespace, kind: str, work: Path) -> Ctx:
    from backend.tiny_models import build_all
    from backend.worker.device import default_dtype_name

    models = Path(args.models) if args.models else CACHE / f"bench-models-{models_key()}"
    build_all(models, families=("flux", "zimage"), size="tiny")
    build_all(models, families=("flux", "zimage"), size="small")
    q = args.quick

    def pick(value, full, quick):
        return value if value is not None else (quick if q else full)

    return Ctx(
        quick=q, repeats=pick(args.repeats, 7, 3), warmup=pick(args.warmup, 2, 1), threads=args.threads, kind=kind,
        dtype=default_dtype_name(kind), models_dir=models, model="tiny-flux" if q else "small-flux",
        sizes=("tiny-flux", "small-flux"), width=64 if q else 256, height=64 if q else 256, steps=2 if q else 4,
        work=work, comfyui_dir=os.environ.get("COMFYUI_DIR"), cold_repeats=pick(args.cold_repeats, 3, 1),
        cold_warmup=0 if q else 1, dp_batch=4, soak=args.soak, compile_prompts=pick(args.compile_prompts, 100, 5),
        compile_repeats=pick(args.compile_repeats, 2, 1),
        compile_backend=pick(args.compile_backend, "auto", "aot_eager"), peak_tflops=args.peak_tflops)


def selected(figs: list[Figure], wanted: str) -> set[str]:
    if not wanted:
        return {f.name for f in figs if f.name != "soak"}
    names = set()
    for w in (x.strip() for x in wanted.split(",") if x.strip()):
        match = [f.name for f in figs if w == f.name or any(w == r[0] for r in f.rows)]
        if not match:
            sys.exit(f"--figures: unknown figure '{w}'; known: {', '.join(f.name for f in figs)}")
        names.update(match)
    return names


def run_figure(fig: Figure, ctx: Ctx) -> list[dict]:
    log(f"figure {fig.name} …")
    t0 = time.perf_counter()
    try:
        rows = fig.run(ctx)
    except Exception as e:
        tb = traceback.format_exc()
        log(f"figure {fig.name} FAILED:\n{tb}")
        return [{**failed(fid, title, f"{type(e).__name__}: {e}", tgt), "traceback": tb[-4000:]}
                for fid, title, tgt in fig.rows]
    got = {r["id"] for r in rows}
    rows += [failed(fid, title, "the figure returned no row for it", tgt) for fid, title, tgt in fig.rows
             if fid not in got]
    for r in rows:
        r["seconds"] = round(time.perf_counter() - t0, 1)
    log(f"figure {fig.name} done in {time.perf_counter() - t0:.0f} s")
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| Figure | Ours | Baseline (plain diffusers unless the figure says) | Ratio | Target | Result |",
             "|---|---|---|---|---|---|"]
    reasons = []
    for r in rows:
        if r["status"] != "ok":
            reasons.append(f"- {r['id']}: {r['status']}: {r.get('reason', '')}")
            lines.append(f"| {r['title']} | — | — | — | {target_text(r.get('target'))} | {r['status']} |")
            continue
        met = {True: "met", False: "NOT met", None: "—"}[r["target_met"]]
        lines.append(f"| {r['title']} | {qty_text(r['ours'])} | {qty_text(r['plain'])} | {fmt_row_value(r['ratio'])} "
                     f"| {target_text(r['target'])} | {met} |")
    notes = [f"- {r['id']}: {note}" for r in rows if r["status"] == "ok" for note in r.get("notes", [])]
    return "\n".join(lines + ([""] + reasons if reasons else []) + ([""] + notes if notes else []))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from backend.controller import devices

    info = devices.detect()
    work = Path(tempfile.mkdtemp(prefix="comfyui-tpu-bench-"))
    ctx = make_ctx(args, info.kind, work)
    if "soak" in args.figures.split(",") and not args.soak:
        sys.exit("--figures soak needs --soak N (the number of prompts)")
    figs = [*FIGURES, SOAK] if args.soak else list(FIGURES)
    wanted = selected(figs, args.figures)
    env = environment(ctx, info)
    log(f"device {info.kind} ({info.name}), {env['cpu']['usable_cores']} cores, {ctx.threads} torch thread(s) per "
        f"process, load {env['load_average_at_start']}; models in {ctx.models_dir}; scratch {work}")
    t0 = time.perf_counter()
    rows: list[dict] = []
    for fig in figs:
        if fig.name in wanted:
            rows += run_figure(fig, ctx)
        else:
            rows += [{"id": fid, "title": title, "status": "not run", "reason": "not selected with --figures",
                      "ratio": None, "target": tgt} for fid, title, tgt in fig.rows]
    env["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    result = {
        "suite": "ComfyUI-TPU bench (ratios against plain diffusers, same run)",
        "command": "bash bench/run.sh " + " ".join(sys.argv[1:] if argv is None else argv),
        "options": {k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(ctx).items()},
        "environment": env,
        "duration_s": round(time.perf_counter() - t0, 1),
        "figures": rows,
    }
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"{device_slug(info)}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=1, default=str) + "\n")
    os.replace(tmp, out)
    print(table(rows))
    print(f"\n{info.kind}, {env['cpu']['model']}, {env['cpu']['usable_cores']} cores, {ctx.threads} thread(s)/process, "
          f"load {env['load_average_at_start']} → {env['load_average_at_end']}, {result['duration_s']:.0f} s")
    print(f"results: {out}")
    bad = [r["id"] for r in rows if r["status"] == "failed"]
    if bad:
        log(f"failed figures: {', '.join(bad)}; logs kept in {work}")
    elif args.keep_scratch:
        log(f"scratch kept in {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if bad else 0
