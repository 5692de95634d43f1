"""The comfyui, zimage, cold_start, compile, data_parallel and lora figures and the soak: this pack against the plain
diffusers script, measured in the same run.

Each figure is one function `f(ctx) -> list of rows` (bench/common.py: `row`, `not_available`); bench/run.py
lists them. Ours runs through ComfyUI (bench/comfy.py) or through `backend.api`, the plain baseline through
bench/plain.py in its own process. Both use the same model, size, steps, dtype, seeds and torch threads.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from .comfy import PROMPT, Comfy
from .common import (
    Ctx,
    PlainServer,
    alternate,
    cpu_seconds,
    log,
    median,
    not_available,
    paired,
    plain_cold,
    qty,
    row,
    spread,
    summary,
    target,
    two_workers,
    with_env,
)

MB = 2**20


def seed_of(r: int) -> int:
    """Round r's seed (warm-up rounds are negative): the same for every contestant of a round, new each round
    so that ComfyUI's cache never skips the Sample node."""
    return 1000 + r


def request(ctx: Ctx, seed: int, **kw):
    from backend.protocol.spec import SampleRequest

    return SampleRequest(**{"prompt": PROMPT, "width": ctx.width, "height": ctx.height, "steps": ctx.steps,
                            "guidance": 0.0, "seed": seed, **kw})


def timed(fn, *args) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def _spec(ctx: Ctx, model: str | None = None):
    from backend.controller import api

    return api.make_spec(model or ctx.model, [str(ctx.models_dir)])


# ---- api against plain: the Z-Image and ControlNet rows

def against_plain(ctx: Ctx, model: str, api_call: Callable[[int, Callable | None], None],
                  plain_call: Callable[[PlainServer, int], dict],
                  plain_args: tuple[str, ...] = ()) -> tuple[dict[str, list[float]], dict]:
    """`api_call(round, on_progress)` (one image through `backend.api`; its first call loads, untimed) against
    `plain_call(server, round)` (the plain script's pipe()) and the same plain call in a second, identical process
    (the A/A control: how far from 1.0 noise alone moves a ratio in this run; not with --quick), in alternating
    rounds, a new seed each round. Besides the wall times, the details hold the CPU seconds per image of each side
    (ours: the controller and its workers; plain: its process), where ours spent its time (the worker's phases,
    median per phase) and the steps it ran."""
    from backend.controller import api
    from backend.protocol.messages import Step

    # the twin only where numbers count: --quick (the smoke test) checks that the figure runs
    names = ("plain",) if ctx.quick else ("plain", "twin")
    plains = {} if ctx.exclusive else {n: PlainServer(ctx, model, args=plain_args) for n in names}
    phases: list[dict] = []
    steps: list[int] = []
    cpu: dict[str, list[float]] = {"api": [], "plain": [], "twin": []}
    ours_pids: list[int] = []

    def run_api(r: int) -> float:
        ran = []
        cpu0 = cpu_seconds(ours_pids)
        t0 = time.perf_counter()
        api_call(r, lambda m: ran.append(m) if isinstance(m, Step) else None)
        took = time.perf_counter() - t0
        if r >= 0:
            cpu["api"].append(cpu_seconds(ours_pids) - cpu0)
            phases.append(api.last_latency() or {})
            steps.append(len(ran))
        return took

    def plain_run(name: str) -> Callable[[int], float]:
        def run(r: int) -> float:
            out = plain_call(plains[name], r)
            if r >= 0:
                cpu[name].append(out["cpu_s"])
            return out["call_s"]
        return run

    try:
        api_call(-100, None)  # loads (untimed)
        ours_pids[:] = [os.getpid(), *(w["pid"] for w in api.worker_info())]
        if ctx.exclusive:  # one holder of the chip at a time
            times = alternate({"api": run_api}, ctx.repeats, ctx.warmup, blocks=True)
            api.shutdown()
            plains["plain"] = PlainServer(ctx, model, args=plain_args)
            times.update(alternate({"plain": plain_run("plain")}, ctx.repeats, ctx.warmup, blocks=True))
        else:
            for plain in plains.values():
                plain.wait_ready()
            runs = {"plain": plain_run("plain"), "api": run_api}
            if "twin" in plains:
                runs["twin"] = plain_run("twin")
            times = alternate(runs, ctx.repeats, ctx.warmup)
    finally:
        api.shutdown()
        for plain in plains.values():
            plain.close()
    details = {"repeats": ctx.repeats, "warmup": ctx.warmup, "threads_per_process": ctx.threads,
               "rounds": "blocks (TPU: one process holds the chip)" if ctx.exclusive else
               "alternating rounds (plain, ours, plain's twin; order rotated)",
               **spread(times["plain"], times["api"]),
               "ours_phases_median_s": {k: median([p[k] for p in phases if k in p])
                                        for k in (phases[0] if phases else {})},
               "ours_steps_run": sorted(set(steps)),
               "cpu_s_per_image_median": {k: median(v) for k, v in cpu.items() if v},
               "cpu_ratio": median(cpu["plain"]) / median(cpu["api"])}
    if "twin" in times:
        details["noise_a_a"] = {"ratio_of_medians": median(times["plain"]) / median(times["twin"]),
                                "twin_s_per_image": summary(times["twin"], "s/image"),
                                **spread(times["plain"], times["twin"])}
    return times, details


