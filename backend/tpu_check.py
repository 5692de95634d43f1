"""`python -m backend tpu-check`: the first thing to run on a new TPU VM, and what to paste into a bug report.

It detects the chips, then runs every step the pack needs, each timed: one worker group, a tiny model (built
here, offline) in each execution mode, a compile at two shapes and samples that must not recompile, a restart
that should reuse the persistent compile cache, Shard TP and Data Parallel over the devices the host has (only
worker counts TorchTPU launches), and whether several devices give the same image as one; on a TPU, whether a
random draw on the chip and an eager `torch.cat` of SDXL's timestep embedding work (what diffusers' TorchTPU PR
works around, and the pack too: worker/rng.py, worker/device.py). It prints a report
(versions, chip type, every step's result and time, the first error with its traceback) and one line per step:
works / fails / skipped. On a host without a TPU the same steps run on the CUDA GPUs or the CPU where they make
sense (the CPU runs 2 worker processes for the multi-device steps), which is how CI tests it.

It goes through `backend.controller.api`, like the nodes, and uses a compile cache folder of its own (deleted
at the end), so the user's cache is neither used nor changed.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .controller import api
from .controller.process_env import TIER2_ROOT
from .protocol import settings
from .protocol.errors import ParallelError
from .protocol.spec import MODE_CHOICES, PipelineSpec, SampleRequest
from .tpu_probes import _CAT_PROBE, _FLOAT64_PROBE, _QUANT_PROBE, _RNG_PROBE, quant_report

MODEL = "tiny-flux"
SIZES = ((64, 64), (64, 96))  # the two compiled shapes (multiples of FLUX's 16)
IMAGES = 4  # images per comparison: split over the replicas of the multi-device steps
TP_TOLERANCE = {"float32": 1e-4, "bfloat16": 5e-2}  # a sharded transformer sums in another order
# Data Parallel's promise (README, docs/multi-chip.md): each image is its own pipeline call with its own seed, so
# a replica computes it exactly as one worker does, bit for bit, when both compute the same way: one chip or GPU
# each, or CPU workers with the same number of torch threads. CPU workers of different groups get different
# thread counts by default (the cores are divided among a group's workers), and the matmuls then sum in another
# order: within this much (3.6e-07 seen on 2 cores).
DP_CPU_TOLERANCE = 1e-5
VERSIONS = ("torch", "torch_tpu", "libtpu", "diffusers", "transformers", "accelerate", "safetensors", "numpy")


# The kinds of pipeline tpu-check samples a tiny model of, beside its main steps' image pipeline (tiny-flux): one
# step each, run with the first family in the registry that declares the kind (`Pipeline.check_kind`, or "video"
# for a video pipeline) and has a tiny model; declared and skipped, saying why, where no family does yet. The
# kinds issue 35 names come first ("quantized file": tpu-check's own step); another kind joins by its declaration.
KIND_STEPS = ("video", "video with sound", "modular pipeline", "quantized file")


def pipeline_kind(pipeline) -> str:
    """What `tpu-check` calls this pipeline's kind (backend/families/base.Pipeline.check_kind)."""
    return pipeline.check_kind or ("video" if pipeline.frame_step else "image")


def kind_steps() -> list[tuple[str, str, object]]:
    """(kind, step name, (family, pipeline, tiny name) or None) for every kind tpu-check runs a step for."""
    from .families import FAMILIES

    kinds = list(KIND_STEPS)
    for f in FAMILIES.values():
        kinds += [pipeline_kind(p) for p in f.pipelines if pipeline_kind(p) not in (*kinds, "image")]
    steps = []
    for kind in kinds:
        found = next(((f, p, f.tiny[0]) for f in FAMILIES.values() if f.tiny for p in f.pipelines[:1]
                      if pipeline_kind(p) == kind), None)
        steps.append((kind, f"sample a tiny {kind} model" + (f" ({found[0].name})" if found else ""), found))
    return steps


class Skip(Exception):
    """A step that does not apply on this host; the message says why."""


@dataclass
class Step:
    name: str
    result: str = "skipped"  # works | fails | skipped
    seconds: float = 0.0
    detail: str = ""


