"""Execution modes, torch.compile of the denoiser, and the static-shape compile cache.

Controller side (ComfyUI's process, no torch import): `parse_warmup` and `resolve_plan` check what the
Set Execution Mode and Compile nodes ask for. Worker side:
- `prepare_cache_env` runs at worker start, before torch loads and the device starts: it points inductor's
  and TorchTPU's persistent caches at one folder stamped with a manifest of the versions that make it valid.
- `Compiler` applies the mode and compile plan to the loaded pipeline (no reload), knows the shape
  signatures the compiled denoiser has seen, announces a compile before it starts, counts compiles and hits
  from dynamo's own counters, and reports them (`stats`, shown by the nodes and TPU Device Info).

A shape signature is what makes a static-shape graph recompile: width, height, batch, whether CFG doubles
the denoiser's batch (SD3, SDXL), and the text length. Text length is kept fixed: `max_sequence_length` is
passed explicitly, and Qwen-Image (whose prompt embeddings are as long as the prompt) gets its embeddings
padded, with an attention mask, to 128-token buckets.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.metadata
import inspect
import json
import logging
import math
import os
import platform
import re
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from . import device
from .spec import COMPILE_BACKENDS, COMPILE_TARGETS, CompilePlan, PipelineSpec, SampleRequest

log = logging.getLogger("comfyui_tpu")

CACHE_ENV = "COMFYUI_TPU_COMPILE_CACHE"  # the folder; ComfyUI's nodes set it under ComfyUI's user directory
DEFAULT_CACHE = "~/.cache/comfyui-tpu/compile"
MANIFEST = "manifest.json"
_CACHE_SUBDIRS = ("inductor", "tpu")  # the only folders a renewal deletes (the root may be shared)
NO_REPEATED_BLOCKS = {"StableDiffusion3Pipeline"}  # SD3Transformer2DModel has no _repeated_blocks
CFG_DOUBLES_BATCH = {"StableDiffusion3Pipeline", "StableDiffusionXLPipeline"}  # CFG = one call on 2x batch
TEXT_BUCKET = 128  # Qwen-Image prompt embeddings are padded to a multiple of this
RECOMPILE_LIMIT = 64  # dynamo's default (8 graphs per function) would silently fall back to eager
MAX_WARMUP_BATCH = 64


class CompileError(ValueError):
    """A compile setting cannot work; the message names the input and the fix."""


# ---- controller side: checking what the nodes ask for

_SIZE = re.compile(r"^(\d+)\s*[x×*]\s*(\d+)(?:\s*[x×*]\s*(\d+))?$")


def parse_warmup(text: str) -> tuple[tuple[int, int, int], ...]:
    """'1024x1024, 832x1216x2' → ((1024, 1024, 1), (832, 1216, 2)): WIDTHxHEIGHT[xBATCH], comma separated."""
    shapes: list[tuple[int, int, int]] = []
    for part in re.split(r"[,;\n]+", text or ""):
        part = part.strip().lower()
        if not part:
            continue
        m = _SIZE.match(part)
        if not m:
            raise CompileError(f"warmup: '{part}' is not a size. Write WIDTHxHEIGHT with an optional xBATCH, "
                               "separated by commas, e.g. '1024x1024, 832x1216x2' (or leave it empty).")
        w, h, b = int(m[1]), int(m[2]), int(m[3] or 1)
        if not 1 <= b <= MAX_WARMUP_BATCH:
            raise CompileError(f"warmup: batch {b} in '{part}' is out of range; use 1 to {MAX_WARMUP_BATCH}.")
        if (w, h, b) not in shapes:
            shapes.append((w, h, b))
    return tuple(shapes)


def format_warmup(shapes) -> str:
    return ", ".join(f"{w}x{h}" + (f"x{b}" if b != 1 else "") for w, h, b in shapes)


def resolve_plan(spec: PipelineSpec, kind: str) -> tuple[CompilePlan | None, list[str]]:
    """The compile plan `spec` really runs with on `kind` (None unless its mode is 'compiled'), with the
    backend resolved and the target adjusted for offload, plus notes for the user. Raises CompileError."""
    if spec.mode != "compiled":
        return None, []
    plan = spec.compile or CompilePlan()
    if plan.target not in COMPILE_TARGETS:
        raise CompileError(f"target: '{plan.target}' is not one of {', '.join(COMPILE_TARGETS)}.")
    if plan.backend not in COMPILE_BACKENDS:
        raise CompileError(f"backend: '{plan.backend}' is not one of {', '.join(COMPILE_BACKENDS)}.")
    try:
        backend = device.compile_backend(kind, plan.backend)
    except device.DeviceError as e:
        raise CompileError(str(e)) from None
    if spec.offload == "sequential":
        raise CompileError("offload: 'sequential' moves weights layer by layer inside the denoiser's blocks, which "
                           "torch.compile cannot trace. Use offload 'model' (its repeated blocks are compiled) "
                           "or 'none', or use an eager mode.")
    notes, target = [], plan.target
    if spec.offload == "model" and target == "whole denoiser":
        target = "repeated blocks"
        notes.append("offload 'model' wraps the whole denoiser in hooks that torch.compile cannot trace: "
                     "compiling its repeated blocks instead.")
    if target == "repeated blocks" and spec.class_name in NO_REPEATED_BLOCKS:
        why = " (forced by offload 'model'; set offload to 'none')" if plan.target != target else ""
        raise CompileError(f"target: SD3's transformer has no repeated blocks to compile{why}. "
                           "Choose target 'whole denoiser'.")
    return replace(plan, target=target, backend=backend), notes


# ---- worker side: the persistent cache folder

CACHE_INFO: dict[str, Any] = {"dir": None, "status": "not set up"}


def versions() -> dict[str, str]:
    """What a compiled artifact depends on; read from package metadata (nothing is imported)."""
    out = {"python": platform.python_version()}
    for dist in ("torch", "torch_tpu", "libtpu", "diffusers"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def prepare_cache_env(environ: dict | os._Environ = os.environ, root: str | None = None) -> dict[str, Any]:
    """Points the compile caches at `root` (default: $COMFYUI_TPU_COMPILE_CACHE, else ~/.cache/comfyui-tpu/compile)
    after checking its manifest. Call before torch loads and before the device starts. Never raises: a folder
    that cannot be used leaves the libraries' own defaults in place and says why."""
    path = Path(root or environ.get(CACHE_ENV) or DEFAULT_CACHE).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
        with open(path / ".lock", "a") as lock:  # ranks of one group start together: one checks at a time
            fcntl.flock(lock, fcntl.LOCK_EX)
            status = _check_manifest(path)
        for sub in _CACHE_SUBDIRS:
            (path / sub).mkdir(exist_ok=True)
    except OSError as e:
        status = f"disabled: the folder cannot be used ({e}); compiled graphs are not kept across restarts"
        log.warning("comfyui-tpu: compile cache %s %s", path, status)
        CACHE_INFO.update(dir=str(path), status=status)
        return dict(CACHE_INFO)
    environ.update(device.compile_cache_env(str(path)))
    CACHE_INFO.update(dir=str(path), status=status)
    return dict(CACHE_INFO)


