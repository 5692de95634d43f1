"""torch.compile of the denoiser, the shapes it has compiled, and the compile statistics (worker side).

The controller resolves the compile plan (backend, target) into the pipeline description; the runtime owns
the execution mode and the warm-up loop; the cache folder lives in `compile_cache`. Here: compiling and
un-compiling the loaded pipeline's denoiser (no reload), knowing the shape signatures it has seen,
announcing a compile before it starts, and counting compiles and reuses from dynamo's own counters.

A shape signature is what makes a static-shape graph recompile: width, height, batch, a video's frames and its
sound's latents (LTX-2: frames / frame_rate seconds of them; the frame rate itself reaches the graph as a float,
which Dynamo does not specialize on), whether CFG doubles the denoiser's batch (SD3, SDXL, Z-Image), and the text
length. Text length is kept fixed: `max_sequence_length`
is passed explicitly (Sample's CONDITIONING arrives padded to the length that gives: controller/conditioning.py),
and Qwen-Image (whose prompt embeddings are as long as the prompt) gets its embeddings
padded, with an attention mask, to 128-token buckets. Z-Image's transformer pads the prompt itself (to 32 tokens,
without a mask to pad further with): its repeated blocks are compiled, and the padded lengths are the signature.
Qwen-Image 2.1's prompt cannot be padded without moving the image's rotary positions (`padded_text_exact`): it
runs at its own length, and each new length is a compile of its own, said as such. The denoisers are every one
the pipeline holds (spec.DENOISERS: Wan 2.2 A14B's two experts, Ideogram 4's two transformers), a modular
pipeline's among its components.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from ..protocol.errors import CompileError
from ..protocol.spec import DENOISERS, CompilePlan, PipelineSpec, WarmupSize
from . import modular
from .compile_cache import CACHE_INFO
from .parallel import pad_tokens

log = logging.getLogger("comfyui_tpu")

TEXT_BUCKET = 128  # Qwen-Image prompt embeddings are padded to a multiple of this
RECOMPILE_LIMIT = 64  # dynamo's default (8 graphs per function) would silently fall back to eager


@dataclass(frozen=True)
class Shape:
    """What makes a static-shape graph of the denoiser recompile."""

    width: int
    height: int
    batch: int
    cfg: bool  # CFG doubles the denoiser's batch (SD3, SDXL with guidance > 1, Z-Image above 0)
    text: int  # text tokens the denoiser sees
    variable_text: bool = False  # the pipeline's text length follows the prompt (Qwen-Image): show it
    negative_text: int = 0  # Z-Image under CFG: the negative prompt's padded length, when not the prompt's
    frames: int = 0  # a video's frames (each count is a shape of its own); 0: an image
    # the ControlNets whose residuals the denoiser takes (their number and depth are shapes; strength, start, end
    # and the control image are not)
    control: str = ""
    # the prompt reaches the denoiser at its own length, unpadded (Qwen-Image 2.1, where padding would move the
    # image's rotary positions; its edits, whose references are encoded with the prompt): each new length compiles
    follows_prompt: bool = False
    # a video the loaded text-to-video pipeline makes through another one (LTX-2's start image and image + audio,
    # whose denoiser sees a timestep per token), or in two stages (LTX-2's upscale: a half-size graph too): a
    # graph the text-to-video warm-up does not build, compiled once and announced ("": none of these)
    task: str = ""
    # the sound's latents beside the frames (LTX-2: frames / frame_rate seconds of them, so that another frame rate
    # can be another shape: `sound_latents`); 0: no sound, or one whose length the frames fix
    sound: int = 0

    def label(self) -> str:
        extra = (", CFG" if self.cfg else "") + (f", prompt ≤ {self.text} tokens" if self.variable_text else "")
        extra += f", {self.sound} audio latents" if self.sound else ""
        extra += f", {self.task}" if self.task else ""
        extra += f", ControlNet {self.control}" if self.control else ""
        extra += f", negative prompt ≤ {self.negative_text} tokens" if self.negative_text else ""
        extra += ", prompt at its own length" if self.follows_prompt else ""
        frames = f"x{self.frames} frames" if self.frames else ""
        return f"{self.width}x{self.height}{frames} (batch {self.batch}{extra})"


def _dynamo_counts() -> dict[str, float]:
    from torch._dynamo.utils import compilation_time_metrics, counters

    return {
        "graphs": counters["stats"]["unique_graphs"],
        "seconds": sum(compilation_time_metrics.get("_compile.compile_inner", ())),
        "disk_hits": counters["inductor"]["fxgraph_cache_hit"],
        "disk_misses": counters["inductor"]["fxgraph_cache_miss"],
    }


def denoiser(pipe) -> tuple[str, Any]:
    """The pipeline's denoiser: its transformer or UNet, else (a MiniMax H3 pipeline of its ref2va file alone) its
    `transformer_ref`."""
    for name in ("transformer", "unet", "transformer_ref"):
        module = getattr(pipe, name, None)
        if module is not None:
            return name, module
    raise CompileError(f"{type(pipe).__name__} has no transformer or UNet to compile.")


def named_experts(pipe) -> dict[str, Any]:
    """The denoiser, and the second model of a pipeline of two (spec.DENOISERS: Wan 2.2 A14B's `transformer_2`, low
    noise, which the pipeline switches to below its boundary; Ideogram 4's `unconditional_transformer`, run beside
    the conditional one every step), by component name: layouts, compiling, fp8 storage and step caching treat
    them alike."""
    name, first = denoiser(pipe)
    out = {name: first}
    for other in DENOISERS:
        module = getattr(pipe, other, None) if other != name else None
        if module is not None and module is not first:
            out[other] = module
    return out


def experts(pipe) -> tuple[Any, ...]:
    """The modules of `named_experts`, the denoiser first."""
    return tuple(named_experts(pipe).values())


def steps_for_every_expert(pipe, scheduler, steps: int) -> int:
    """The fewest steps, from `steps` up, whose schedule (`scheduler`'s) reaches every expert (a compile warm-up
    compiles what it runs): Wan 2.2 A14B's low-noise expert runs only on timesteps below boundary_ratio · 1000,
    which 2 steps at its flow shift of 12 never reach. `steps` for a model of one denoiser."""
    ratio = getattr(pipe.config, "boundary_ratio", None)
    if ratio is None or getattr(pipe, "transformer_2", None) is None:
        return steps
    boundary = ratio * scheduler.config.num_train_timesteps
    for n in range(steps, 1001):
        schedule = type(scheduler).from_config(scheduler.config)
        schedule.set_timesteps(n)
        if bool((schedule.timesteps < boundary).any()):
            return n
    return steps


def _contiguous_inputs(compiled: Callable[..., Any]) -> Callable[..., Any]:
    """A compiled block called with contiguous tensors: Z-Image hands its blocks views (rotary tables cut out of one
    table for prompt and image) whose strides follow the prompt's exact length, and a static graph guards on
    strides; a contiguous copy holds the same values, so the graph only sees the padded length."""
    import torch

    def dense(x: Any) -> Any:  # and at storage offset 0, which TorchTPU's backend guards too
        if torch.is_tensor(x) and not (x.is_contiguous() and x.storage_offset() == 0):
            return x.clone(memory_format=torch.contiguous_format)
        return x

    def call(*args: Any, **kwargs: Any) -> Any:
        return compiled(*map(dense, args), **{k: dense(v) for k, v in kwargs.items()})

    return call


def _float_timestep(call: Callable[..., Any]) -> Callable[..., Any]:
    """`call` with the timestep handed over as a float32 tensor of its own whatever the scheduler made it
    (DPM-Solver, UniPC, DDIM: int64; DPM++ SDE: float64; an expanded view or a copy), so that changing Sample's
    sampler never compiles another graph. Always a copy: SDXL's UNet gets `timesteps[i]` itself, a view at storage
    offset i, and TorchTPU's backend guards every input's storage offset ("tensor views with different storage
    offsets bake static slice indices into the compiled executable", _backend.py _guard_input_storage_offsets), so
    a view recompiled at every step (tests/test_tpu_modes.py). Exact: diffusers' timestep embeddings turn the
    timestep into float32 first (FLUX's turns it back into the latents' dtype, which it came from)."""
    import torch

    def as_float(t: Any) -> Any:
        return t.to(torch.float32, copy=True) if isinstance(t, torch.Tensor) else t

    def wrapped(*args, **kwargs):
        if "timestep" in kwargs:
            kwargs["timestep"] = as_float(kwargs["timestep"])
        elif len(args) > 1:  # the UNet: (sample, timestep, ...)
            args = (args[0], as_float(args[1]), *args[2:])
        return call(*args, **kwargs)

    return wrapped


def sound_latents(pipe: Any, spec: PipelineSpec, kwargs: dict) -> int:
    """The sound's latents LTX-2's denoiser sees for this call: frames / frame_rate seconds of them, counted as
    diffusers' LTX-2 pipelines count them (image + audio's given sound is cut to that length by the controller:
    controller/sound_input.py); 0 for a model that takes no frame rate."""
    arg = spec.family.frame_rate_arg
    if not (arg and kwargs.get("num_frames")):
        return 0
    per_second = pipe.audio_sampling_rate / pipe.audio_hop_length / float(pipe.audio_vae_temporal_compression_ratio)
    return round(kwargs["num_frames"] / kwargs[arg] * per_second)


def _default(pipe: Any, spec: PipelineSpec, name: str) -> Any:
    """The default of the call's argument `name`: its `__call__` signature's, or a modular pipeline's block input's."""
    if spec.family.modular is None:
        return inspect.signature(pipe.__call__).parameters[name].default
    return next(i.default for i in pipe.blocks.inputs if i.name == name)


class Call:
    """One pipeline call under way: which shape it compiles, if it compiles one."""

    def __init__(self, compiling: str | None = None):
        self.compiling = compiling

    def stop_note(self) -> str:
        return (f"stopped right after compiling {self.compiling} (a compile cannot be interrupted midway); it is "
                "kept, so the next run at this size starts at once")


class Compiler:
    """One per worker: the compile state of the loaded pipeline's denoiser, and its statistics."""

    def __init__(self, status: Callable[[str], None]):
        self.status = status
        self.modules: tuple[Any, ...] = ()  # the compiled denoiser (and its second expert: `experts`)
        self._component: str | None = None  # "model/transformer (dtype, target, backend)", for the statistics
        self.applied: tuple | None = None  # (target, backend, model, dtype) it was compiled with
        self.plan: CompilePlan | None = None
        self.seen: set[Shape] = set()  # signatures compiled for the current module and plan
        self.warmed: set[WarmupSize] = set()
        self.shapes: dict[str, dict] = {}  # statistics per model, plan and shape (kept across plan changes)
        self.totals = {"compiles": 0, "hits": 0, "compile_s": 0.0, "graphs": 0, "unexpected_recompiles": 0,
                       "disk_hits": 0, "disk_misses": 0}

    def apply(self, pipe: Any, spec: PipelineSpec, dtype_name: str) -> list[WarmupSize]:
        """Compiles (or un-compiles) the denoiser of `pipe` (both experts of a pair) for the spec's plan, without
        reloading anything; returns the warm-up shapes not compiled yet (the runtime runs them and calls
        `warmed_up`)."""
        plan = spec.compile_plan()
        name, named = denoiser(pipe)[0], named_experts(pipe)
        modules = tuple(named.values())
        want = None if plan is None else (plan.target, plan.backend, spec.model_path, spec.dtype)
        if modules != self.modules or want != self.applied:
            self._uncompile()
            if plan is not None:
                for note in plan.notes:
                    self.status(note)
                for expert, module in named.items():
                    self._compile(expert, module, plan, spec.class_name, contiguous=bool(spec.family.prompt_step))
                self.modules = modules
            self.applied, self.seen, self.warmed = want, set(), set()
        self.plan = plan
        if plan is None:
            return []
        self._component = f"{spec.name}/{name} ({dtype_name}, {plan.target}, {plan.backend})"
        return [s for s in plan.warmup if s not in self.warmed]

    def warmed_up(self, shape: WarmupSize) -> None:
        self.warmed.add(shape)

    def _compile(self, name: str, module: Any, plan: CompilePlan, class_name: str, contiguous: bool = False) -> None:
        import torch

        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        if hasattr(logging.Logger, "warning_once"):  # transformers' patch, which diffusers' hooks call
            # diffusers' context-parallel hooks warn once, inside the graph, where they leave an input the plan
            # does not fit whole (LTX-2's [batch] timestep): a log call Dynamo cannot trace in one graph
            torch._dynamo.config.ignore_logging_functions.add(logging.Logger.warning_once)
        options = {"fullgraph": True, "dynamic": False, "backend": plan.backend}
        if plan.target == "whole denoiser":
            module.compile(**options)
            module._compiled_call_impl = _float_timestep(module._compiled_call_impl)
        else:
            if not getattr(module, "_repeated_blocks", None):
                raise CompileError(f"target: the {name} of {class_name} has no repeated blocks to compile. "
                                   "Choose target 'whole denoiser' (with offload 'none').")
            module.compile_repeated_blocks(**options)
            if contiguous:
                for block in module.modules():
                    if getattr(block, "_compiled_call_impl", None) is not None:
                        block._compiled_call_impl = _contiguous_inputs(block._compiled_call_impl)
        self.status(f"{name} set to compile with {plan.backend} ({plan.target}); each new shape compiles once")

    def _uncompile(self) -> None:
        if not self.modules:
            return
        import torch

        for module in self.modules:
            for m in module.modules():
                if getattr(m, "_compiled_call_impl", None) is not None:
                    m._compiled_call_impl = None  # what nn.Module.compile() set: back to eager
        self.modules = ()
        torch._dynamo.reset()

    def forget(self) -> None:
        """The pipeline is being unloaded: drop every reference to it."""
        self._uncompile()
        self.applied, self.plan, self.seen, self.warmed = None, None, set(), set()

    # ---- around one pipeline call
    @contextlib.contextmanager
    def sampling(self, pipe: Any, spec: PipelineSpec, kwargs: dict, two_stages: bool = False) -> Iterator[Call]:
        """Wraps one pipeline call (`two_stages`: LTX-2's upscale, two calls of `pipe`): fixes shapes (text length,
        optional snapping), announces a first compile, then counts it (or the hit) from dynamo's counters. Edits
        `kwargs` in place."""
        if self.plan is None:
            yield Call()
            return
        self._snap(kwargs)
        shape = self._fix_shapes(pipe, spec, kwargs)
        via = {spec.family.start_image_via: "start image", spec.family.audio_via: "image + audio"}
        task = ", ".join(t for t in (via.get(type(pipe).__name__, "") if spec.family.frame_step else "",
                                     "two stages" if two_stages else "") if t)
        shape = replace(shape, task=task, sound=sound_latents(pipe, spec, kwargs))
        new = shape not in self.seen
        key = f"{self._component} {shape.label()}"
        entry = self.shapes.setdefault(key, {"component": self._component, "shape": shape.label(), "compiles": 0,
                                             "hits": 0, "compile_s": 0.0, "first_call_s": None, "graphs": 0,
                                             "unexpected_recompiles": 0, "from_disk": False})
        if new:
            self.status(f"compiling {shape.label()} for the first time…")
        before, started, ended = _dynamo_counts(), time.perf_counter(), False
        try:
            yield Call(shape.label() if new else None)
            ended = True
        finally:
            delta = {k: v - before[k] for k, v in _dynamo_counts().items()}
            self._record(shape, new, entry, delta, time.perf_counter() - started, ended)

    def _record(self, shape: Shape, new: bool, entry: dict, delta: dict, call_s: float, ended: bool = True) -> None:
        graphs, seconds = int(delta["graphs"]), round(delta["seconds"], 3)
        t = self.totals
        t["graphs"] += graphs
        t["disk_hits"] += int(delta["disk_hits"])
        t["disk_misses"] += int(delta["disk_misses"])
        if new and not graphs and ended:  # its graphs were built already (a two-stage call's sizes both warmed up)
            self.seen.add(shape)
            new = False
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
        elif graphs and shape.follows_prompt:  # a prompt of another length: a compile of its own, not a surprise
            entry["compiles"] += 1
            entry["graphs"] += graphs
            t["compiles"] += 1
            t["compile_s"] = round(t["compile_s"] + seconds, 3)
            self.status(f"compiled {shape.label()} again for a prompt of another length in {seconds:.1f} s")
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
        sizes = sorted({(sw, sh) for sw, sh, *_ in self.plan.warmup})
        if (w, h) in sizes:
            return
        sw, sh = min(sizes, key=lambda s: (abs(math.log(s[0] / s[1] * h / w)), abs(s[0] * s[1] - w * h)))
        kwargs["width"], kwargs["height"] = sw, sh
        self.status(f"snapped {w}x{h} to the warmed-up size {sw}x{sh}")

    def _fix_shapes(self, pipe, spec: PipelineSpec, kwargs: dict) -> Shape:
        params = modular.parameters(pipe, spec.family)
        # the family's text length follows the prompt (Qwen-Image, Qwen-Image 2.1: embeddings as long as the prompt;
        # Z-Image pads inside its transformer instead: prompt_step)
        variable = spec.family.variable_text and not spec.family.prompt_step
        text = 77  # CLIP-only pipelines (SDXL)
        if "max_sequence_length" in params:
            text = kwargs.setdefault("max_sequence_length", _default(pipe, spec, "max_sequence_length"))
        if "prompt_embeds" in kwargs:  # Sample's CONDITIONING, padded by the controller
            text = kwargs["prompt_embeds"].shape[1]
        follows = (variable and "prompt_embeds" not in kwargs
                   and ("image" in kwargs or not spec.family.padded_text_exact))
        if variable and not follows and "prompt_embeds" not in kwargs:
            text = self._pad_prompt(pipe, kwargs, text, spec.cp_degree)
        elif follows:
            text = 0
        cfg = spec.family.cfg_doubles_batch and kwargs.get("guidance_scale", 0) > spec.family.cfg_above
        negative = 0
        if spec.family.prompt_step:
            text, negative = self._prompt_steps(pipe, kwargs, spec.family.prompt_step, cfg, text)
        batch = kwargs.get("num_images_per_prompt", kwargs.get("num_videos_per_prompt", 1))
        return Shape(kwargs["width"], kwargs["height"], batch, cfg, text,
                     (variable and not follows) or bool(spec.family.prompt_step), negative, kwargs.get("num_frames", 0),
                     " + ".join(c.name for c in spec.controlnets), follows)

    @staticmethod
    def _prompt_steps(pipe, kwargs: dict, step: int, cfg: bool, max_len: int) -> tuple[int, int]:
        """Z-Image: its blocks see the prompt padded to a multiple of `step` (and, under CFG, the negative one;
        different lengths add a mask). Encodes them as the pipeline would (the prompt cache serves the call),
        hands the embeddings to the call, and returns the two padded lengths (the negative's: 0 when the same)."""
        pos, neg = pipe.encode_prompt(prompt=kwargs.pop("prompt"), device=pipe._execution_device,
                                      do_classifier_free_guidance=cfg, negative_prompt=kwargs.pop("negative_prompt", None),
                                      max_sequence_length=max_len)
        kwargs["prompt_embeds"] = pos
        if cfg:
            kwargs["negative_prompt_embeds"] = neg

        def padded(embeds: list) -> int:
            return -(-max(len(e) for e in embeds) // step) * step

        text = padded(pos)
        negative = padded(neg) if cfg else 0
        return text, 0 if negative == text else negative

    @staticmethod
    def _pad_prompt(pipe, kwargs: dict, max_len: int, degree: int = 1) -> int:
        """Encodes the prompt (and the negative one when true CFG is on) and pads both to one bucketed
        length with an attention mask, so the denoiser's text length does not follow the prompt. Under Context
        Parallel the bucket is also a multiple of the degree (its ranks split the text evenly)."""
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
        bucket = math.lcm(TEXT_BUCKET, degree)
        length = min(max_len - max_len % degree, -(-(longest + 1) // bucket) * bucket)
        kwargs["prompt_embeds"], kwargs["prompt_embeds_mask"] = pad_tokens(*pos, length)
        if neg is not None:
            kwargs["negative_prompt_embeds"], kwargs["negative_prompt_embeds_mask"] = pad_tokens(*neg, length)
        return length

    # ---- statistics
    def stats(self) -> dict:
        plan = self.plan
        return {
            "compiled": None if plan is None else {"component": self._component,
                                                   "target": plan.target, "backend": plan.backend,
                                                   "warmup": plan.warmup_text(),
                                                   "snap_to_warmup": plan.snap_to_warmup},
            **self.totals,
            "shapes": list(self.shapes.values()),
            "cache": dict(CACHE_INFO),
        }