def _noise_note(details: dict) -> list[str]:
    if "noise_a_a" not in details:
        return []
    aa = details["noise_a_a"]
    q1, q3 = details["paired_ratio_quartiles"]
    return [f"noise in this run: plain against its identical twin {aa['ratio_of_medians']:.3f} (per-round "
            f"{aa['paired_ratio_quartiles'][0]:.3f}–{aa['paired_ratio_quartiles'][1]:.3f}); ours' per-round ratios "
            f"{q1:.3f}–{q3:.3f} (quartiles); CPU seconds per image plain ÷ ours {details['cpu_ratio']:.3f}"]


ZIMAGE = ("zimage_throughput", "Z-Image Turbo: warm throughput through backend.api vs plain pipe() (guidance 0)")


def zimage(ctx: Ctx) -> list[dict]:
    """`api.sample` against the plain script's `pipe()` with a Z-Image pipeline at guidance 0 (Turbo: one
    transformer pass per step), one image per call (bench/figures.py `against_plain`)."""
    from backend.controller import api

    model = "tiny-zimage" if ctx.quick else "small-zimage"
    spec = _spec(ctx, model)

    def api_call(r: int, progress) -> None:
        api.sample(spec, request(ctx, seed_of(r)), progress)

    times, details = against_plain(ctx, model, api_call, lambda plain, r: plain.call(seed_of(r)))
    return [row(*ZIMAGE, ratio=median(times["plain"]) / median(times["api"]),
                ratio_of="plain pipe() s/image ÷ api.sample s/image (ratio of medians); ≥ 1 is as fast as plain",
                ours=summary(times["api"], "s/image"), plain=summary(times["plain"], "s/image"),
                tgt=THROUGHPUT_TARGET, notes=_noise_note(details),
                details={"workload": f"{model} {ctx.width}x{ctx.height}, {ctx.steps} steps, guidance 0", **details})]


# ---- comfyui: memory and throughput through ComfyUI (and through the backend API alone)

MEMORY = ("controller_memory", "Controller memory: ComfyUI process RSS growth with a model loaded in the workers")
COMFY = ("comfyui_throughput", "Warm throughput through ComfyUI (queue → done) vs plain pipe() + PNG")
API = ("api_throughput", "Warm throughput through backend.api (no ComfyUI) vs plain pipe()")
NOISE = ("noise_floor", "A/A control: plain pipe() in a second, identical process vs the first (noise only)")
MEMORY_TARGET = target("<=", 150, on="ours", unit="MB")
THROUGHPUT_TARGET = target(">=", 0.98)


def comfyui(ctx: Ctx) -> list[dict]:
    """The ComfyUI process's memory, and throughput through ComfyUI and backend.api against plain diffusers (with
    the plain script against a second copy of itself: the noise floor)."""
    from backend.controller import api

    if not ctx.comfyui_dir:
        why = "COMFYUI_DIR is not set: run the bench through bench/run.sh (it builds/finds ComfyUI)"
        return [not_available(*MEMORY, why, MEMORY_TARGET), not_available(*COMFY, why, THROUGHPUT_TARGET),
                not_available(*API, why, THROUGHPUT_TARGET), not_available(*NOISE, why)]
    # Start-ups are not measured, so they overlap when the device allows: the plain server and the backend.api
    # workers start while ComfyUI starts. All are up before anything is timed.
    spec = _spec(ctx)
    pool = ThreadPoolExecutor(max_workers=1)
    comfy = Comfy(ctx, "main")
    plains = {} if ctx.exclusive else {"plain": PlainServer(ctx, ctx.model), "twin": PlainServer(ctx, ctx.model)}
    api_up = None if ctx.exclusive else pool.submit(api.load, spec)
    t0 = time.perf_counter()
    try:
        comfy.start()
        log(f"comfyui: server up in {time.perf_counter() - t0:.1f} s")
        time.sleep(1.0)
        rss0 = comfy.rss()
        mem = _first_prompts_memory(ctx, comfy, rss0)
        log(f"comfyui: memory measured at {time.perf_counter() - t0:.1f} s: {mem}")
        times, plain_calls, plain_rss = _throughput_rounds(ctx, spec, comfy, plains, api_up, t0)
        after_rss = (comfy.rss() - rss0) / MB
        log(f"comfyui: rounds done at {time.perf_counter() - t0:.1f} s")
    finally:  # everything stops at once
        pool.shutdown(wait=True)
        with ThreadPoolExecutor(max_workers=3) as stopper:
            stops = [stopper.submit(comfy.stop), stopper.submit(api.shutdown)]
            stops += [stopper.submit(p.close) for p in plains.values()]
            for fut in stops:
                fut.result()
    return [_memory_row(ctx, mem, plain_rss, after_rss), *_throughput_rows(ctx, times, plain_calls)]


