"""Compile plans: the warm-up sizes a Compile node lists, the torch.compile backend for a device, and a plan
resolved for its pipeline (target adjusted for offload, the adjustments said in its notes). Controller side.
"""

from __future__ import annotations

import re
from dataclasses import replace

from ..families import Pipeline
from ..protocol.errors import CompileError
from ..protocol.spec import (
    COMPILE_BACKENDS,
    COMPILE_TARGETS,
    DEFAULT_FRAME_RATE,
    CompilePlan,
    PipelineSpec,
    WarmupSize,
)
from . import pixels
from .cp_sizes import MAX_FRAME_RATE

MAX_WARMUP_BATCH = 64
_SIZE = re.compile(r"^(\d+)\s*[x×*]\s*(\d+)(?:\s*[x×*]\s*(\d+)\s*f)?(?:\s*[x×*]\s*(\d+))?"
                   r"(?:\s*@\s*(\d+(?:\.\d+)?)\s*(?:fps)?)?$")


def parse_warmup(text: str) -> tuple[WarmupSize, ...]:
    """'1024x1024, 832x1216x2, 832x480x81f, 768x512x121f@25fps' → (1024, 1024, 1, 0, 0), (832, 1216, 2, 0, 0),
    (832, 480, 1, 81, 0), (768, 512, 1, 121, 25.0): WIDTHxHEIGHT[xFRAMESf][xBATCH][@RATEfps] (frames: videos; the
    frame rate: a video with sound that takes one, `frame_rates`), comma separated."""
    shapes: list[WarmupSize] = []
    for part in re.split(r"[,;\n]+", text or ""):
        part = part.strip().lower()
        if not part:
            continue
        m = _SIZE.match(part)
        if not m:
            raise CompileError(f"warmup: '{part}' is not a size. Write WIDTHxHEIGHT with an optional xBATCH, "
                               "separated by commas, e.g. '1024x1024, 832x1216x2', and for videos the frames as "
                               "xFRAMESf, e.g. '832x480x81f', with LTX-2's frame rate after them as @RATEfps, "
                               "e.g. '768x512x121f@25fps' (or leave it empty).")
        w, h, f, b, rate = int(m[1]), int(m[2]), int(m[3] or 0), int(m[4] or 1), float(m[5] or 0)
        if not 1 <= b <= MAX_WARMUP_BATCH:
            raise CompileError(f"warmup: batch {b} in '{part}' is out of range; use 1 to {MAX_WARMUP_BATCH}.")
        if m[3] is not None and f < 1:
            raise CompileError(f"warmup: {f} frames in '{part}' is too few; a video has at least 1.")
        if m[5] is not None and not f:
            raise CompileError(f"warmup: '{part}' names a frame rate but no frames; a frame rate is a video's: "
                               f"write the frames before it, e.g. '{w}x{h}x121f@{rate:g}fps'.")
        if m[5] is not None and not 1 <= rate <= MAX_FRAME_RATE:
            raise CompileError(f"warmup: {rate:g} fps in '{part}' is out of range; Sample Video's frame_rate "
                               f"takes 1 to {MAX_FRAME_RATE:g}.")
        if (size := WarmupSize(w, h, b, f, rate)) not in shapes:
            shapes.append(size)
    return tuple(shapes)


def frame_rates(family: Pipeline, shapes: tuple[WarmupSize, ...]) -> tuple[WarmupSize, ...]:
    """`shapes` at the frame rate each warm-up runs: for a model that takes Sample Video's frame_rate (LTX-2, whose
    sound has frames / frame_rate seconds of latents, a graph of its own), the one named, else Sample Video's
    default; a frame rate named for any other model is refused (it has none to set)."""
    out: list[WarmupSize] = []
    for size in shapes:
        if size.frame_rate and not family.frame_rate_arg:
            raise CompileError(f"warmup: '{size.text()}' names a frame rate, and {family.name} takes none (Sample "
                               "Video's frame_rate is ignored for it): only a model whose sound lasts frames / "
                               "frame_rate seconds (LTX-2) compiles a shape per frame rate. Remove "
                               f"'@{size.frame_rate:g}fps': write '{size._replace(frame_rate=0.0).text()}'.")
        if family.frame_rate_arg and size.frames and not size.frame_rate:
            size = size._replace(frame_rate=DEFAULT_FRAME_RATE)
        if size not in out:
            out.append(size)
    return tuple(out)