def _check_manifest(path: Path) -> str:
    """'new', 'reused', or 'renewed (reason)' after deleting caches built by other versions."""
    want = versions()
    manifest = path / MANIFEST
    reason = None
    if manifest.exists():
        try:
            have = json.loads(manifest.read_text())
            have = {k: have.get(k) for k in want}
        except (OSError, ValueError) as e:
            reason = f"its manifest is unreadable ({type(e).__name__})"
        else:
            changed = [f"{k} {have[k]} → {want[k]}" for k in want if have[k] != want[k]]
            if not changed:
                return "reused"
            reason = "built with other versions: " + ", ".join(changed)
    elif any((path / sub).exists() for sub in _CACHE_SUBDIRS):
        reason = "it has no manifest"
    if reason:
        log.warning("comfyui-tpu: compile cache %s is stale (%s); starting a fresh one.", path, reason)
        for sub in _CACHE_SUBDIRS:
            shutil.rmtree(path / sub, ignore_errors=True)
    tmp = path / f".{MANIFEST}.{os.getpid()}"
    tmp.write_text(json.dumps({**want, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}, indent=1))
    os.replace(tmp, manifest)
    return f"renewed ({reason})" if reason else "new"


# ---- worker side: modes, compiling, shape signatures

@dataclass(frozen=True)
class Shape:
    """What makes a static-shape graph of the denoiser recompile."""

    width: int
    height: int
    batch: int
    cfg: bool  # CFG doubles the denoiser's batch (SD3, SDXL with guidance > 1)
    text: int  # text tokens the denoiser sees
    variable_text: bool = False  # the pipeline's text length follows the prompt (Qwen-Image): show it

    def label(self) -> str:
        extra = (", CFG" if self.cfg else "") + (f", prompt ≤ {self.text} tokens" if self.variable_text else "")
        return f"{self.width}x{self.height} (batch {self.batch}{extra})"