def _first_prompts_memory(ctx: Ctx, comfy: Comfy, rss0: int) -> dict[str, dict]:
    """The ComfyUI process's RSS growth from idle after the first prompt (starts the workers, loads, one image),
    then after switching to the second model; the workers' RSS beside it."""
    mem: dict[str, dict] = {}
    for i, model in enumerate(ctx.sizes):  # the first prompt starts the workers and loads; then a model switch
        first = comfy.run(comfy.prompt(model, seed_of(-100 - i), ctx.width, ctx.height, ctx.steps))
        time.sleep(0.5)
        mem[model] = {"controller_growth_mb": (comfy.rss() - rss0) / MB, "workers_rss_mb": comfy.worker_rss() / MB,
                      "first_prompt_s": first}
    return mem


def _throughput_rounds(ctx: Ctx, spec, comfy: Comfy, plains: dict[str, PlainServer], api_up,
                       t0: float) -> tuple[dict[str, list[float]], list[float], dict[str, int]]:
    """ComfyUI, backend.api and plain pipe() (and its twin), in alternating rounds; on a device with one holder
    (TPU) in blocks, each holder released before the next (the plain server is then started here, into
    `plains`). Returns the times per runner, the plain pipe() calls alone, and the plain script's RSS."""
    from backend.controller import api

    png_dir = ctx.work / "plain-png"
    png_dir.mkdir(exist_ok=True)
    plain_calls: list[float] = []
    plain_rss: dict[str, int] = {}

    def run_plain(r: int) -> float:
        plain = plains["plain"]
        out = plain.call(seed_of(r), png_dir=str(png_dir))
        if not plain_rss:  # after load + first image, like ours (outside the timed call)
            plain_rss.update(torch=plain.wait_ready()["rss_torch"], first=plain.ask("rss")["rss"])
        if r >= 0:
            plain_calls.append(out["call_s"])
        return out["call_s"] + out["save_s"]

    def run_twin(r: int) -> float:
        return plains["twin"].call(seed_of(r))["call_s"]

    def run_comfy(r: int) -> float:
        return comfy.run(comfy.prompt(ctx.model, seed_of(r), ctx.width, ctx.height, ctx.steps))

    def run_api(r: int) -> float:
        return timed(api.sample, spec, request(ctx, seed_of(r)))

    if ctx.exclusive:  # one holder of the chip at a time: blocks, each holder released before the next
        times = alternate({"comfyui": run_comfy}, ctx.repeats, ctx.warmup, blocks=True)
        comfy.run({"1": {"class_type": "TPUFreeWorkers", "inputs": {}}})
        api.load(spec)
        times.update(alternate({"api": run_api}, ctx.repeats, ctx.warmup, blocks=True))
        api.shutdown()
        plains["plain"] = PlainServer(ctx, ctx.model)
        times.update(alternate({"plain": run_plain}, ctx.repeats, ctx.warmup, blocks=True))
        return times, plain_calls, plain_rss
    api_up.result()
    for plain in plains.values():
        plain.wait_ready()
    log(f"comfyui: all up at {time.perf_counter() - t0:.1f} s")
    times = alternate({"plain": run_plain, "comfyui": run_comfy, "twin": run_twin, "api": run_api},
                      ctx.repeats, ctx.warmup)
    return times, plain_calls, plain_rss


def _memory_row(ctx: Ctx, mem: dict[str, dict], plain_rss: dict[str, int], after_rss: float) -> dict:
    plain_growth = (plain_rss["first"] - plain_rss["torch"]) / MB
    sizes = ", ".join(f"{m}: +{v['controller_growth_mb']:.0f} MB (workers {v['workers_rss_mb']:.0f} MB)"
                      for m, v in mem.items())
    return row(
        *MEMORY, ratio=max(v["controller_growth_mb"] for v in mem.values()) / plain_growth,
        ratio_of=f"ComfyUI process RSS growth (the larger of the two models) ÷ RSS growth of the plain script after "
                 f"`import torch` when it loads {ctx.model} and makes one image in its own process; lower is better",
        ours=qty(max(v["controller_growth_mb"] for v in mem.values()), "MB"),
        plain=qty(plain_growth, "MB", model=ctx.model, rss_mb=plain_rss["first"] / MB), tgt=MEMORY_TARGET,
        details={"per_model": mem, "controller_growth_after_throughput_runs_mb": after_rss,
                 "measured": "psutil RSS of the ComfyUI server process: idle after start, then after the first prompt "
                             f"with {ctx.sizes[0]} (starts the workers, loads, one image), then after switching to "
                             f"{ctx.sizes[1]} (reload in the same workers, one image); growth from idle. It includes "
                             "ComfyUI's own first-prompt costs (imports, caches, Save Image). The workers' RSS is "
                             "shown for contrast: the model lives there."},
        notes=[f"per model (cumulative, same server): {sizes}"])