def compile_backend(kind: str, choice: str) -> str:
    """torch.compile backend for a device kind: auto = TorchTPU's "tpu" on TPU, inductor on CUDA/CPU."""
    if choice not in COMPILE_BACKENDS:
        raise CompileError(f"backend: '{choice}' is not one of {', '.join(COMPILE_BACKENDS)}.")
    if choice == "auto":
        return "tpu" if kind == "tpu" else "inductor"
    if choice == "tpu" and kind != "tpu":
        raise CompileError(f"backend: 'tpu' compiles for TPU chips only, and this pipeline runs on {kind}. "
                           "Choose 'auto' (inductor here).")
    if choice == "inductor" and kind == "tpu":
        raise CompileError("backend: 'inductor' cannot compile for TPU tensors. Choose 'auto' (TorchTPU's 'tpu').")
    return choice


def resolve_compile(spec: PipelineSpec) -> PipelineSpec:
    """`spec` with its compile plan resolved for its device (backend chosen, target adjusted for offload, the
    adjustments said in the plan's notes, the video warm-ups whose VAE decodes in tiles); unchanged unless its mode
    is 'compiled'. Idempotent."""
    if spec.mode != "compiled":
        return spec
    if spec.family.compile_refused:
        raise CompileError(f"mode: 'compiled' cannot run {spec.family.name}: {spec.family.compile_refused}. Use strict "
                           "eager (or defer-and-fuse eager on a TPU).")
    plan = spec.compile or CompilePlan()
    if plan.target not in COMPILE_TARGETS:
        raise CompileError(f"target: '{plan.target}' is not one of {', '.join(COMPILE_TARGETS)}.")
    backend = compile_backend(spec.kind, plan.backend)
    if spec.offload == "sequential":
        raise CompileError("offload: 'sequential' moves weights layer by layer inside the denoiser's blocks, which "
                           "torch.compile cannot trace. Use offload 'model' (its repeated blocks are compiled) "
                           "or 'none', or use an eager mode.")
    notes, target = list(plan.notes), plan.target
    if spec.offload == "model" and target == "whole denoiser":
        target = "repeated blocks"
        notes.append("offload 'model' wraps the whole denoiser in hooks that torch.compile cannot trace: "
                     "compiling its repeated blocks instead.")
    step = spec.family.prompt_step
    if step and target == "whole denoiser":
        target = "repeated blocks"
        notes.append(f"{spec.family.name}'s transformer takes the prompt at its own length and pads it to a multiple "
                     f"of {step} tokens inside: compiled whole, every prompt length would compile again. Compiling "
                     f"its repeated blocks instead (they see the padded length: one compile per {step}-token step "
                     "of the prompt).")
    untraceable = spec.family.whole_denoiser_untraceable
    if untraceable and target == "whole denoiser":
        target = "repeated blocks"
        notes.append(f"{spec.family.name}'s transformer cannot be compiled whole: {untraceable}. Compiling its "
                     "repeated blocks instead.")
    if target == "repeated blocks" and not spec.family.repeated_blocks:
        why = " (forced by offload 'model'; set offload to 'none')" if plan.target != target else ""
        raise CompileError(f"target: SD3's transformer has no repeated blocks to compile{why}. "
                           "Choose target 'whole denoiser'.")
    tiled = tuple(size for size in plan.warmup
                  if size.frames and pixels.video_tiling(spec, size.width, size.height, size.frames))
    return spec.with_changes(compile=replace(plan, target=target, backend=backend, notes=tuple(notes),
                                             tiled_vae=tiled))