@dataclass
class Report:
    steps: list[Step] = field(default_factory=list)
    first_error: str | None = None

    def run(self, name: str, fn: Callable[[], str], needs: tuple[str, ...] = ()) -> None:
        """Runs one step: `fn` returns what it found (works), raises Skip (skipped) or anything else (fails)."""
        step = Step(name)
        self.steps.append(step)
        missing = [n for n in needs if self.result(n) != "works"]
        if missing:
            step.detail = f"needs '{missing[0]}', which did not work"
            return
        t0 = time.perf_counter()
        try:
            step.detail, step.result = fn(), "works"
        except Skip as e:
            step.detail = str(e)
        except Exception as e:  # noqa: BLE001  (every failure is reported, and the next steps still run)
            step.result, step.detail = "fails", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            if self.first_error is None:
                self.first_error = f"step '{name}':\n{traceback.format_exc()}"
        step.seconds = time.perf_counter() - t0

    def result(self, name: str) -> str:
        return next((s.result for s in self.steps if s.name == name), "skipped")

    @property
    def failed(self) -> bool:
        return any(s.result == "fails" for s in self.steps)


def _versions() -> str:
    found = [f"python {platform.python_version()}"]
    for dist in VERSIONS:
        try:
            found.append(f"{dist} {importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{dist} -")
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).parent, text=True,
                             capture_output=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        rev = ""
    return " · ".join(found + [f"ComfyUI-TPU {rev or 'unknown'}"])


def _request(width: int = 64, height: int = 64, batch: int = IMAGES) -> SampleRequest:
    return SampleRequest(prompt="a red fox in the snow", width=width, height=height, steps=2, guidance=0.0, seed=7,
                         batch_size=batch)


def _diff(a: np.ndarray, b: np.ndarray) -> float:
    if a.shape != b.shape:
        raise AssertionError(f"images of shape {a.shape}, expected {b.shape}")
    return float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max())