def _throughput_rows(ctx: Ctx, times: dict[str, list[float]], plain_calls: list[float]) -> list[dict]:
    """ComfyUI's and backend.api's throughput against plain, and the noise floor (plain against its twin)."""
    plain_total, plain_call = median(times["plain"]), median(plain_calls)
    rounds = "blocks (TPU: one process holds the chip)" if ctx.exclusive else "alternating rounds"
    comfy_row = row(
        *COMFY, ratio=plain_total / median(times["comfyui"]),
        ratio_of="plain (pipe() + 8-bit PNG) s/image ÷ ComfyUI s/image; ≥ 1 is as fast as plain",
        ours=summary(times["comfyui"], "s/image"), plain=summary(times["plain"], "s/image"), tgt=THROUGHPUT_TARGET,
        details={"workload": ctx.shape_text(), "rounds": rounds, "repeats": ctx.repeats, "warmup": ctx.warmup,
                 "graph": "Load TPU Pipeline → Sample (TPU) → Save Image; seed changes every prompt",
                 "measured": "POST /prompt → websocket 'executing: None' for that prompt (one websocket kept open)",
                 "plain_call_only_s": plain_call,
                 "paired_ratio_median": paired(times["plain"], times["comfyui"])})
    api_row = row(
        *API, ratio=plain_call / median(times["api"]),
        ratio_of="plain pipe() s/image ÷ backend.api.sample s/image (float32 images back in the caller); ≥ 1 is "
                 "as fast as plain",
        ours=summary(times["api"], "s/image"), plain=summary(plain_calls, "s/image"), tgt=THROUGHPUT_TARGET,
        details={"workload": ctx.shape_text(), "rounds": rounds, "repeats": ctx.repeats, "warmup": ctx.warmup,
                 "paired_ratio_median": paired(plain_calls, times["api"])})
    if ctx.exclusive:
        noise = not_available(*NOISE, "needs two plain processes on the device at once (a TPU chip has one holder)")
    else:
        noise = row(*NOISE, ratio=plain_call / median(times["twin"]),
                    ratio_of="first plain process s/image ÷ second plain process s/image (same code, same seeds): how "
                             "far from 1.0 noise alone moves a ratio in this run",
                    ours=summary(times["twin"], "s/image"), plain=summary(plain_calls, "s/image"),
                    details={"paired_ratio_median": paired(plain_calls, times["twin"]), "repeats": ctx.repeats})
    return [comfy_row, api_row, noise]


# ---- cold_start

COLD = ("cold_start", "Cold start: group start + load + first image vs plain process start + import + load + image")
COLD_TARGET = target("<=", 1.3)


def cold_start(ctx: Ctx) -> list[dict]:
    from backend.controller import api

    spec = _spec(ctx)
    req = request(ctx, 0)
    parts: list[dict] = []

    def ours(_r: int) -> float:
        api.shutdown()
        try:
            return timed(api.sample, spec, req)
        finally:
            api.shutdown()

    def plain(r: int) -> float:
        out = plain_cold(ctx, ctx.model)
        if r >= 0:
            parts.append(out)
        return out["wall_s"]

    try:
        times = alternate({"ours": ours, "plain": plain}, ctx.cold_repeats, ctx.cold_warmup)
    finally:
        api.shutdown()
    breakdown = {k: median([p[k] for p in parts]) for k in ("import_s", "load_s", "call_s")}
    return [row(*COLD, ratio=median(times["ours"]) / median(times["plain"]),
                ratio_of="ours s ÷ plain s; lower is better",
                ours=summary(times["ours"], "s"), plain=summary(times["plain"], "s"), tgt=COLD_TARGET,
                details={"workload": ctx.shape_text(), "repeats": ctx.cold_repeats, "warmup": ctx.cold_warmup,
                         "ours_measured": "backend.api.sample with no worker group running, in a process that "
                                          "already imported backend (as ComfyUI has): torchrun + worker start, "
                                          "import, load, one image back",
                         "plain_measured": "spawn → the line the script prints after its first image",
                         "plain_breakdown_s": breakdown,
                         "paired_ratio_median": paired(times["ours"], times["plain"])})]


# ---- compile

COMPILE_COLD = ("compile_cold", "Compile: cold compile time of the denoiser (fresh persistent cache)")
COMPILE_WARM = ("compile_warm_restart", "Compile: warm restart from the persistent cache ÷ cold compile")
COMPILE_RECOMPILES = ("compile_recompiles", "Compile: recompiles over varied prompts at the warmed shape")
WARM_TARGET = target("<=", 0.2)
RECOMPILE_TARGET = target("==", 0, on="ours", unit="recompiles")

