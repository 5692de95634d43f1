"""Compile plans: the warm-up sizes a Compile node lists, the torch.compile backend for a device, and a plan
resolved for its pipeline (target adjusted for offload, the adjustments said in its notes). Controller side.
"""

from __future__ import annotations

import re
from dataclasses import replace

from ..protocol.errors import CompileError
from ..protocol.spec import COMPILE_BACKENDS, COMPILE_TARGETS, CompilePlan, PipelineSpec
from . import pixels

MAX_WARMUP_BATCH = 64
_SIZE = re.compile(r"^(\d+)\s*[x×*]\s*(\d+)(?:\s*[x×*]\s*(\d+)\s*f)?(?:\s*[x×*]\s*(\d+))?$")


def parse_warmup(text: str) -> tuple[tuple[int, int, int, int], ...]:
    """'1024x1024, 832x1216x2, 832x480x81f' → ((1024, 1024, 1, 0), (832, 1216, 2, 0), (832, 480, 1, 81)):
    WIDTHxHEIGHT[xFRAMESf][xBATCH] (frames: videos), comma separated."""
    shapes: list[tuple[int, int, int, int]] = []
    for part in re.split(r"[,;\n]+", text or ""):
        part = part.strip().lower()
        if not part:
            continue
        m = _SIZE.match(part)
        if not m:
            raise CompileError(f"warmup: '{part}' is not a size. Write WIDTHxHEIGHT with an optional xBATCH, "
                               "separated by commas, e.g. '1024x1024, 832x1216x2', and for videos the frames as "
                               "xFRAMESf, e.g. '832x480x81f' (or leave it empty).")
        w, h, f, b = int(m[1]), int(m[2]), int(m[3] or 0), int(m[4] or 1)
        if not 1 <= b <= MAX_WARMUP_BATCH:
            raise CompileError(f"warmup: batch {b} in '{part}' is out of range; use 1 to {MAX_WARMUP_BATCH}.")
        if m[3] is not None and f < 1:
            raise CompileError(f"warmup: {f} frames in '{part}' is too few; a video has at least 1.")
        if (w, h, b, f) not in shapes:
            shapes.append((w, h, b, f))
    return tuple(shapes)


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
    tiled = tuple(size for size in plan.warmup if size[3] and pixels.video_tiling(spec, size[0], size[1], size[3]))
    return spec.with_changes(compile=replace(plan, target=target, backend=backend, notes=tuple(notes),
                                             tiled_vae=tiled))