class TpuCheck:
    """The steps, in order; each one's findings feed the next."""

    def __init__(self, device: str, models: Path, compile_backend: str | None):
        self.device, self.models, self.backend_choice = device, models, compile_backend
        self.report = Report()
        self.kind = ""
        self.spec: PipelineSpec | None = None
        self.compiled: PipelineSpec | None = None
        self.reference: np.ndarray | None = None
        self.world = 1
        self.threads: list[int] = []  # torch threads of the first group's workers
        self.info = None
        self.cache_dir = Path(tempfile.mkdtemp(prefix="comfyui-tpu-check-cache-"))

    def run(self) -> Report:
        r = self.report
        r.run("detect the device", self.detect)
        r.run("build the tiny model", self.build)
        r.run("start a worker group and load", self.start, needs=("build the tiny model",))
        for mode in MODE_CHOICES:
            if mode != "compiled":
                r.run(f"sample in {mode}", lambda mode=mode: self.sample_in(mode),
                      needs=("start a worker group and load",))
        r.run("compile at two shapes", self.compile, needs=("start a worker group and load",))
        r.run("sample the compiled shapes without recompiling", self.no_recompile, needs=("compile at two shapes",))
        r.run("restart and reuse the compile cache", self.restart, needs=("compile at two shapes",))
        r.run("Shard TP over several devices", self.shard_tp, needs=("sample in strict eager",))
        r.run("Data Parallel over several devices: same images", self.data_parallel,
              needs=("sample in strict eager",))
        for kind, name, found in kind_steps():
            r.run(name, lambda kind=kind, found=found: self.sample_kind(kind, found),
                  needs=("start a worker group and load",))
        api.shutdown()  # the chips are free again for the next step's own process
        r.run("float64 on the device (FLUX's rotary embedding)", self.float64, needs=("detect the device",))
        r.run("random numbers drawn on the device", self.device_rng, needs=("detect the device",))
        r.run("eager torch.cat of SDXL's time_proj", self.eager_time_proj, needs=("detect the device",))
        shutil.rmtree(self.cache_dir, ignore_errors=True)
        return r

    # ---- steps
    def detect(self) -> str:
        self.info = info = api.device_info()
        memory = f", {info.memory_gib:g} GiB per device" if info.memory_gib else ""
        sizes = f", TorchTPU launches {list(info.group_sizes)} workers" if info.group_sizes is not None else ""
        text = f"{info.kind}: {info.name}, {info.chips} chip(s), {info.devices} device(s){memory}{sizes}"
        if info.notes:
            text += "; " + " | ".join(info.notes)
        if self.device in ("auto", "tpu") and info.kind != "tpu" and any("TPU" in n for n in info.notes):
            raise RuntimeError(text)  # TPU hardware that cannot be used: the report says why
        return text

    def build(self) -> str:
        from .tiny_models import build_all

        path = build_all(self.models, ["flux"])["flux"]
        return f"{path} ({sum(p.stat().st_size for p in path.rglob('*.safetensors')) / 1e6:.1f} MB)"

    def start(self) -> str:
        api.set_compile_cache_dir(str(self.cache_dir), override=True)
        self.spec = api.make_spec(MODEL, [str(self.models)], device_choice=self.device)
        self.kind = self.spec.kind
        ready = api.checked(self.spec)
        self.world = ready.world_size
        info = api.load(self.spec)
        self.threads = sorted({w["threads"] for w in api.worker_info()})
        layout = f"{ready.world_size} worker(s)" + (f" (Data Parallel {ready.dp_replicas} by default)"
                                                    if ready.dp_replicas > 1 else "")
        return f"{layout} on {info['device']}, {info['dtype']}, model {Path(info['model']).name}"

    def sample_in(self, mode: str) -> str:
        spec, notes = api.with_mode(self.spec, mode)
        images = api.sample(spec, _request())
        if not np.isfinite(images).all():
            raise AssertionError("the images hold NaN or inf")
        if self.reference is None:
            self.reference = images
            return f"{images.shape[0]} images {images.shape[2]}x{images.shape[1]}" + "".join(f"; {n}" for n in notes)
        return f"max difference to strict eager {_diff(images, self.reference):.2g}" + "".join(f"; {n}" for n in notes)

    def compile(self) -> str:
        from .controller import compile_plan

        backend = self.backend_choice or {"tpu": "tpu", "cuda": "inductor"}.get(self.kind, "aot_eager")
        warmup = ", ".join(f"{w}x{h}" for w, h in SIZES)
        self.compiled, _ = api.with_compile(self.spec, "whole denoiser", compile_plan.compile_backend(self.kind, backend),
                                            warmup)
        api.load(self.compiled)
        stats = api.compile_stats()
        if stats["compiles"] < len(SIZES):
            raise AssertionError(f"{stats['compiles']} compiles for {len(SIZES)} warm-up shapes")
        per_shape = ", ".join(f"{s['shape']} {s['compile_s']:.1f} s" for s in stats["shapes"])
        return f"backend {self.compiled.compile.backend}: {per_shape}; cache {stats['cache']['status']}"

    def no_recompile(self) -> str:
        before = api.compile_stats()
        for w, h in SIZES:
            api.sample(self.compiled, _request(w, h, batch=1))
        # another step count than the warm-up's: the timestep is a graph input (TorchTPU's guide says a new
        # num_inference_steps recompiles; the pack hands the timestep over as a copy: docs/execution-modes.md)
        api.sample(self.compiled, dataclasses.replace(_request(*SIZES[0], batch=1), steps=3))
        after = api.compile_stats()
        new = after["compiles"] - before["compiles"]
        unexpected = after["unexpected_recompiles"] - before["unexpected_recompiles"]
        if new or unexpected:
            raise AssertionError(f"{new} new compiles and {unexpected} unexpected recompiles at warmed shapes "
                                 "(one of them with 3 steps instead of 2)")
        return f"{after['hits'] - before['hits']} reuses, 0 recompiles (one with 3 steps instead of 2)"

    def restart(self) -> str:
        cold = api.compile_stats()
        tpu_files = _count_files(self.cache_dir / "tpu")
        first = (cold.get("torch_tpu_cache") or {}).get("tier2")
        api.shutdown()
        api.load(self.compiled)
        warm = api.compile_stats()
        status = warm["cache"]["status"]
        if warm["disk_hits"]:
            found = f"{warm['disk_hits']} graphs from inductor's disk cache"
        elif self.compiled.compile.backend == "tpu":  # a reused on-disk cache writes no new files
            found = (f"TorchTPU's cache held {tpu_files} files and gained "
                     f"{_count_files(self.cache_dir / 'tpu') - tpu_files} in the restart")
        else:
            found = f"backend {self.compiled.compile.backend} keeps no compiled graphs on disk"
        text = (f"cache folder {status}; compile {cold['compile_s']:.1f} s cold → {warm['compile_s']:.1f} s after "
                f"the restart; {found}")
        if tpu := warm.get("torch_tpu_cache"):
            # Each group has its own tier-2 (shared-memory) cache, deleted when it stops: the restarted group
            # cannot be served from the first one's, so what it did not compile came from the on-disk cache.
            gone = first is not None and first != tpu["tier2"] and not (TIER2_ROOT / first).exists()
            text += (f"; torch.tpu._get_cache_stats(): {tpu['requests']} requests, {tpu['hits']} hits, "
                     f"{tpu['compilations']} compilations; tier-2 cache '{tpu['tier2']}', the first group's "
                     f"'{first}' {'removed' if gone else 'NOT removed'}")
            if not gone:
                raise AssertionError(text)
        if not status.startswith("reused"):
            raise AssertionError(text)
        return text

    def _layout(self, tp: int, replicas: int | None) -> PipelineSpec:
        spec, _ = api.shard(self.spec, tp) if tp > 1 else (self.spec, "")
        if replicas is not None:
            spec, _ = api.replicate(spec, replicas)
        ready = api.checked(spec)
        if ready.world_size <= self.world and ready.tp_degree == 1:
            raise Skip(f"this host runs no larger group than the first one ({self.world} worker(s))")
        return spec

    def shard_tp(self) -> str:
        try:
            spec = self._layout(2, None)  # tiny-flux has 2 attention heads; on the CPU: 2 processes
        except ParallelError as e:
            raise Skip(f"Shard TP 2 does not run here: {e}") from None
        if not api_launches(spec):
            spec = self._layout(2, 0)  # with Data Parallel: a group TorchTPU launches
        images = api.sample(spec, _request())
        ready = api.checked(spec)
        diff = _diff(images, self.reference)
        tolerance = TP_TOLERANCE.get(api.worker_info()[0]["dtype"], 1e-4)
        text = (f"TP {ready.tp_degree} × {ready.dp_replicas} replica(s) = {ready.world_size} workers: max difference "
                f"to {self.world} worker(s) {diff:.2g} (tolerance {tolerance:g})")
        if diff > tolerance:
            raise AssertionError(text)
        return text

    def data_parallel(self) -> str:
        try:
            spec = self._layout(1, 2 if self.kind == "cpu" else 0)  # the CPU has no chips: 2 processes
        except ParallelError as e:
            raise Skip(f"Data Parallel does not run here: {e}") from None
        images = api.sample(spec, _request())
        ready = api.checked(spec)
        diff = _diff(images, self.reference)
        threads = sorted({w["threads"] for w in api.worker_info()})
        same_way = self.kind != "cpu" or threads == self.threads
        text = (f"{ready.dp_replicas} replicas: {'bit-identical to' if diff == 0 else f'{diff:.2g} off'} "
                f"{self.world} worker(s)")
        if self.kind == "cpu":
            text += f" (torch threads per worker: {'/'.join(map(str, threads))} against {'/'.join(map(str, self.threads))})"
        if same_way and diff:
            raise AssertionError(text + ": workers that compute the same way must give the same pixels")
        if diff > DP_CPU_TOLERANCE:
            raise AssertionError(text + f": more than the {DP_CPU_TOLERANCE:g} CPU workers with other thread counts "
                                        "may differ")
        if diff:
            text += (f", within the {DP_CPU_TOLERANCE:g} promised for CPU workers with other thread counts (set "
                     f"{settings.WORKER_THREADS.name} for bit-identical pixels)")
        return text


    def sample_kind(self, kind: str, found) -> str:
        """A tiny model of one kind of pipeline (a video, a video with sound, ...) sampled on the first group's
        devices: it loads and gives finite pixels (its family's own tests check them against diffusers)."""
        if kind == "quantized file":
            return self.quantized_file()
        if found is None:
            raise Skip(f"no family in this pack declares a {kind} pipeline with a tiny model yet "
                       "(Pipeline.check_kind and ModelFamily.tiny in backend/families)")
        from .tiny_models import build_all

        family, pipeline, tiny = found
        build_all(self.models, [tiny])
        spec = api.make_spec(f"tiny-{tiny}", [str(self.models)], device_choice=self.device)
        frames = 1 + pipeline.frame_step if pipeline.frame_step else 0
        side = max(32, 2 * spec.size_factor)
        request = dataclasses.replace(_request(side, side, batch=1), frames=frames)
        images = api.sample(spec, request)
        if not np.isfinite(images).all():
            raise AssertionError("the images hold NaN or inf")
        what = f"{images.shape[0]} frames" if frames else f"{images.shape[0]} image(s)"
        return f"{family.name} ({pipeline.class_name}, tiny-{tiny}): {what} {images.shape[2]}x{images.shape[1]}"

    def quantized_file(self) -> str:
        """ComfyUI's quantized layers on the device, read as the pack reads such a file (tpu_probes)."""
        where = {"tpu": "tpu:0", "cuda": "cuda:0"}.get(kind := self.kind or self.info.kind, "cpu")
        out, found = _probe(_QUANT_PROBE, kind, where, str(self.models / "tiny-flux" / "text_encoder_2"), kind,
                            str(Path(__file__).resolve().parent.parent))
        return quant_report(where, found, _why(out))

    def float64(self) -> str:
        """Whether float64 runs on the device, in a process of its own (one that fails or aborts ends alone)."""
        from .worker.device import FLOAT64_DOWNCAST

        kind = self.kind or self.info.kind
        where = {"tpu": "tpu:0", "cuda": "cuda:0"}.get(kind, "cpu")
        out, found = _probe(_FLOAT64_PROBE, kind, where)
        policy = (f"the pack computes FLUX's rotary embedding in float32 on {kind} (as diffusers does on mps and npu)"
                  if kind in FLOAT64_DOWNCAST else f"FLUX's rotary embedding runs in float64 on {kind}")
        if len(found) != 3:
            return f"float64 does not run on {where} ({_why(out)}); {policy}"
        dtype, error, float32_error = found
        if dtype != "torch.float64":
            return f"float64 comes back as {dtype} from {where}; {policy}"
        return (f"float64 runs on {where}: cos of 4096 values within {float(error):.2g} of the CPU's float64 "
                f"(float32: {float(float32_error):.2g}); {policy}")


    def _tpu_kind(self) -> str:
        kind = self.kind or self.info.kind
        if kind != "tpu":
            raise Skip(f"asks TorchTPU itself, so it runs on a TPU only (this host runs {kind})")
        return kind

    def device_rng(self) -> str:
        """Point 1 of issue 35: diffusers' TorchTPU PR draws on the CPU because of a TPU random-generator bug
        ("TPU RNG has an unaligned DUS bug"); a seeded draw of an unaligned shape on the device, against the CPU's."""
        out, found = _probe(_RNG_PROBE, self._tpu_kind(), "tpu:0")
        policy = "the pack draws every random number on the CPU and moves it (worker/rng.py)"
        if len(found) != 2:
            return f"a draw on tpu:0 failed ({_why(out)}): the bug is there; {policy}"
        return (f"a draw on tpu:0 ran (finite: {found[1]}), max difference to the CPU's with the same seed "
                f"{float(found[0]):.3g}: a device generator would not give the CPU's images; {policy}")

    def eager_time_proj(self) -> str:
        """Point 2: the PR moves UNet2DConditionModel's time_proj to the CPU in eager mode ("torch.cat([sin, cos],
        dim=-1) inside time_proj lands at an unaligned offset in the XLA DUS fusion emitter → crash"); the same
        embedding (320 channels), each TorchTPU eager mode in a process of its own (an abort ends it alone)."""
        kind, found = self._tpu_kind(), []
        for mode in ("DEFER_NEVER", "DEFER_AND_FUSE"):
            out, answer = _probe(_CAT_PROBE, kind, "tpu:0", mode)
            found.append(f"{mode}: " + (f"ran, within {float(answer[0]):.2g} of the CPU" if len(answer) == 1 else
                                        f"failed ({_why(out)})"))
        return "; ".join(found) + ("; the pack runs SDXL's time_proj on the CPU in eager mode on a TPU "
                                   "(worker/device.py), which a failure here confirms is needed")