_WORDS = ("a red fox in the snow, a small house by the river at night, an old astronaut riding a horse on the moon, "
          "close up portrait of a young woman with blue flowers, detailed painting of a city street in the rain, "
          "high quality photo of a black cat sitting on a yellow car").replace(",", "").split()


def varied_prompts(n: int) -> list[str]:
    """n different prompts of different lengths (the shape the denoiser sees must not follow them)."""
    return [" ".join(_WORDS[(7 * i) % len(_WORDS):][: 2 + (i * 5) % 30] or _WORDS[:3]) + f" {i}" for i in range(n)]


def compile_figures(ctx: Ctx) -> list[dict]:
    import subprocess
    import sys

    from backend.controller import api
    from backend.controller.compile_plan import compile_backend
    from backend.protocol import settings
    from backend.protocol.spec import CompilePlan

    backend = compile_backend(ctx.kind, ctx.compile_backend)
    eager = _spec(ctx)
    compiled = eager.with_changes(mode="compiled", compile=CompilePlan(backend=backend))
    warm_n = max(2, min(ctx.repeats, 5))
    prompts = varied_prompts(ctx.compile_prompts)
    runs: dict[str, list[dict]] = {"ours": [], "plain": []}
    plain_box: list[PlainServer] = []  # the last plain server stays up for the recompile count

    def stats() -> dict:
        return api.worker_info()[0]["compile"]

    def plain_server(r: int) -> PlainServer:
        env = {"TORCHINDUCTOR_CACHE_DIR": str(ctx.work / f"plain-inductor-{r}"), "TORCHINDUCTOR_FX_GRAPH_CACHE": "1"}
        return PlainServer(ctx, ctx.model, extra_env=env)

    # Round 0's plain script starts while our first worker starts (not measured; both are up before timing).
    early: dict[int, PlainServer] = {} if ctx.exclusive else {0: plain_server(0)}

    def ours_compile(cache: Path) -> dict:
        """A fresh worker with `cache` as its persistent compile cache: first compiled call, then warm calls."""
        with with_env({settings.COMPILE_CACHE.name: str(cache)}):
            api.shutdown()
            api.load(eager)  # group start + load: not part of the compile time
        for waiting in early.values():
            waiting.wait_ready()  # idle from here on
        first = timed(api.sample, compiled, request(ctx, 0))
        warm = [timed(api.sample, compiled, request(ctx, i + 1)) for i in range(warm_n)]
        return {"compile_s": first - median(warm), "first_s": first, "warm_s": median(warm), "stats": stats()}

    def ours_cold(r: int) -> float:
        out = ours_compile(ctx.work / f"compile-cache-{r}")
        api.shutdown()
        runs["ours"].append(out)
        return out["compile_s"]

    def plain_cold(r: int) -> float:
        for old in plain_box:
            old.close()
        plain_box.clear()
        plain = early.pop(r, None) or plain_server(r)
        plain_box.append(plain)
        plain.wait_ready()
        plain.ask("compile", backend=backend)
        first = plain.call(0)["call_s"]
        warm = median([plain.call(i + 1)["call_s"] for i in range(warm_n)])
        runs["plain"].append({"compile_s": first - warm, "first_s": first, "warm_s": warm})
        return first - warm

    try:
        if backend == "inductor":  # its modules come from disk the first time: read them once, for fairness
            subprocess.run([sys.executable, "-c", "import torch._inductor.compile_fx, torch._dynamo"], check=True)
        times = alternate({"ours": ours_cold, "plain": plain_cold}, ctx.compile_repeats, 0,
                          blocks=ctx.exclusive)
        if ctx.exclusive:  # the chip goes to the restarted worker
            for old in plain_box:
                old.close()
            plain_box.clear()
        last = len(runs["ours"]) - 1
        restart = ours_compile(ctx.work / f"compile-cache-{last}")  # a new worker, the last cold run's cache
        before = stats()
        for i, text in enumerate(prompts):
            api.sample(compiled, request(ctx, 5000 + i, prompt=text))
        after = stats()
        api.shutdown()
        if not plain_box:
            plain_cold(ctx.compile_repeats)
        p_graphs = _plain_graphs(plain_box[0], prompts)
    finally:
        api.shutdown()
        for old in [*plain_box, *early.values()]:
            old.close()
    return _compile_rows(ctx, backend, times, runs, restart, (before, after), prompts, p_graphs)


def _plain_graphs(plain: PlainServer, prompts: list[str]) -> int:
    """New dynamo graphs the plain script makes over the varied prompts (its recompiles)."""
    g0 = plain.ask("graphs")["graphs"]
    for i, text in enumerate(prompts):
        plain.call(5000 + i, prompt=text)
    return plain.ask("graphs")["graphs"] - g0


