"""What the nodes (and scripts, tests, benchmarks) call. Describes and checks pipelines, then hands the work to
the worker group. Each node checks its own inputs when it runs (the loaders their model and files, the plan
nodes their layout); before a request goes to the workers, `resolve` checks the whole description once more
(specs built by scripts pass the same checks), once per request. Every check raises an InputError
(`protocol.errors`) that names the input, the value and the fix.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..families.text_encoders import TOKENIZER_LAYOUTS
from ..protocol import samplers, settings
from ..protocol.errors import CompileError, ModelError, OptionError, SampleError, TPUError, WorkerCrashed
from ..protocol.messages import Status, Step
from ..protocol.spec import (
    DTYPE_CHOICES,
    MODE_CHOICES,
    OFFLOAD_CHOICES,
    WARMUP_STEPS,
    CompilePlan,
    GroupConfig,
    PipelineSpec,
    SampleRequest,
    mode_note,
)
from ..protocol.units import format_bytes
from . import (
    capacity,
    compile_plan,
    conditioning,
    controlnets,
    devices,
    group,
    hosts,
    images,
    latency,
    latents,
    layouts,
    loras,
    models,
    offload,
    pixels,
    prompt_weights,
    redux,
    resolve,
    storage,
)
from . import warm_start as warm
from .files import assemble, listing
from .sampling_options import plan_sampling

ProgressFn = Callable[[Status | Step], None]
MAX_IMAGES = 4096  # images in one Sample (prompt lines × batch_size)

log = logging.getLogger("comfyui_tpu")
atexit.register(group.shutdown)


def _check_choices(dtype: str, device_choice: str, offload: str) -> str:
    """The user's dtype, device and offload checked; the device kind they resolve to."""
    if dtype not in DTYPE_CHOICES:
        raise OptionError(f"dtype: '{dtype}' is not one of {', '.join(DTYPE_CHOICES)}.")
    if offload not in OFFLOAD_CHOICES:
        raise OptionError(f"offload: '{offload}' is not one of {', '.join(OFFLOAD_CHOICES)}.")
    kind = devices.resolve_kind(device_choice)
    if dtype == "float16" and kind == "tpu":
        raise OptionError("dtype: float16 is not a good fit for TPUs; choose 'auto' (bfloat16) instead.")
    return kind


def make_spec(model: str, roots: Iterable[str], dtype: str = "auto", device_choice: str = "auto",
              offload: str = "none", allow_pickle: bool = False) -> PipelineSpec:
    """Checks the user's choices and the model folder (no weights read) and describes the pipeline."""
    kind = _check_choices(dtype, device_choice, offload)
    path = models.resolve_model_path(model, roots)
    info = models.inspect_model(path, allow_pickle=allow_pickle)
    return storage.resolve_storage(PipelineSpec(
        model_path=info.path, class_name=info.class_name, size_factor=info.size_factor, dtype=dtype,
        device=device_choice, offload=offload, kind=kind, variant=info.variant))


def make_file_spec(choice: assemble.FileChoice, roots: Mapping[str, Iterable[str]], dtype: str = "auto",
                   device_choice: str = "auto", offload: str = "none") -> PipelineSpec:
    """Checks the user's choices and the chosen files (their headers; no weights read) and describes the
    pipeline they make. `roots`: ComfyUI's folders per role (listing.ROLE_FOLDERS)."""
    kind = _check_choices(dtype, device_choice, offload)
    class_name, main, source = assemble.describe_files(choice, roots)
    if kind == "tpu" and any(c.quant == "gguf" for c in source.components):
        gguf = next(c for c in source.components if c.quant == "gguf")
        raise ModelError(f"diffusion_model: '{Path(gguf.path).name}' is a GGUF file; diffusers computes GGUF "
                         "weights with CUDA or CPU kernels, which TorchTPU does not have. On a TPU use the "
                         ".safetensors version (bf16, fp16 or fp8: fp8 is upcast on load).")
    spec = PipelineSpec(model_path=main, class_name=class_name, size_factor=0, dtype=dtype, device=device_choice,
                        offload=offload, kind=kind, source=source)
    factor = models.vae_scale(spec.component_config("vae")) * spec.family.size_multiple_of_vae
    return storage.resolve_storage(spec.with_changes(size_factor=factor))


