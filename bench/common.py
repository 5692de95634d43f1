"""Shared pieces of the bench: run context, result rows, statistics, environment, the plain baseline's driver."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PLAIN = Path(__file__).resolve().parent / "plain.py"


def log(text: str) -> None:
    print(f"[bench] {text}", file=sys.stderr, flush=True)


# ---- the run


@dataclasses.dataclass
class Ctx:
    """What every figure gets: options, device, models, where to write."""

    quick: bool
    repeats: int
    warmup: int
    threads: int
    kind: str  # "cpu" | "cuda" | "tpu"
    dtype: str  # what "auto" means on this device (the plain baseline is given the same)
    models_dir: Path
    model: str  # the model the throughput-like figures use ("small-flux", "tiny-flux" with --quick)
    sizes: tuple[str, str]  # the two models of the memory figure
    width: int
    height: int
    steps: int
    work: Path  # scratch folder of this run
    comfyui_dir: str | None
    cold_repeats: int = 3
    cold_warmup: int = 1
    dp_batch: int = 4
    soak: int = 0
    compile_prompts: int = 100
    compile_repeats: int = 2
    compile_backend: str = "auto"
    peak_tflops: float | None = None

    @property
    def exclusive(self) -> bool:
        """A TPU chip is held by one process at a time: contestants cannot alternate while both are up."""
        return self.kind == "tpu"

    def model_path(self, name: str | None = None) -> str:
        return str(self.models_dir / (name or self.model))

    def shape_text(self) -> str:
        return f"{self.model} {self.width}x{self.height}, {self.steps} steps"


# ---- result rows

_OPS: dict[str, Callable[[float, float], bool]] = {">=": lambda a, b: a >= b, "<=": lambda a, b: a <= b,
                                                   "==": lambda a, b: a == b}
_SYMBOL = {">=": "≥", "<=": "≤", "==": "="}


def target(op: str, value: float, on: str = "ratio", unit: str = "") -> dict:
    return {"on": on, "op": op, "value": value, "unit": unit}


def qty(value: float | None, unit: str, **extra) -> dict:
    return {"value": value, "unit": unit, **extra}


def row(fid: str, title: str, *, ratio: float | None, ratio_of: str, ours: dict | None = None,
        plain: dict | None = None, tgt: dict | None = None, details: dict | None = None,
        notes: list[str] | None = None) -> dict:
    met = None
    if tgt is not None:
        x = ratio if tgt["on"] == "ratio" else (ours or {}).get("value")
        met = None if x is None else _OPS[tgt["op"]](x, tgt["value"])
    return {"id": fid, "title": title, "status": "ok", "ratio": None if ratio is None else round(ratio, 4),
            "ratio_of": ratio_of, "ours": ours, "plain": plain, "target": tgt, "target_met": met,
            "details": details or {}, "notes": notes or []}


def two_workers(ctx: Ctx) -> str | None:
    """Why this host cannot run a group of 2 workers (None when it can): 2 CPU cores, 2 GPUs, or a TPU group
    size of 2 that TorchTPU launches here."""
    if ctx.kind == "cpu":
        return None if len(os.sched_getaffinity(0)) >= 2 else "needs 2 CPU cores (one worker each)"
    from backend.controller import devices

    info = devices.detect()
    if info.group_sizes is not None and 2 not in info.group_sizes:
        return f"needs a group of 2 {ctx.kind} workers; TorchTPU launches {info.group_sizes} on this host"
    return None if info.chips >= 2 else f"needs 2 {ctx.kind} chips; this host has {info.chips}"


def not_available(fid: str, title: str, reason: str, tgt: dict | None = None) -> dict:
    return {"id": fid, "title": title, "status": "not available", "reason": reason, "ratio": None, "target": tgt}


def failed(fid: str, title: str, reason: str, tgt: dict | None = None) -> dict:
    return {"id": fid, "title": title, "status": "failed", "reason": reason, "ratio": None, "target": tgt}


def target_text(tgt: dict | None) -> str:
    if not tgt:
        return "—"
    subject = "ratio" if tgt["on"] == "ratio" else "ours"
    unit = f" {tgt['unit']}" if tgt.get("unit") else ""
    return f"{subject} {_SYMBOL[tgt['op']]} {tgt['value']:g}{unit}"


def qty_text(q: dict | None) -> str:
    if not q or q.get("value") is None:
        return "—"
    v, unit = q["value"], q["unit"]
    if unit in ("s", "s/image", "s/prompt"):
        return f"{v:.3f} {unit}" if v < 10 else f"{v:.1f} {unit}"
    if unit == "ms":
        return f"{v:.1f} ms"
    if unit == "MB":
        return f"{v:.0f} MB"
    if unit == "TFLOP/s":
        mfu = f" (MFU {q['mfu']:.1%})" if q.get("mfu") is not None else ""
        return f"{v:.3g} TFLOP/s{mfu}"
    return f"{v:g} {unit}".strip()


# ---- statistics


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def paired(baseline: list[float], ours: list[float]) -> float:
    """Median over rounds of baseline/ours within each round: less sensitive to drift than a ratio of medians."""
    return median([b / o for b, o in zip(baseline, ours, strict=True)])


def spread(baseline: list[float], ours: list[float]) -> dict:
    """The per-round ratios baseline/ours, their median and quartiles: how far one round's ratio moves in this
    run (the noise a ratio of medians carries)."""
    ratios = [b / o for b, o in zip(baseline, ours, strict=True)]
    q1, _, q3 = statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1 else ratios * 3
    return {"paired_ratio_median": median(ratios), "paired_ratio_quartiles": [round(q1, 4), round(q3, 4)],
            "per_round_ratios": [round(r, 4) for r in ratios]}


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds so far of these processes (a shared machine's load moves them far less than
    wall time)."""
    import psutil

    return sum(sum(psutil.Process(pid).cpu_times()[:2]) for pid in pids)