def _probe(code: str, kind: str, *args: str) -> tuple[subprocess.CompletedProcess | None, list[str]]:
    """Runs `code` in a worker's environment in a process of its own; its last line's words (none on failure)."""
    from .controller import process_env

    try:
        out = subprocess.run([sys.executable, "-c", code, *args], env=process_env.worker_env(kind),
                             capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        return None, []
    return out, (out.stdout.strip().splitlines()[-1].split() if out.returncode == 0 and out.stdout.strip() else [])


def _why(out: subprocess.CompletedProcess | None) -> str:
    if out is None:
        return "no answer within 600 s"
    return f"exit code {out.returncode}: " + " / ".join((out.stderr or "").strip().splitlines()[-2:])


def api_launches(spec: PipelineSpec) -> bool:
    """Whether the spec's layout is complete as it is (a Shard TP degree alone may need Data Parallel)."""
    try:
        api.checked(spec)
    except ParallelError:
        return False
    return True


def _count_files(folder: Path) -> int:
    return sum(1 for p in folder.rglob("*") if p.is_file())


class _Log(logging.Handler):
    """The pack's warnings and errors (a failed worker's traceback among them), for the report."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines += self.format(record).splitlines()


def render(report: Report, versions: str, info, log_lines: list[str] = ()) -> str:
    lines = ["## ComfyUI-TPU tpu-check", "", f"- date: {time.strftime('%Y-%m-%d %H:%M:%S %z')}",
             f"- versions: {versions}", f"- host: {platform.platform()}, {os.cpu_count()} cores"]
    if info is not None:
        lines.append(f"- device: {info.kind}, {info.name}, chips {info.chips}, devices {info.devices}, memory per "
                     f"device {info.memory_gib} GiB, TorchTPU group sizes {info.group_sizes}")
    pod = {k: os.environ[k] for k in ("TPU_WORKER_HOSTNAMES", "JOB_COMPLETION_INDEX", settings.LOCAL_GROUP.name,
                                      "TPU_SKIP_MDS_QUERY", "TORCH_DEVICE_BACKEND_AUTOLOAD") if k in os.environ}
    lines.append(f"- environment: {pod or 'none of the TPU variables set'}")
    lines += ["", "| step | result | seconds | details |", "|---|---|---|---|"]
    lines += [f"| {s.name} | {s.result} | {s.seconds:.1f} | {s.detail.replace('|', '/')} |" for s in report.steps]
    if report.first_error:
        lines += ["", "First error:", "```", report.first_error.rstrip(), "```"]
    if log_lines:
        lines += ["", "The pack's warnings and errors (last 40 lines):", "```", *log_lines[-40:], "```"]
    lines += ["", *(f"{s.result:8} {s.name} ({s.seconds:.1f} s)" for s in report.steps)]
    return "\n".join(lines)


def main(device: str = "auto", models: str | None = None, compile_backend: str | None = None,
         out: str | None = None) -> int:
    folder = Path(models) if models else Path(tempfile.mkdtemp(prefix="comfyui-tpu-check-models-"))
    captured = _Log()
    logging.getLogger("comfyui_tpu").addHandler(captured)
    try:
        check = TpuCheck(device, folder, compile_backend)
        report = check.run()
        text = render(report, _versions(), check.info, captured.lines)
    finally:
        logging.getLogger("comfyui_tpu").removeHandler(captured)
        if not models:
            shutil.rmtree(folder, ignore_errors=True)
    print(text, flush=True)
    if out:
        Path(out).write_text(text + "\n")
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