def describe_files(spec: PipelineSpec) -> str:
    """What a pipeline made of files is and where each part comes from, for the text next to the loader."""
    lines = [f"{spec.family.name} ({spec.class_name})"]
    for part in spec.source.components if spec.source else ():
        if part.layout in (*TOKENIZER_LAYOUTS, "checkpoint"):
            continue
        how = {"scaled-fp8": ", scaled fp8: dequantized on load", "gguf": ", GGUF"}.get(part.quant, "")
        inside = " (in the checkpoint)" if part.prefix and part.name not in ("transformer", "unet") else ""
        lines.append(f"{part.name}: {Path(part.path).name}{inside}{how}")
    if kept := storage.describe(spec):
        lines.append(kept)
    if spec.offload == "auto":  # as next to Load TPU Pipeline: what auto chose and why
        lines.append(offload.choose_offload(spec).reason)
    return "\n".join([*lines, *(spec.source.notes if spec.source else ())])


def checked(spec: PipelineSpec) -> PipelineSpec:
    """`spec` ready to run, resolved and checked in one trip (controller/resolve.py)."""
    return resolve.resolve(spec)


def describe_pipeline(spec: PipelineSpec) -> str:
    """What Load TPU Pipeline says next to itself: where the pipeline runs, the layout it gets by default, and
    what offload 'auto' chose and why."""
    if spec.kind == "tpu":
        host = devices.tpu_host()
        lines = [f"{spec.name} ({spec.family.name}) on {host.describe()}, "
                 f"{format_bytes(host.hbm_bytes_per_device)} per device"]
        if note := devices.v7x_default_note(host):
            lines.append(note)
    elif spec.kind == "cuda":
        n = devices.cuda_count()
        lines = [f"{spec.name} ({spec.family.name}) on CUDA ({n} GPU{'s' if n != 1 else ''})"]
    else:
        lines = [f"{spec.name} ({spec.family.name}) on the CPU"]
    if kept := storage.describe(spec):
        lines.append(kept)
    if spec.offload == "auto":
        lines.append(offload.choose_offload(spec).reason)
    return "\n".join(lines)


def check_request(spec: PipelineSpec, req: SampleRequest) -> None:
    """Rejects a sample request before any worker sees it, naming the input and the fix."""
    for f in dataclasses.fields(req):
        value = getattr(req, f.name)
        if isinstance(value, float) and not math.isfinite(value):  # the API accepts NaN and inf; nodes would not
            raise SampleError(f"{f.name}: {value} is not a number the pipeline can use; give a finite value "
                              f"(e.g. {getattr(SampleRequest, f.name)}).")
    models.check_size(models.info_of(spec), req.width, req.height)
    models.check_frames(spec.family, req.frames, spec.component_config("transformer"))
    pixels.check(spec, req.width, req.height, req.batch_size)
    pixels.check_output(spec, req.width, req.height, len(req.images()), req.frames)
    layouts.check_cp_size(spec, req.width, req.height, req.frames)
    if req.steps < 1:
        raise SampleError(f"steps: {req.steps} is too small; use at least 1.")
    if req.batch_size < 1:
        raise SampleError(f"batch_size: {req.batch_size} is too small; use at least 1.")
    if not req.prompt.strip():
        raise SampleError("prompt: the prompt is empty; describe the image you want.")
    if (count := len(req.images())) > MAX_IMAGES:
        lines = len(req.prompts())
        if lines > 1:
            raise SampleError(f"prompt: {lines} prompt lines × batch_size {req.batch_size} = {count} images in one "
                              f"run is too many; use at most {MAX_IMAGES} (fewer lines, or a smaller batch_size).")
        raise SampleError(f"batch_size: {count} images in one run is too many; use at most {MAX_IMAGES}.")
    if not 0 <= req.seed < 2**64:
        raise SampleError(f"seed: {req.seed} is out of range; use 0 to 2^64-1.")