def summary(xs: list[float], unit: str = "s") -> dict:
    """Median with the spread, and every sample (the table shows the median)."""
    return qty(median(xs), unit, n=len(xs), min=min(xs), max=max(xs),
               samples=[round(x, 6) for x in xs])


def alternate(contestants: dict[str, Callable[[int], float]], repeats: int, warmup: int,
              blocks: bool = False) -> dict[str, list[float]]:
    """Runs each contestant `warmup` times (discarded), then `repeats` rounds. Within a round every
    contestant runs once, in an order rotated from round to round, with the same round number (seed) for
    all, so slow drift of a shared machine falls on every contestant alike. `blocks` runs each contestant's
    rounds back to back instead (for devices that one process holds at a time)."""
    names = list(contestants)
    times: dict[str, list[float]] = {n: [] for n in names}
    if blocks:
        for name in names:
            for w in range(warmup):
                contestants[name](-1 - w)
            for r in range(repeats):
                times[name].append(contestants[name](r))
        return times
    for w in range(warmup):
        for name in names:
            contestants[name](-1 - w)
    for r in range(repeats):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            times[name].append(contestants[name](r))
    return times


# ---- environment


def version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_state() -> dict:
    def git(*args: str) -> str:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        return out.stdout.strip() if out.returncode == 0 else ""

    return {"commit": git("rev-parse", "HEAD") or None, "dirty": bool(git("status", "--porcelain"))}


def comfyui_version(comfyui_dir: str | None) -> str | None:
    if not comfyui_dir:
        return None
    try:
        text = (Path(comfyui_dir) / "comfyui_version.py").read_text()
        return text.split("=", 1)[1].strip().strip("\"'")
    except (OSError, IndexError):
        return Path(comfyui_dir).name


def environment(ctx: Ctx, info) -> dict:
    import psutil

    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": {d: version(d) for d in ("torch", "diffusers", "transformers", "accelerate", "numpy",
                                               "torch_tpu", "libtpu")},
        "comfyui": comfyui_version(ctx.comfyui_dir),
        "device": {"kind": info.kind, "chips": info.chips, "devices": info.devices, "name": info.name,
                   "memory_gib_per_device": info.memory_gib, "group_sizes": info.group_sizes},
        "cpu": {"model": cpu_model(), "cores": os.cpu_count(), "usable_cores": len(os.sched_getaffinity(0)),
                "memory_gib": round(psutil.virtual_memory().total / 2**30, 1)},
        "torch_threads_per_process": ctx.threads,
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "git": git_state(),
    }