def _compile_rows(ctx: Ctx, backend: str, times: dict[str, list[float]], runs: dict[str, list[dict]],
                  restart: dict, counters: tuple[dict, dict], prompts: list[str], p_graphs: int) -> list[dict]:
    """The cold compile, warm restart and recompile rows from what compile_figures measured."""
    before, after = counters
    cold, plain_cold_s = median(times["ours"]), median(times["plain"])
    ours_last = runs["ours"][-1]
    recompiles = after["unexpected_recompiles"] - before["unexpected_recompiles"]
    graphs = after["graphs"] - before["graphs"]
    note = [] if backend in ("inductor", "tpu") else [
        f"backend '{backend}' (--quick): no code is generated, so the persistent cache has nothing to keep and the "
        "warm restart is not expected to be faster; a full run uses the device's real backend"]
    workload = f"{ctx.shape_text()}, backend {backend}, whole denoiser"
    measured = "first compiled call − median of the next warm calls, in a fresh process with a fresh cache folder"
    return [
        row(*COMPILE_COLD, ratio=cold / plain_cold_s,
            ratio_of="ours ÷ plain torch.compile of pipe.transformer (same options: fullgraph, static shapes); "
                     "lower is better",
            ours=summary(times["ours"], "s"), plain=summary(times["plain"], "s"),
            details={"workload": workload, "measured": measured, "rounds": ctx.compile_repeats,
                     "ours_runs": [{k: v for k, v in o.items() if k != "stats"} for o in runs["ours"]],
                     "ours_compile_s_reported": [o["stats"]["compile_s"] for o in runs["ours"]],
                     "plain_runs": runs["plain"]}, notes=note),
        row(*COMPILE_WARM, ratio=restart["compile_s"] / ours_last["compile_s"],
            ratio_of="warm restart ÷ cold compile of the same cache folder (each: first compiled call − warm call, "
                     "in a fresh worker process); the worker's own count (compile_s) is in details",
            ours=qty(restart["compile_s"], "s", first_call_s=restart["first_s"],
                     compile_s_reported=restart["stats"]["compile_s"], disk_hits=restart["stats"].get("disk_hits")),
            plain=qty(ours_last["compile_s"], "s", what="ours, cold"), tgt=WARM_TARGET,
            details={"workload": workload,
                     "reported_ratio": (restart["stats"]["compile_s"] / ours_last["stats"]["compile_s"]
                                        if ours_last["stats"]["compile_s"] else None)}, notes=note),
        row(*COMPILE_RECOMPILES, ratio=recompiles / len(prompts),
            ratio_of="ours recompiles ÷ prompts (the plain script's new dynamo graphs are in `plain`)",
            ours=qty(recompiles, "recompiles", graphs=graphs, prompts=len(prompts)),
            plain=qty(p_graphs, "graphs", prompts=len(prompts)), tgt=RECOMPILE_TARGET,
            details={"workload": workload, "prompts": len(prompts),
                     "measured": "the worker's unexpected_recompiles / graphs counters before and after; prompts "
                                 "differ in words, length and seed"}),
    ]


# ---- data_parallel

DP = ("data_parallel", "Data parallel: 2 replicas' throughput ÷ 2 × one replica's")
DP_TARGET = target(">=", 0.9)


def data_parallel(ctx: Ctx) -> list[dict]:
    why = two_workers(ctx)
    if why:
        return [not_available(*DP, why, DP_TARGET)]
    from backend.controller import api, group

    one = _spec(ctx)
    two = one.with_changes(dp_replicas=2)
    batch = ctx.dp_batch
    groups: dict[str, group.WorkerGroup] = {}

    def start(name: str, spec) -> group.WorkerGroup:
        g = group.WorkerGroup(api.group_config(api.checked(spec)))  # checks the layout like api.sample does
        g.start()
        groups[name] = g
        return g

    def sample(name: str, spec, r: int) -> float:
        req = request(ctx, seed_of(r), batch_size=batch)
        api.check_request(spec, req)
        t0 = time.perf_counter()
        results = groups[name].sample(spec, req)
        parts = [r.arrays["images"] for r in results if "images" in r.arrays]
        images = np.concatenate(parts)
        dt = time.perf_counter() - t0
        assert images.shape[0] == batch, images.shape
        return dt

    contestants = {"one": lambda r: sample("one", one, r), "two": lambda r: sample("two", two, r)}
    try:
        if ctx.exclusive:
            times = {}
            for name, spec in (("one", one), ("two", two)):
                start(name, spec)
                times.update(alternate({name: contestants[name]}, ctx.repeats, ctx.warmup, blocks=True))
                groups.pop(name).close()
        else:  # both start at once (not measured), then alternate
            with ThreadPoolExecutor(max_workers=2) as pool:
                for fut in [pool.submit(start, "one", one), pool.submit(start, "two", two)]:
                    fut.result()
            times = alternate(contestants, ctx.repeats, ctx.warmup)
    finally:
        for g in groups.values():
            g.close()
    t1, t2 = median(times["one"]), median(times["two"])
    return [row(*DP, ratio=t1 / (2 * t2),
                ratio_of=f"(images/s with 2 replicas) ÷ (2 × images/s with 1), batch of {batch}; 1.0 is perfect "
                         "scaling",
                ours=summary(times["two"], "s"), plain=summary(times["one"], "s"), tgt=DP_TARGET,
                details={"workload": f"{ctx.shape_text()}, batch {batch}", "threads_per_worker": ctx.threads,
                         "ours_is": "2 replicas (one worker each)", "plain_is": "1 replica (one worker)",
                         "rounds": "blocks" if ctx.exclusive else "alternating rounds", "repeats": ctx.repeats,
                         "paired_ratio_median": paired(times["one"], times["two"]) / 2})]