def group_config(spec: PipelineSpec) -> GroupConfig:
    """The group `spec` runs on: this host's chips, or (a group larger than one host) the joined hosts too."""
    across = capacity.span(spec.kind)
    if across is None or spec.world_size <= across.per_host:
        return GroupConfig(kind=spec.kind, world_size=spec.world_size)
    others = hosts.sharing_hosts(hosts.registry(), spec.kind, across.per_host)
    share = tuple(h.address for h in others[: spec.world_size // across.per_host - 1])
    return GroupConfig(kind=spec.kind, world_size=spec.world_size, hosts=share, per_host=across.per_host)


def load(spec: PipelineSpec, on_progress: ProgressFn | None = None,
         should_interrupt: Callable[[], bool] | None = None) -> dict:
    """Makes sure the pipeline is loaded and warm in the workers (warm-up shapes compiled); returns rank 0's info."""
    spec = checked(spec)
    results = group.run(group_config(spec), lambda g: g.load(spec, on_progress, should_interrupt),
                        _status_adapter(on_progress), should_interrupt)
    return results[0].value


@dataclass(frozen=True)
class PreparedSample:
    """One Sample, resolved and checked once: the ready spec, the request, the input images as the workers take
    them (copied once), and what will happen to them, for the node's text."""

    spec: PipelineSpec
    req: SampleRequest
    arrays: dict[str, np.ndarray]
    notes: tuple[str, ...]


def latent_input(spec: PipelineSpec, samples: np.ndarray, noise_mask: bool = False) -> tuple[np.ndarray, int, int, int]:
    """A LATENT's samples (numpy) checked against the model, as the workers take them; and the width, height and
    batch it sets (raising an InputError naming the input)."""
    latent = latents.as_array(spec, samples, noise_mask)
    return (latent, *latents.size(spec, latent))


def prepare_sample(spec: PipelineSpec, req: SampleRequest, image: np.ndarray | None = None,
                   mask: np.ndarray | None = None, latent: np.ndarray | None = None,
                   asked: tuple[int, int, int] | None = None, positive: Sequence | None = None,
                   negative: Sequence | None = None) -> PreparedSample:
    """Resolves `spec` and checks the request and Sample's image, latent and CONDITIONING inputs (raising an
    InputError naming the input), once: the node shows the notes, then `run_sample` runs exactly this.

    `image` (IMAGE [B, H, W, C] in 0..1) starts image-to-image, or gives reference images to the families that
    take them; with `mask` (MASK [B, H, W], 1 = repaint) it inpaints. `latent` (from `latent_input`, whose size
    and batch `req` has) starts from a LATENT instead; `asked`: the node's own width, height and batch_size.
    `positive` / `negative`: ComfyUI's CONDITIONING (tensors as numpy arrays) replacing the prompt text
    (controller/conditioning.py)."""
    spec = checked(spec)
    conditioned = conditioning.apply(spec, req, positive, negative)
    if conditioned is not None:
        req = conditioned.req
    check_request(spec, req)
    arrays = images.as_arrays(spec, req, image, mask)
    if latent is None:
        notes, starts = images.describe(spec, req, arrays), images.starts_from_image(spec, arrays)
        controlnets.check_inputs(spec, starts, "mask" in arrays, req.denoise)
    else:
        latents.check(spec, req, image is not None)
        arrays["latent"] = latent
        notes = latents.describe(spec, req, latent, asked or (req.width, req.height, req.batch_size))
        starts = req.denoise < 1
    if tiling := pixels.video_tiling(spec, req.width, req.height):
        req = dataclasses.replace(req, tiled_vae=True)
    said = [samplers.check(spec, req, starts), prompt_weights.note(req), tiling]
    arrays.update(controlnets.arrays(spec))
    arrays.update(redux.arrays(spec))
    if conditioned is not None:
        arrays, notes = {**arrays, **conditioned.arrays}, [*conditioned.notes, *notes]
    return PreparedSample(spec, req, arrays, tuple(notes + [text for text in said if text]))


def run_sample(prepared: PreparedSample, on_progress: ProgressFn | None = None,
               should_interrupt: Callable[[], bool] | None = None) -> np.ndarray:
    """Images [B, H, W, C] float32 in 0..1 for a prepared Sample (loading the pipeline first if needed); a video
    pipeline's frames, one video after another [B·F, H, W, C]. Where the time went is kept for `last_latency`."""
    return run_sample_outputs(prepared, on_progress, should_interrupt)["images"]


def run_sample_outputs(prepared: PreparedSample, on_progress: ProgressFn | None = None,
                       should_interrupt: Callable[[], bool] | None = None) -> dict[str, np.ndarray]:
    """What the request's `outputs` asks, by name: "images" (as `run_sample` gives them) and "latents" (ComfyUI's
    LATENT samples [B, C, h, w], [B, C, 1, h, w] for Qwen-Image: what the pipeline hands its VAE to decode)."""
    t0 = time.perf_counter()
    spec, req = prepared.spec, prepared.req
    progress = _group_progress(spec, req, on_progress)
    before = group.current_group()
    results = group.run(group_config(spec),
                        lambda g: g.sample(spec, req, progress, should_interrupt, prepared.arrays),
                        _status_adapter(on_progress), should_interrupt)
    received = time.time()
    # Each replica's first rank sends its slice; rank order is image order.
    out = {}
    for name in ("images", "latents"):
        parts = [r.arrays[name] for r in results if name in r.arrays]
        if parts:
            out[name] = parts[0] if len(parts) == 1 else np.concatenate(parts)
    now = group.current_group()
    started = now.start_s if now is not None and now is not before else 0.0
    latency.record(results, started, received, time.perf_counter() - t0)
    return out


def sample(spec: PipelineSpec, req: SampleRequest, on_progress: ProgressFn | None = None,
           should_interrupt: Callable[[], bool] | None = None, image: np.ndarray | None = None,
           mask: np.ndarray | None = None, positive: Sequence | None = None,
           negative: Sequence | None = None) -> np.ndarray:
    """`prepare_sample` then `run_sample`: one call for scripts, tests and benchmarks."""
    return run_sample(prepare_sample(spec, req, image, mask, positive=positive, negative=negative), on_progress,
                      should_interrupt)


def decode(spec: PipelineSpec, samples: np.ndarray, on_progress: ProgressFn | None = None,
           should_interrupt: Callable[[], bool] | None = None) -> np.ndarray:
    """VAE Decode (TPU): a LATENT (numpy) decoded by the pipeline's own VAE on the workers (loading it first if
    needed), as its Sample decodes; images [B, H, W, C] float32 in 0..1."""
    spec = checked(spec)
    latent = latents.decode_input(spec, samples)
    results = group.run(group_config(spec), lambda g: g.decode(spec, {"latent": latent}, on_progress,
                                                                 should_interrupt),
                        _status_adapter(on_progress), should_interrupt)
    return results[0].arrays["images"]


def record_queue_wait(seconds: float) -> None:
    """The node's share of the last Sample's report: how long the prompt waited in ComfyUI's queue (and for the
    nodes before Sample)."""
    latency.record_queue_wait(seconds)


def last_latency() -> dict | None:
    """Where the last Sample's time went, in seconds (None before the first): start_s (worker group start),
    load_s (loading, compiling warm-ups), text_s, denoise_s, vae_s, handback_s, total_s (the whole run)."""
    return latency.last()


def describe_inputs(spec: PipelineSpec, req: SampleRequest, image: np.ndarray | None = None,
                    mask: np.ndarray | None = None, positive: Sequence | None = None,
                    negative: Sequence | None = None) -> list[str]:
    """Checks Sample's inputs, sampler and scheduler as `sample` would and says what will happen."""
    return list(prepare_sample(spec, req, image, mask, positive=positive, negative=negative).notes)


def size_from_image(spec: PipelineSpec, image: np.ndarray) -> tuple[int, int, str | None]:
    """Width and height that follow the image (rounded down to the model's size factor), and a note if rounded;
    held to the limits width and height have (the node's range, the model's, the pixel budget), checked from the
    image's shape before its pixels are copied."""
    shape = np.shape(image)
    if len(shape) in (3, 4) and min(shape[-3:-1], default=0) >= 1:
        h, w = shape[-3:-1]
        f = spec.size_factor or 1
        try:
            models.check_size(models.info_of(spec), max(f, w // f * f), max(f, h // f * f))
            pixels.check(spec, max(f, w // f * f), max(f, h // f * f))
        except ModelError as e:
            raise ModelError(f"size_from_image: the image is {w}x{h}, and width and height follow it, so they are "
                             f"held to the same limits: {e} Turn size_from_image off and set width and height, or "
                             "scale the image down first (Upscale Image By).") from None
    return images.size_from_image(spec, image)


# ---- LoRAs

def with_lora(spec: PipelineSpec, path: str, strength: float = 1.0,
              te_strength: float = 1.0, experts: str = "both") -> tuple[PipelineSpec, str]:
    """`spec` with one more LoRA (applied after the ones it has; on a model of two experts, to `experts`),
    checked; and the LoRAs, for the node's text."""
    return loras.add(spec, path, strength, te_strength, experts)


# ---- ControlNets

def with_controlnet(spec: PipelineSpec, path: str, image: np.ndarray, strength: float = 1.0, start: float = 0.0,
                    end: float = 1.0, union_mode: str = "none") -> tuple[PipelineSpec, str]:
    """`spec` with one more ControlNet (a diffusers folder or single file) and its control image (IMAGE
    [B, H, W, C] in 0..1), checked; and the ControlNets, for the node's text."""
    return controlnets.add(spec, path, image, strength, start, end, union_mode)


# ---- FLUX.1 Redux

def with_redux(spec: PipelineSpec, style_model: str, clip_vision: str, image: np.ndarray,
               prompt_embeds_scale: float = 1.0, pooled_prompt_embeds_scale: float = 1.0,
               text: str = redux.TEXT_CHOICES[0]) -> tuple[PipelineSpec, str]:
    """`spec` with one more Redux reference (a style model file, a SigLIP vision file, reference images IMAGE
    [B, H, W, C] in 0..1 and FluxPriorReduxPipeline's scales), checked; and what Redux does, for the node's text."""
    return redux.add(spec, style_model, clip_vision, image, prompt_embeds_scale, pooled_prompt_embeds_scale, text)


def warmup_steps(spec: PipelineSpec) -> int:
    """Steps a load runs when its compile plan warms sizes up (for a progress bar)."""
    plan = spec.compile_plan()
    return WARMUP_STEPS * max(1, len(plan.warmup)) if plan else WARMUP_STEPS


def worker_info() -> list[dict]:
    """Per-rank state of the running group (empty when none runs)."""
    workers = group.current_group()
    if workers is None:
        return []
    try:
        return [r.value for r in workers.info()]
    except WorkerCrashed:  # it died just now: Device Info is safe to run at any time, and it has no workers
        return []


def device_info() -> devices.DeviceInfo:
    return devices.detect()


def start_hosts() -> None:
    """Starts waiting for the other hosts when ComfyUI starts (several hosts configured); says why it cannot."""
    try:
        hosts.registry()
    except (TPUError, OSError) as e:
        log.error("comfyui-tpu: the other hosts cannot join: %s", e)


def topology() -> str:
    """Which hosts have joined ('' on one host): nodes whose 'auto' counts chips re-plan when it changes."""
    try:
        reg = hosts.registry()
    except TPUError as e:  # a broken cluster setting: Sample says so, with its fix
        return f"unusable: {e}"
    return "" if reg is None else ",".join(f"{h.address}/{h.procs}" for h in reg.hosts())


def hosts_info() -> dict | None:
    """The other hosts of a slice (joined, waiting for, left), or None on one host."""
    reg = hosts.registry()
    return None if reg is None else reg.describe()


def shutdown() -> None:
    """Stops all workers (frees every chip and the host memory they hold)."""
    group.shutdown()


def list_models(roots: Iterable[str]) -> list[str]:
    """Diffusers folders in ComfyUI's diffusers folders, then the pipelines of the Hugging Face hub cache under
    their repo ids."""
    found = models.find_models([str(Path(r)) for r in roots])
    return found + [repo for repo in models.hub_models() if repo not in found]


def list_files(roots: Mapping[str, Iterable[str]]) -> dict[str, list[str]]:
    """Per role (checkpoint, diffusion_model, text_encoder, vae), the files of ComfyUI's folders that fit it."""
    return listing.list_files(roots)


def _group_progress(spec: PipelineSpec, req: SampleRequest, on_progress: ProgressFn | None) -> ProgressFn | None:
    """One progress bar for the whole group: completed steps of all replicas over the steps of all images."""
    if on_progress is None:
        return None
    total = len(req.images()) * req.steps
    done: dict[int, int] = {}

    def aggregate(msg: Status | Step) -> None:
        if isinstance(msg, Step):
            done[msg.rank // spec.model_ranks] = msg.step  # each replica reports its own share
            msg = Step(msg.id, sum(done.values()), total, msg.step_s, msg.rank)
        on_progress(msg)

    return aggregate


def _status_adapter(on_progress: ProgressFn | None) -> Callable[[str], None] | None:
    if on_progress is None:
        return None
    return lambda text: on_progress(Status(None, text))


# ---- parallel layouts and sampling options (controller/layouts.py, sampling_options.py do the work)

def shard(spec: PipelineSpec, degree: int, shard_text_encoders: bool = False) -> tuple[PipelineSpec, str]:
    """`spec` sharded over `degree` chips (0 = auto), checked; and what is sharded, for the node's text."""
    return layouts.plan_tp(spec, degree, shard_text_encoders)


def replicate(spec: PipelineSpec, replicas: int) -> tuple[PipelineSpec, str]:
    """`spec` with `replicas` data-parallel copies (0 = auto), checked; and the layout, for the node's text."""
    return layouts.plan_dp(spec, replicas)


def cfg_parallel(spec: PipelineSpec) -> tuple[PipelineSpec, str]:
    """`spec` with its two CFG passes on two ranks, checked; and what that does for this model."""
    return layouts.plan_cfg(spec)


def context_parallel(spec: PipelineSpec, degree: int, mode: str = "ulysses") -> tuple[PipelineSpec, str]:
    """`spec` with its transformer's sequence split over `degree` ranks (0 = auto), checked; and what it does."""
    return layouts.plan_cp(spec, degree, mode)


def sampling_options(spec: PipelineSpec, prompt_cache: bool = True, batched: bool = False,
                     true_cfg_scale: float = 1.0, step_cache: str = "off",
                     cache_threshold: float = 0.0) -> tuple[PipelineSpec, str]:
    """`spec` with these sampling options, checked; and what they do, for the node's text."""
    return plan_sampling(spec, prompt_cache, batched, true_cfg_scale, step_cache, cache_threshold)


# ---- warm start (controller/warm_start.py)

def warm_start_enabled() -> bool:
    return warm.enabled()


def warm_start() -> threading.Thread | None:
    """With COMFYUI_TPU_WARM_START=1: starts this host's worker group in the background (never blocks)."""
    return warm.start()


# ---- execution modes and compiling

def with_mode(spec: PipelineSpec, mode: str) -> tuple[PipelineSpec, list[str]]:
    """`spec` run in `mode` (no reload when it changes), and notes for the user about this device."""
    if mode not in MODE_CHOICES:
        raise CompileError(f"mode: '{mode}' is not one of {', '.join(MODE_CHOICES)}.")
    unplanned = spec.compile is None
    spec = compile_plan.resolve_compile(spec.with_changes(mode=mode))
    note = mode_note(spec.kind, mode)
    notes = list(spec.compile.notes) if spec.compile_plan() else []
    if spec.compile_plan() is not None and unplanned:
        plan = spec.compile
        notes.append(f"compiled with the defaults ({plan.target}, backend {plan.backend}); each new size compiles "
                     "on its first Sample. Add a Compile node to choose, or to compile sizes up front.")
    return spec, ([note] if note else []) + notes


def with_compile(spec: PipelineSpec, target: str, backend: str, warmup: str,
                 snap_to_warmup: bool = False) -> tuple[PipelineSpec, list[str]]:
    """`spec` in compiled mode with this plan, checked against the model and device; and notes for the user."""
    shapes = compile_plan.parse_warmup(warmup)
    for w, h, _, frames in shapes:
        if spec.family.frame_step and not frames:
            raise CompileError(f"warmup: {w}x{h} has no frames, and {spec.family.name} makes videos, each frame "
                               f"count a shape of its own: write them as xFRAMESf, e.g. '{w}x{h}x81f'.")
        try:
            models.check_size(models.info_of(spec), w, h)
            models.check_frames(spec.family, frames)
        except ModelError as e:
            raise CompileError(f"warmup: {w}x{h}" + (f"x{frames}f" if frames else "") + f": {e}") from None
    if snap_to_warmup and not shapes:
        raise CompileError("snap_to_warmup: there are no warm-up sizes to snap to; list some in warmup.")
    plan = CompilePlan(target, backend, shapes, bool(snap_to_warmup))
    spec = compile_plan.resolve_compile(spec.with_changes(mode="compiled", compile=plan))
    return spec, list(spec.compile.notes)


def compile_stats() -> dict | None:
    """Rank 0's mode, compile and cache statistics (compiles, hits, seconds per shape); None without workers."""
    info = worker_info()
    return info[0].get("compile") if info else None


def set_compile_cache_dir(path: str, override: bool = False) -> str:
    """The folder the persistent compile caches use from the next worker start; an explicit
    COMFYUI_TPU_COMPILE_CACHE in the environment wins unless `override`. Returns the folder in use."""
    if override or not settings.COMPILE_CACHE.is_set():
        settings.COMPILE_CACHE.set(str(path))
    return settings.COMPILE_CACHE.raw()