def _dynamo_counts() -> dict[str, float]:
    from torch._dynamo.utils import compilation_time_metrics, counters

    return {
        "graphs": counters["stats"]["unique_graphs"],
        "seconds": sum(compilation_time_metrics.get("_compile.compile_inner", ())),
        "disk_hits": counters["inductor"]["fxgraph_cache_hit"],
        "disk_misses": counters["inductor"]["fxgraph_cache_miss"],
    }


def _denoiser(pipe) -> tuple[str, Any]:
    for name in ("transformer", "unet"):
        module = getattr(pipe, name, None)
        if module is not None:
            return name, module
    raise CompileError(f"{type(pipe).__name__} has no transformer or UNet to compile.")


class Compiler:
    """One per worker: the mode and compile state of the loaded pipeline's denoiser, and its statistics."""

    def __init__(self, kind: str, status):
        self.kind, self.status = kind, status
        self.mode, self.note = "strict eager", None
        self._cache_told = False  # a renewed or unusable cache folder is announced once
        self.module = None  # the compiled denoiser
        self._component: str | None = None  # "model/transformer (dtype, target, backend)", for the statistics
        self.applied: tuple | None = None  # (target, backend, model, dtype) it was compiled with
        self.plan: CompilePlan | None = None
        self.seen: set[Shape] = set()  # signatures compiled for the current module and plan
        self.compiling: str | None = None  # the shape being compiled by the pipeline call under way, if any
        self.warmed: set[tuple[int, int, int]] = set()
        self.shapes: dict[str, dict] = {}  # statistics per model, plan and shape (kept across plan changes)
        self.totals = {"compiles": 0, "hits": 0, "compile_s": 0.0, "graphs": 0, "unexpected_recompiles": 0,
                       "disk_hits": 0, "disk_misses": 0}

    # ---- mode and plan
    def configure(self, runtime, spec: PipelineSpec) -> None:
        """Applies the mode and compile plan to runtime.pipe (no reload), then compiles warm-up shapes."""
        if not self._cache_told and not CACHE_INFO["status"].startswith(("new", "reused", "not set up")):
            self.status(f"compile cache {CACHE_INFO['dir']}: {CACHE_INFO['status']}")  # renewed or disabled
        self._cache_told = True
        self.mode, self.note = spec.mode, device.mode_note(self.kind, spec.mode)
        device.set_execution_mode(self.kind, spec.mode)
        plan, notes = resolve_plan(spec, self.kind)
        for note in [self.note, *notes] if self.note else notes:
            self.status(note)
        name, module = _denoiser(runtime.pipe)
        want = None if plan is None else (plan.target, plan.backend, spec.model_path, spec.dtype)
        if module is not self.module or want != self.applied:
            self._uncompile()
            if plan is not None:
                self._compile(name, module, plan, spec.class_name)
                self.module = module
            self.applied, self.seen, self.warmed = want, set(), set()
        self.plan = plan
        if plan is None:
            return
        dtype = device.default_dtype_name(self.kind) if spec.dtype == "auto" else spec.dtype
        self._component = f"{Path(spec.model_path).name}/{name} ({dtype}, {plan.target}, {plan.backend})"
        todo = [s for s in plan.warmup if s not in self.warmed]
        for i, (w, h, b) in enumerate(todo, 1):
            self.status(f"warm-up {i}/{len(todo)}: {w}x{h} (batch {b})")
            runtime.sample(spec, self._warmup_request(spec, w, h, b))
            self.warmed.add((w, h, b))

    def _compile(self, name: str, module, plan: CompilePlan, class_name: str) -> None:
        import torch

        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        options = {"fullgraph": True, "dynamic": False, "backend": plan.backend}
        if plan.target == "whole denoiser":
            module.compile(**options)
        else:
            if not getattr(module, "_repeated_blocks", None):
                raise CompileError(f"target: the {name} of {class_name} has no repeated blocks to compile. "
                                   "Choose target 'whole denoiser' (with offload 'none').")
            module.compile_repeated_blocks(**options)
        self.status(f"{name} set to compile with {plan.backend} ({plan.target}); each new shape compiles once")

    def _uncompile(self) -> None:
        if self.module is None:
            return
        import torch

        for m in self.module.modules():
            if getattr(m, "_compiled_call_impl", None) is not None:
                m._compiled_call_impl = None  # what nn.Module.compile() set: back to eager
        self.module = None
        torch._dynamo.reset()

    def forget(self) -> None:
        """The pipeline is being unloaded: drop every reference to it."""
        self._uncompile()
        self.applied, self.plan, self.seen, self.warmed = None, None, set(), set()

    @staticmethod
    def _warmup_request(spec: PipelineSpec, width: int, height: int, batch: int) -> SampleRequest:
        """Two steps (a per-step recompile would show), CFG on where it changes shapes (as these models are
        used), and `batch` images for every data-parallel replica, so each of them compiles."""
        guidance = 5.0 if spec.class_name in CFG_DOUBLES_BATCH else 3.5
        return SampleRequest(prompt="warm-up", width=width, height=height, steps=2, guidance=guidance,
                             batch_size=batch * spec.dp_replicas)

    # ---- around one pipeline call
    @contextlib.contextmanager
    def sampling(self, pipe, spec: PipelineSpec, kwargs: dict):
        """Wraps one pipeline call: fixes shapes (text length, optional snapping), announces a first compile,
        then counts it (or the hit) from dynamo's counters. Edits `kwargs` in place."""
        if self.plan is None:
            yield
            return
        self._snap(kwargs)
        shape = self._fix_shapes(pipe, spec, kwargs)
        new = shape not in self.seen
        key = f"{self._component} {shape.label()}"
        entry = self.shapes.setdefault(key, {"component": self._component, "shape": shape.label(), "compiles": 0,
                                             "hits": 0, "compile_s": 0.0, "first_call_s": None, "graphs": 0,
                                             "unexpected_recompiles": 0, "from_disk": False})
        if new:
            self.status(f"compiling {shape.label()} for the first time…")
        before, started = _dynamo_counts(), time.perf_counter()
        self.compiling = shape.label() if new else None
        try:
            yield
        finally:
            self.compiling = None
            delta = {k: v - before[k] for k, v in _dynamo_counts().items()}
            self._record(shape, new, entry, delta, time.perf_counter() - started)

    def _record(self, shape: Shape, new: bool, entry: dict, delta: dict, call_s: float) -> None:
        graphs, seconds = int(delta["graphs"]), round(delta["seconds"], 3)
        t = self.totals
        t["graphs"] += graphs
        t["disk_hits"] += int(delta["disk_hits"])
        t["disk_misses"] += int(delta["disk_misses"])
        if new:
            if not graphs:
                return  # stopped before the denoiser ran: still unseen
            self.seen.add(shape)
            entry["compiles"] += 1
            entry["graphs"] += graphs
            entry["compile_s"] = round(entry["compile_s"] + seconds, 3)
            entry["first_call_s"] = round(call_s, 3)  # the whole call: bounds a compile that runs lazily
            entry["from_disk"] = entry["from_disk"] or delta["disk_hits"] > 0
            t["compiles"] += 1
            t["compile_s"] = round(t["compile_s"] + seconds, 3)
            disk = " (graphs found in the on-disk cache)" if delta["disk_hits"] else ""
            self.status(f"compiled {shape.label()} in {seconds:.1f} s{disk}")
        else:
            entry["hits"] += 1
            t["hits"] += 1
            if graphs:
                entry["unexpected_recompiles"] += graphs
                t["unexpected_recompiles"] += graphs
                log.warning("comfyui-tpu: %s recompiled unexpectedly (%d graphs, %.1f s)", shape.label(), graphs, seconds)
                self.status(f"warning: {shape.label()} recompiled unexpectedly ({graphs} graphs, {seconds:.1f} s)")

    def _snap(self, kwargs: dict) -> None:
        if not (self.plan.snap_to_warmup and self.plan.warmup):
            return
        w, h = kwargs["width"], kwargs["height"]
        sizes = sorted({(sw, sh) for sw, sh, _ in self.plan.warmup})
        if (w, h) in sizes:
            return
        sw, sh = min(sizes, key=lambda s: (abs(math.log(s[0] / s[1] * h / w)), abs(s[0] * s[1] - w * h)))
        kwargs["width"], kwargs["height"] = sw, sh
        self.status(f"snapped {w}x{h} to the warmed-up size {sw}x{sh}")

    def _fix_shapes(self, pipe, spec: PipelineSpec, kwargs: dict) -> Shape:
        params = inspect.signature(pipe.__call__).parameters
        variable = "prompt_embeds_mask" in params  # Qwen-Image: embeddings as long as the prompt
        text = 77  # CLIP-only pipelines (SDXL)
        if "max_sequence_length" in params:
            text = kwargs.setdefault("max_sequence_length", params["max_sequence_length"].default)
        if variable:
            text = self._pad_prompt(pipe, kwargs, text)
        cfg = spec.class_name in CFG_DOUBLES_BATCH and kwargs.get("guidance_scale", 0) > 1
        return Shape(kwargs["width"], kwargs["height"], kwargs.get("num_images_per_prompt", 1), cfg, text, variable)

    @staticmethod
    def _pad_prompt(pipe, kwargs: dict, max_len: int) -> int:
        """Encodes the prompt (and the negative one when true CFG is on) and pads both to one bucketed
        length with an attention mask, so the denoiser's text length does not follow the prompt."""
        import torch

        def encode(text):
            embeds, mask = pipe.encode_prompt(prompt=text, device=pipe._execution_device, max_sequence_length=max_len)
            if mask is None:
                mask = torch.ones(embeds.shape[:2], dtype=torch.long, device=embeds.device)
            return embeds, mask

        pos = encode(kwargs.pop("prompt"))
        negative = kwargs.pop("negative_prompt", None)
        neg = encode(negative) if negative is not None and kwargs.get("true_cfg_scale", 0) > 1 else None
        longest = max(e.shape[1] for e, _ in filter(None, (pos, neg)))
        # One spare token keeps the mask partial (an all-ones mask becomes None: another graph).
        length = min(max_len, -(-(longest + 1) // TEXT_BUCKET) * TEXT_BUCKET)

        def pad(embeds, mask):
            n = min(embeds.shape[1], length)
            out = embeds.new_zeros(embeds.shape[0], length, embeds.shape[2])
            out[:, :n] = embeds[:, :n]
            m = mask.new_zeros(mask.shape[0], length)
            m[:, :n] = mask[:, :n]
            return out, m

        kwargs["prompt_embeds"], kwargs["prompt_embeds_mask"] = pad(*pos)
        if neg is not None:
            kwargs["negative_prompt_embeds"], kwargs["negative_prompt_embeds_mask"] = pad(*neg)
        return length

    # ---- statistics
    def stats(self) -> dict:
        plan = self.plan
        return {
            "mode": self.mode,
            "note": self.note,
            "compiled": None if plan is None else {"component": self._component,
                                                   "target": plan.target, "backend": plan.backend,
                                                   "warmup": format_warmup(plan.warmup),
                                                   "snap_to_warmup": plan.snap_to_warmup},
            **self.totals,
            "shapes": list(self.shapes.values()),
            "cache": dict(CACHE_INFO),
        }