# ---- LoRA: what a strength change costs

LORA = ("lora_strength_change", "LoRA: a Sample that changes a LoRA's strength ÷ one that does not")
LORA_TARGET = target("<=", 1.1)
LORA_RANK = 16


def _random_lora(ctx: Ctx) -> tuple[Path, int]:
    """A diffusers-format LoRA (rank 16) on every linear layer of the bench model's transformer; and how many."""
    import json

    import diffusers
    import torch
    from safetensors.torch import save_file

    config = json.loads((Path(ctx.model_path()) / "transformer" / "config.json").read_text())
    with torch.device("meta"):
        model = getattr(diffusers, config["_class_name"]).from_config(config)
    g = torch.Generator().manual_seed(0)
    tensors = {}
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear):
            tensors[f"transformer.{name}.lora_A.weight"] = torch.randn(LORA_RANK, m.in_features, generator=g) * 0.01
            tensors[f"transformer.{name}.lora_B.weight"] = torch.randn(m.out_features, LORA_RANK, generator=g) * 0.01
    path = ctx.work / "bench-lora.safetensors"
    save_file(tensors, str(path))
    return path, len(tensors) // 2


def lora_strength(ctx: Ctx) -> list[dict]:
    """A Sample whose LoRA strength differs from the last one (the worker rewrites every touched weight from
    its saved original) against a Sample at the strength already applied (a plain prompt), alternating."""
    from backend.controller import api

    spec = _spec(ctx)
    path, layers = _random_lora(ctx)
    strengths = {"now": 0.8}

    def at(strength: float, r: int) -> float:
        return timed(api.sample, api.with_lora(spec, str(path), strength)[0], request(ctx, seed_of(r)))

    def plain(r: int) -> float:
        return at(strengths["now"], r)

    applies: list[float] = []

    def change(r: int) -> float:
        strengths["now"] = 0.5 if strengths["now"] == 0.8 else 0.8
        seconds = at(strengths["now"], r)
        if r >= 0:
            applies.append(api.worker_info()[0]["lora_apply_s"])
        return seconds

    try:
        at(0.8, -100)  # start, load, resolve the LoRA: not measured
        info = api.worker_info()[0]
        times = alternate({"plain": plain, "change": change}, ctx.repeats, ctx.warmup, blocks=ctx.exclusive)
        loads = api.worker_info()[0]["loads"] - info["loads"]
        compiles = api.worker_info()[0]["compile"]["compiles"]
    finally:
        api.shutdown()
    return [row(*LORA, ratio=median(times["change"]) / median(times["plain"]),
                ratio_of="s/image of a Sample that changes the LoRA strength ÷ s/image of a Sample at the strength "
                         "already applied (same LoRA, new seed each round); 1.0 means a strength change is free",
                ours=summary(times["change"], "s/image"), plain=summary(times["plain"], "s/image"), tgt=LORA_TARGET,
                details={"workload": ctx.shape_text(), "lora": f"rank {LORA_RANK} on all {layers} linear layers of "
                                                                  "the transformer (diffusers format)",
                         "worker_rewrite_s": summary(applies, "s"),
                         "worker_rewrite_over_plain_sample": median(applies) / median(times["plain"]),
                         "measured": "backend.api.sample end to end; worker_rewrite_s is the worker's own time for "
                                     "restoring and rewriting the touched weights (no noise from the rest)",
                         "reloads_during_rounds": loads, "compiles": compiles, "repeats": ctx.repeats,
                         "warmup": ctx.warmup, "change_minus_plain_s": median(times["change"]) - median(times["plain"]),
                         "paired_ratio_median": paired(times["plain"], times["change"])})]


# ---- controlnet: a ControlNet prompt against plain diffusers' ControlNet pipeline; strength changes, compiled

CONTROLNET = ("controlnet_throughput", "ControlNet (FLUX.1 union, canny): warm throughput through backend.api vs "
                                      "plain FluxControlNetPipeline")
CONTROLNET_RECOMPILES = ("controlnet_recompiles", "ControlNet: recompiles over strength, start, end and image changes "
                                                  "(compiled mode)")