def device_slug(info) -> str:
    if info.kind == "cpu":
        return "cpu"
    name = "".join(c if c.isalnum() else "-" for c in str(info.name)).strip("-").lower()
    return f"{info.kind}-{name}" if name else info.kind


def models_key() -> str:
    """Bench models are rebuilt when the code that builds them changes."""
    return hashlib.sha256((ROOT / "backend" / "tiny_models.py").read_bytes()).hexdigest()[:10]


# ---- the plain baseline's driver


def plain_env(ctx: Ctx, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": str(ctx.threads), "PYTHONUNBUFFERED": "1", **(extra or {})}
    env.pop("PYTHONPATH", None)  # the plain script sees diffusers, not this pack
    return env


def plain_args(ctx: Ctx, model: str) -> list[str]:
    return ["--model", ctx.model_path(model), "--device", ctx.kind, "--dtype", ctx.dtype,
            "--threads", str(ctx.threads)]


class PlainServer:
    """The plain script in `serve` mode: loaded once, then one pipe() call per request."""

    def __init__(self, ctx: Ctx, model: str, extra_env: dict[str, str] | None = None, args: tuple[str, ...] = ()):
        self.ctx = ctx
        self.log = open(ctx.work / f"plain-{model}-{time.monotonic_ns()}.log", "ab")
        # a session of its own, as the pack's workers have (controller/launcher.py): where the kernel groups
        # processes by session for scheduling (sched_autogroup), both sides then get a group's share under load
        # (it ends with its stdin: plain.py serve reads it to EOF)
        self.proc = subprocess.Popen([sys.executable, str(PLAIN), "serve", *plain_args(ctx, model), *args],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
                                     env=plain_env(ctx, extra_env), cwd=str(ctx.work), start_new_session=True)
        self.ready: dict | None = None

    def wait_ready(self) -> dict:
        if self.ready is None:
            self.ready = self._read()
        return self.ready

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the plain diffusers script exited (code {self.proc.wait()}): {self.log_tail()}")
        msg = json.loads(line)
        if "error" in msg:
            raise RuntimeError(f"the plain diffusers script failed: {msg['error']}")
        return msg

    def ask(self, op: str, **kw) -> dict:
        self.wait_ready()
        self.proc.stdin.write(json.dumps({"op": op, **kw}) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def call(self, seed: int, **kw) -> dict:
        c = self.ctx
        args = {"width": c.width, "height": c.height, "steps": c.steps, "seed": seed, **kw}
        return self.ask("call", **args)

    def log_tail(self, lines: int = 15) -> str:
        self.log.flush()
        try:
            return "\n".join(Path(self.log.name).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=20)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def plain_cold(ctx: Ctx, model: str, width: int | None = None, height: int | None = None) -> dict:
    """Process start → import → load → first image of the plain script, timed from just before it is spawned
    to the line it prints after the image (its exit is not counted)."""
    log_file = ctx.work / f"plain-cold-{model}.log"
    args = [sys.executable, str(PLAIN), "cold", *plain_args(ctx, model), "--width", str(width or ctx.width),
            "--height", str(height or ctx.height), "--steps", str(ctx.steps)]
    with open(log_file, "ab") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=err, text=True, env=plain_env(ctx),
                                cwd=str(ctx.work), start_new_session=True)  # as PlainServer: the workers' grouping
        line = proc.stdout.readline()
        wall = time.perf_counter() - t0
        proc.wait()
    if not line:
        tail = "\n".join(log_file.read_text(errors="replace").splitlines()[-15:])
        raise RuntimeError(f"the plain diffusers script failed (code {proc.returncode}): {tail}")
    return {"wall_s": wall, **json.loads(line)}


def with_env(updates: dict[str, str | None]):
    """Context manager: sets (None: removes) environment variables of this process, restores them after."""
    import contextlib

    @contextlib.contextmanager
    def manager():
        saved = {k: os.environ.get(k) for k in updates}
        try:
            for k, v in updates.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            yield
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    return manager()


def fmt_row_value(x: Any) -> str:
    return "—" if x is None else (f"{x:.3f}" if isinstance(x, float) else str(x))