def controlnet(ctx: Ctx) -> list[dict]:
    """`api.sample` with a union ControlNet (random weights, built for the bench's model) against the plain script's
    FluxControlNetPipeline made with from_pipe, the same control image (drawn from the round's seed), strength and
    mode (bench/figures.py `against_plain`; ours' time includes Apply ControlNet's `with_controlnet`, as a prompt
    whose control image changed runs it); then, compiled, Samples that each change strength, start, end or the
    image, counting the worker's recompiles."""
    from backend.controller import api
    from backend.tiny_models import build_tiny_controlnet

    folder = build_tiny_controlnet("flux-union", ctx.model_path(ctx.model), ctx.work / f"controlnet-{ctx.model}")
    spec = _spec(ctx)

    def image(seed: int) -> np.ndarray:
        return np.random.default_rng(seed).random((1, ctx.height, ctx.width, 3), dtype=np.float32)

    def api_call(r: int, progress) -> None:
        controlled, _ = api.with_controlnet(spec, str(folder), image(seed_of(r)), 0.7, union_mode="canny")
        api.sample(controlled, request(ctx, seed_of(r)), progress)

    def plain_call(plain: PlainServer, r: int) -> dict:
        return plain.call(seed_of(r), control={"seed": seed_of(r), "strength": 0.7, "mode": 0})

    times, details = against_plain(ctx, ctx.model, api_call, plain_call, ("--controlnet", str(folder)))
    changes = [(0.3, 0.0, 1.0, 1), (0.7, 0.2, 1.0, 1), (0.7, 0.0, 0.6, 1), (0.7, 0.0, 1.0, 2), (1.2, 0.1, 0.9, 3)]
    changes = changes[:2] if ctx.quick else changes
    try:
        compiled, _ = api.with_compile(spec, "whole denoiser", "eager", "", False)
        api.sample(api.with_controlnet(compiled, str(folder), image(0), 0.7, union_mode="canny")[0], request(ctx, 0))
        before = api.compile_stats()
        for strength, start, end, seed in changes:
            api.sample(api.with_controlnet(compiled, str(folder), image(seed), strength, start, end, "canny")[0],
                       request(ctx, seed))
        after = api.compile_stats()
    finally:
        api.shutdown()
    recompiles = after["unexpected_recompiles"] - before["unexpected_recompiles"]
    graphs = after["graphs"] - before["graphs"]
    workload = f"{ctx.model} {ctx.width}x{ctx.height}, {ctx.steps} steps, one FLUX.1 union ControlNet (canny, 0.7)"
    return [row(*CONTROLNET, ratio=median(times["plain"]) / median(times["api"]),
                ratio_of="plain FluxControlNetPipeline s/image ÷ api.sample s/image (ratio of medians); ≥ 1 is as fast "
                         "as plain",
                ours=summary(times["api"], "s/image"), plain=summary(times["plain"], "s/image"),
                tgt=THROUGHPUT_TARGET, notes=_noise_note(details),
                details={"workload": workload, "controlnet": "random weights, 1 double and 1 single block, 7 modes",
                         **details}),
            row(*CONTROLNET_RECOMPILES, ratio=recompiles / len(changes),
                ratio_of="recompiles ÷ Samples that change strength, start, end or the control image",
                ours=qty(recompiles, "recompiles", graphs=graphs, samples=len(changes)), tgt=RECOMPILE_TARGET,
                details={"workload": workload, "backend": "eager (dynamo traces, no code generation)",
                         "measured": "the worker's unexpected_recompiles / graphs counters before and after"})]


# ---- soak (only with --soak N)

SOAK = ("soak", "Soak: N prompts through ComfyUI, RSS growth of ComfyUI and the workers")


def soak(ctx: Ctx) -> list[dict]:
    if not ctx.comfyui_dir:
        return [not_available(*SOAK, "COMFYUI_DIR is not set: run the bench through bench/run.sh")]
    comfy = Comfy(ctx, "soak")
    samples: list[dict] = []
    every = max(1, ctx.soak // 20)
    warm = min(5, ctx.soak)
    try:
        comfy.start()
        t0 = time.perf_counter()
        for i in range(ctx.soak):
            comfy.run(comfy.prompt(ctx.model, seed_of(i), ctx.width, ctx.height, ctx.steps, text=f"{PROMPT} {i}"))
            if i + 1 == warm or (i + 1) % every == 0 or i + 1 == ctx.soak:
                samples.append({"prompt": i + 1, "controller_mb": comfy.rss() / MB,
                                "workers_mb": comfy.worker_rss() / MB, "t_s": time.perf_counter() - t0})
    finally:
        comfy.stop()
    base = next(s for s in samples if s["prompt"] >= warm)
    end = samples[-1]
    return [row(*SOAK, ratio=end["controller_mb"] / base["controller_mb"],
                ratio_of=f"ComfyUI RSS after {ctx.soak} prompts ÷ after {warm} (warm); 1.0 is no growth",
                ours=qty(end["controller_mb"] - base["controller_mb"], "MB"),
                plain=None, details={"workers_growth_mb": end["workers_mb"] - base["workers_mb"],
                                     "samples": samples, "workload": ctx.shape_text()})]
