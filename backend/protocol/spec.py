"""What both processes agree on: the immutable descriptions that flow through the node graph and over the link
(the families they name live in backend/families). Nodes build these; the controller checks them once and the
worker follows them. A new seed or prompt reuses everything, a new model reloads, a new device kind or chip count
restarts the worker group."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ..families import PIPELINES, Pipeline, config_dir
from .warmup import DEFAULT_FRAME_RATE, CompilePlan, WarmupSize

# the components that denoise (Wan 2.2 A14B's low-noise expert, Ideogram 4's second model, MiniMax H3's ref2va
# partition): fp8 storage, compiling, step caching and a LoRA's model strength apply to them
DENOISERS = ("transformer", "unet", "transformer_2", "unconditional_transformer", "transformer_ref")
# float8_e4m3fn: the denoiser's weights stored in fp8 and computed in bfloat16 layer by layer (diffusers'
# enable_layerwise_casting); appended last, as saved workflows store the choice by value
DTYPE_CHOICES = ("auto", "bfloat16", "float16", "float32", "float8_e4m3fn")
FP8_STORAGE = ("float8_e4m3fn", "float8_e5m2")  # storage dtypes kept as they are (spec.storage)
# Step caching (Sampling Options): diffusers' cache hooks that skip or approximate transformer work on steps
# whose input barely changed; "off" first (the default). Which suit a pipeline: its `Pipeline.step_caches`.
STEP_CACHES = ("off", "first block", "taylorseer", "magcache")
CACHE_THRESHOLDS = {"first block": 0.08, "magcache": 0.06}  # threshold 0 means these; TaylorSeer has none
DEVICE_CHOICES = ("auto", "tpu", "cuda", "cpu")
OFFLOAD_CHOICES = ("none", "model", "sequential", "auto")  # auto: the controller picks one of the others
MODE_CHOICES = ("strict eager", "defer-and-fuse eager", "compiled", "debug eager (launch blocking)")
COMPILE_TARGETS = ("whole denoiser", "repeated blocks")
COMPILE_BACKENDS = ("auto", "tpu", "inductor", "eager", "aot_eager")
WARMUP_STEPS = 2  # steps of a compile warm-up: enough for a per-step recompile to show
CP_MODES = ("ulysses", "ring")  # diffusers' two context-parallel attentions
# What a Sample hands back: the images; the images and ComfyUI's LATENT (what the pipeline gives its VAE to
# decode); or the LATENT alone, the VAE never running (Sample Latent)
OUTPUTS = ("images", "images+latents", "latents")


# ---- diffusers pipeline folders (the controller checks them, the worker loads them)

def read_json(path: Path, default: dict | None = None) -> dict:
    """A JSON config file; with `default`, a missing or unreadable file gives `default` instead of raising."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        if default is None:
            raise
        return default


# the index files a pipeline folder holds: a DiffusionPipeline's, then those of the modular pipelines families declare
INDEX_FILES: tuple[str, ...] = ("model_index.json",
                                *dict.fromkeys(p.modular.index for p in PIPELINES.values() if p.modular))


def index_file(folder: Path) -> Path | None:
    """The folder's pipeline index (model_index.json, or a modular pipeline's modular_model_index.json), None
    when it holds neither: what makes a folder a pipeline the pack lists and loads."""
    return next((folder / n for n in INDEX_FILES if (folder / n).is_file()), None)


def read_index(folder: Path) -> dict:
    """The folder's pipeline index; {} where it has none."""
    found = index_file(folder)
    return read_json(found, {}) if found else {}


def listed_components(index: dict) -> dict[str, tuple[str, str]]:
    """The components a model_index.json lists, in its order: name → (library, class name). Private keys
    (`_class_name`, ...) and absent optional components (`[null, null]`) are left out. A modular index's entries
    carry a third item (the component's spec: subfolder, type hint), read the same way."""
    return {name: (value[0], value[1]) for name, value in index.items()
            if not name.startswith("_") and isinstance(value, list) and len(value) in (2, 3)
            and value[0] is not None and value[1] is not None}


# TorchTPU 0.2.0 still has these eager modes (torch.tpu.EagerMode), but diffusers' TorchTPU guide dropped them
# (huggingface/diffusers#14039, 2026-07-17: "remove Debug Eager and Fused Eager sections"): it documents strict
# eager and compile only. Saved workflows keep them; a TPU run says so.
UNGUIDED_TPU_MODES = ("defer-and-fuse eager", "debug eager (launch blocking)")


def mode_note(kind: str, mode: str) -> str | None:
    """What the user should know when `kind` runs `mode` differently from a TPU, or when a TPU runs a mode
    TorchTPU's diffusers guide no longer documents (None: runs as asked)."""
    if kind == "tpu":
        if mode in UNGUIDED_TPU_MODES:
            return (f"{mode}: TorchTPU's own mode, which diffusers' TorchTPU guide no longer documents (it keeps "
                    "strict eager and compiled) and which never ran in the pack on a TPU; if it fails, use strict "
                    "eager or compiled.")
        return None
    if mode == "defer-and-fuse eager":
        return f"defer-and-fuse eager exists only on TPU; running strict eager on {kind}."
    if mode == "debug eager (launch blocking)" and kind == "cuda":
        return ("debug eager on CUDA: launch blocking needs CUDA_LAUNCH_BLOCKING=1 in ComfyUI's environment "
                "before the workers start; running strict eager.")
    return None


# Load LoRA (TPU) on a model of two experts (Wan 2.2 A14B): the expert(s) a LoRA is written into, as an artist's
# LoraLoaderModelOnly on the high-noise model, the low-noise one, or each; diffusers' load_lora_weights with
# load_into_transformer_2 False / True
LORA_EXPERTS = ("both", "high noise", "low noise")
EXPERT_COMPONENTS = {"both": ("transformer", "transformer_2"), "high noise": ("transformer",),
                     "low noise": ("transformer_2",)}


@dataclass(frozen=True)
class LoraRef:
    """One LoRA file written into the loaded weights (Load LoRA). Not part of the load key: adding, removing or
    re-weighting LoRAs rewrites the touched weights in place and never reloads the model."""

    path: str  # absolute, checked by the controller
    strength: float = 1.0  # on the denoiser (transformer or UNet)
    te_strength: float = 1.0  # on the text encoders, where the file has weights for them
    experts: str = "both"  # a model of two experts (Wan 2.2 A14B): LORA_EXPERTS, which of them gets it

    @property
    def name(self) -> str:
        return Path(self.path).name


@dataclass(frozen=True)
class ControlNetRef:
    """One ControlNet with its control image (Apply ControlNet), checked by the controller. Not part of the load
    key: the worker loads it beside the pipeline and runs the family's ControlNet pipeline made from the loaded one
    with from_pipe; strength, start, end and the image are arguments of the call."""

    path: str  # a diffusers folder or a single file in diffusers' layout, absolute
    model: str  # diffusers' class it was recognised as ("FluxControlNetModel")
    config: str = ""  # a single file: its config (JSON) read from its tensors; "" for a folder (its config.json)
    strength: float = 1.0  # controlnet_conditioning_scale
    start: float = 0.0  # control_guidance_start: the share of the steps before it starts
    end: float = 1.0  # control_guidance_end
    mode: int = -1  # a union ControlNet's control_mode; -1: not a union one
    mode_name: str = ""
    size_bytes: int = 0  # its weights on disk (offload 'auto' counts them)
    # the control image (IMAGE [B, H, W, C] float32), held while the spec passes through the node graph; it
    # travels to the workers beside the request (api.prepare_sample), never inside the spec
    image: Any = field(default=None, compare=False, repr=False)

    @property
    def name(self) -> str:
        return Path(self.path).name


def control_key(index: int) -> str:
    """The name ControlNet `index`'s control image travels under, beside a Sample request."""
    return f"control{index}"


@dataclass(frozen=True)
class ReduxRef:
    """One FLUX.1 Redux reference (Apply Redux), checked by the controller: the style model file (diffusers'
    ReduxImageEncoder), the SigLIP vision file (ComfyUI's clip_vision), the reference images and diffusers'
    FluxPriorReduxPipeline scales. Not part of the load key: the worker loads the two models beside the pipeline
    and runs the prior with the loaded text encoders; the prior's output is the call's prompt embeddings."""

    style_model: str  # absolute path of the style model file (redux_up / redux_down)
    clip_vision: str  # absolute path of the SigLIP vision file (transformers' SiglipVisionModel keys)
    vision_config: str  # JSON: the SiglipVisionConfig sizes read from the file's tensors
    embedder_config: str  # JSON: ReduxImageEncoder's redux_dim and txt_in_features read from the file
    prompt_embeds_scale: float = 1.0  # diffusers' prompt_embeds_scale: the text and image tokens of each image
    pooled_prompt_embeds_scale: float = 1.0  # diffusers' pooled_prompt_embeds_scale
    text: bool = True  # the prompt's tokens go with the image's (False: zeros, the prior without text encoders)
    size_bytes: int = 0  # both files on disk (offload 'auto' counts them)
    # the reference images (IMAGE [B, H, W, C] float32): they travel beside the request, as control images do
    image: Any = field(default=None, compare=False, repr=False)

    @property
    def name(self) -> str:
        return Path(self.style_model).name


def redux_key(index: int) -> str:
    """The name Redux reference `index`'s images travel under, beside a Sample request."""
    return f"redux{index}"


@dataclass(frozen=True)
class FileComponent:
    """One part of a pipeline read from an artist's file (ComfyUI's folders), as the controller recognised it.

    `name` is the pipeline component it becomes ("transformer", "vae", "text_encoder_2", "tokenizer", ...), or
    "checkpoint" for an all-in-one file that diffusers' pipeline loader reads the remaining parts from."""

    name: str
    path: str  # absolute
    layout: str  # how the file is read (see worker/loading.py: FILE_LOADERS)
    prefix: str = ""  # key prefix of this part inside the file ("model.diffusion_model.")
    quant: str = ""  # "" (plain, fp8 included: upcast on load) | "scaled-fp8" (ComfyUI's) | "gguf"
    size_bytes: int = 0
    key_map: tuple[tuple, ...] = ()  # ComfyUI's key map where diffusers has no converter for the file's size
    more: tuple[str, ...] = ()  # further files holding tensors of the part (LTX-2.5's connectors: DiT and Gemma 4)


# a component's config file, by kind: a model's, a scheduler's, an image processor's
CONFIG_FILES = ("config.json", "scheduler_config.json", "preprocessor_config.json")


@dataclass(frozen=True)
class FileSource:
    """A pipeline made of artists' files: the pack's configs of the published model (`configs`, a folder of
    a family's configs/) with the sizes read from the files' tensors laid over them (`overrides`), and the files."""

    configs: str
    components: tuple[FileComponent, ...]
    overrides: str = "{}"  # JSON: component name -> config keys taken from the file's tensors
    notes: tuple[str, ...] = ()  # what the user should know about these files (said when they load)

    @property
    def config_dir(self) -> Path:
        return config_dir(self.configs)

    def config(self, name: str) -> dict:
        """Component `name`'s config: the published one with the sizes of the artist's file."""
        folder = self.config_dir / name
        base = next((read_json(folder / f, {}) for f in CONFIG_FILES if (folder / f).is_file()), {})
        return {**base, **json.loads(self.overrides).get(name, {})}

    def index(self) -> dict:
        return {**read_index(self.config_dir), **json.loads(self.overrides).get("", {})}

    def component(self, name: str) -> FileComponent | None:
        return next((c for c in self.components if c.name == name), None)

    def quantized(self) -> FileComponent | None:
        """The first of ComfyUI's quantized files (comfy_quant markers) among the files, None when none is."""
        return next((c for c in self.components if c.quant == "comfy-quant"), None)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> FileSource:
        parts = tuple(FileComponent(**{**c, "key_map": tuple(tuple(e) for e in c.get("key_map", ())),
                                       "more": tuple(c.get("more", ()))})
                      for c in data["components"])
        return cls(**{**data, "components": parts, "notes": tuple(data.get("notes", ()))})


@dataclass(frozen=True)
class PipelineSpec:
    """What pipeline to run and how. The TPU_PIPELINE value that nodes pass along."""

    model_path: str  # absolute, checked by the controller
    class_name: str
    size_factor: int
    dtype: str = "auto"
    device: str = "auto"  # what the user chose
    offload: str = "none"  # "auto" until the controller resolves it (offload.resolve_offload); workers never see it
    mode: str = "strict eager"
    compile: CompilePlan | None = None  # the plan in compiled mode, resolved for `kind` by the controller
    tp_degree: int = 1  # chips one model is split over (tensor parallel)
    tp_text_encoders: bool = False  # also shard text encoders that have a TP plan (the user's choice)
    sharded_encoders: tuple[str, ...] = ()  # the text encoders that choice shards (found by the controller)
    dp_replicas: int = 1  # copies of the (possibly sharded) model, each drawing different images
    load_in_turn: bool | None = None  # replicas read their weights one after another (None: layouts.load_order)
    kind: str = ""  # the device kind `device` resolved to, once (api.make_spec; api.checked fills it in)
    cfg_parallel: int = 1  # ranks the two CFG passes of a step are split over (1, or 2 with CFG Parallel)
    cp_degree: int = 1  # ranks the transformer's sequence is split over (context parallel)
    cp_mode: str = "ulysses"  # CP_MODES
    prompt_cache: bool = True  # reuse prompt embeddings across calls (Sampling Options)
    batched: bool = False  # the images of one prompt in one pipeline call (Sampling Options)
    true_cfg_scale: float = 1.0  # FLUX.1's true CFG scale (> 1 with a negative prompt: two passes per step)
    source: FileSource | None = None  # artists' files (ComfyUI's folders) instead of a diffusers folder
    variant: str = ""  # the weights variant a diffusers folder holds only ("fp16": *.fp16.safetensors)
    loras: tuple[LoraRef, ...] = ()  # applied in this order on top of the loaded weights
    # The denoiser's weights kept in this fp8 dtype (FP8_STORAGE) and cast to the compute dtype layer by layer;
    # "" = stored in the compute dtype. Set by the controller (storage.resolve_storage) from the dtype choice or
    # the file's fp8 weights.
    storage: str = ""
    step_cache: str = "off"  # STEP_CACHES (Sampling Options)
    cache_threshold: float = 0.0  # the cache kind's threshold; 0 = its default (Sampling Options)
    # a noise schedule of the artist's own (Sampling Options' sigmas, ComfyUI's final 0 dropped: diffusers'
    # `sigmas=`); () = the pipeline's own, from Sample's steps and scheduler
    sigmas: tuple[float, ...] = ()
    controlnets: tuple[ControlNetRef, ...] = ()  # Apply ControlNet, in the order they were added
    redux: tuple[ReduxRef, ...] = ()  # Apply Redux, in the order they were added

    @property
    def family(self) -> Pipeline:
        """How its pipeline class runs (what its family module says of it)."""
        return PIPELINES[self.class_name]

    def component_config(self, name: str) -> dict:
        """Component `name`'s config.json (the scheduler's scheduler_config.json) as the worker will load it;
        {} when there is none."""
        if self.source is not None:
            return self.source.config(name)
        folder = Path(self.model_path) / name
        return read_json(folder / "config.json", {}) or read_json(folder / "scheduler_config.json", {})

    @property
    def start_image(self) -> bool:
        """Whether Sample Video's start image makes each video's first frame: an image-to-video pipeline, or a
        text-to-video one whose model takes a start image too (Wan 2.2 TI2V 5B)."""
        f = self.family
        return f.start_image or bool(f.start_image_via and (not f.start_image_if
                                                            or self.model_index().get(f.start_image_if)))

    def model_index(self) -> dict:
        """The pipeline's model_index.json as the worker will load it."""
        if self.source is not None:
            return self.source.index()
        return read_index(Path(self.model_path))

    @property
    def model_ranks(self) -> int:
        """Ranks that run one copy of the model together: tp × context × cfg."""
        return self.tp_degree * self.cp_degree * self.cfg_parallel

    @property
    def world_size(self) -> int:
        return self.model_ranks * self.dp_replicas

    def layout(self, rank: int) -> Layout:
        return Layout(self.tp_degree, self.world_size, rank, cp_degree=self.cp_degree, cfg_degree=self.cfg_parallel)

    @property
    def name(self) -> str:
        return self.model_path.rstrip("/").rsplit("/", 1)[-1]

    def load_key(self) -> tuple:
        """Changing any of these reloads the weights; mode, compile plan and LoRAs do not, except that compiled
        mode reads a quantized file's layers as plain buffers (worker/quantized.py `for_device`): switching it on
        or off with such a file reloads."""
        plain = self.mode == "compiled" and self.source is not None and self.source.quantized() is not None
        return (self.model_path, self.source, self.variant, self.dtype, self.offload, self.tp_degree,
                self.tp_text_encoders, self.cp_degree, self.cp_mode, self.cfg_parallel, self.storage, plain)

    def compile_plan(self) -> CompilePlan | None:
        """The plan the worker runs: None unless the mode is 'compiled'."""
        return self.compile if self.mode == "compiled" else None

    def with_changes(self, **changes) -> PipelineSpec:
        return replace(self, **changes)

    def to_dict(self) -> dict:
        """The spec as plain data (the link's format); ControlNet and Redux images stay behind (they travel beside
        it)."""
        return asdict(replace(self, controlnets=tuple(replace(c, image=None) for c in self.controlnets),
                              redux=tuple(replace(r, image=None) for r in self.redux)))

    @classmethod
    def from_dict(cls, data: dict) -> PipelineSpec:
        plan = data.get("compile")
        if isinstance(plan, dict):
            plan = CompilePlan(**{**plan, "notes": tuple(plan.get("notes", ()))})
        source = data.get("source")
        if isinstance(source, dict):
            source = FileSource.from_dict(source)
        return cls(**{**data, "compile": plan, "source": source,
                      "sharded_encoders": tuple(data.get("sharded_encoders", ())),
                      "sigmas": tuple(data.get("sigmas", ())),
                      "loras": tuple(LoraRef(**lora) for lora in data.get("loras", ())),
                      "controlnets": tuple(ControlNetRef(**c) for c in data.get("controlnets", ())),
                      "redux": tuple(ReduxRef(**r) for r in data.get("redux", ()))})


@dataclass(frozen=True)
class SampleRequest:
    """One Sample (or Sample Video) call. Each image (video) i of the batch uses its own generator seeded with
    seed + i; a video's frames come back one after another in the image batch."""

    prompt: str
    negative_prompt: str = ""
    width: int = 1024
    height: int = 1024
    steps: int = 20
    guidance: float = 3.5
    seed: int = 0
    batch_size: int = 1
    prompt_per_line: bool = False  # each non-empty line is a prompt; batch_size images each
    denoise: float = 1.0  # with an input image or latent: how much of it is repainted (0 keeps it, 1 all)
    frames: int = 0  # frames of each video (video pipelines: Sample Video); 0: an image
    # frames per second of each video, for models that take it (Pipeline.frame_rate_arg)
    frame_rate: float = DEFAULT_FRAME_RATE
    tiled_vae: bool = False  # the video VAE decodes in tiles (the controller sets it: controller.pixels.video_tiling)
    sampler: str = "default"  # ComfyUI's sampler name (protocol.samplers); default: the pipeline's own scheduler
    scheduler: str = "default"  # ComfyUI's scheduler (schedule) name; default: the pipeline's own schedule
    outputs: str = "images"  # OUTPUTS
    # LTX-2's two-stage upscale (families/ltx2/two_stage.py): the x2 latent upsampler's path ("": one stage) and
    # stage 2's sigmas
    upscale_model: str = ""
    upscale_sigmas: tuple[float, ...] = ()
    audio_guidance: float = -1.0  # the sound's own CFG (Pipeline.guidance_also; LTXVDualCFGGuider); < 0: guidance

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> SampleRequest:
        return cls(**data)

    def prompts(self) -> list[str]:
        """The prompts of the request: one, or each non-empty line when prompt_per_line is on."""
        if self.prompt_per_line:
            return [line.strip() for line in self.prompt.splitlines() if line.strip()]
        return [self.prompt]

    def images(self) -> list[tuple[str, int]]:
        """Every image in order, as (prompt, seed): batch_size images per prompt; global image i uses seed + i
        wherever it is drawn."""
        return [(p, (self.seed + i * self.batch_size + j) % 2**64) for i, p in enumerate(self.prompts())
                for j in range(self.batch_size)]


def warmup_request(spec: PipelineSpec, width: int, height: int, batch: int, frames: int = 0,
                   frame_rate: float = 0.0) -> SampleRequest:
    """A compile warm-up: WARMUP_STEPS steps (a per-step recompile would show), CFG on where it changes shapes
    (as these models are used), and `batch` images for every data-parallel replica, so each of them compiles; a
    video's VAE decodes as a Sample of its size would (tiled or whole); a video at `frame_rate` (0: Sample
    Video's default), which sets LTX-2's sound's length."""
    guidance = 5.0 if spec.family.cfg_doubles_batch else 3.5
    size = WarmupSize(width, height, batch, frames, frame_rate)
    tiled = spec.compile is not None and size in spec.compile.tiled_vae
    return SampleRequest(prompt="warm-up", width=width, height=height, steps=WARMUP_STEPS, guidance=guidance,
                         batch_size=batch * spec.dp_replicas, frames=frames, tiled_vae=tiled,
                         frame_rate=frame_rate or DEFAULT_FRAME_RATE)


def share(n: int, replicas: int, replica: int) -> range:
    """Replica `replica`'s contiguous slice of n images; the first n % replicas replicas take one more."""
    base, extra = divmod(n, replicas)
    start = replica * base + min(replica, extra)
    return range(start, start + base + (1 if replica < extra else 0))


@dataclass(frozen=True)
class Layout:
    """Where a rank sits: which replica, which shard, and whether it sends that replica's images back.

    A group has replicas × cfg × context × tp ranks, tp fastest: rank r is TP shard r % tp, context shard
    (r // tp) % context, CFG branch (r // (tp·context)) % cfg of replica r // (tp·context·cfg)."""

    tp_degree: int
    world_size: int
    rank: int
    cp_degree: int = 1
    cfg_degree: int = 1

    @property
    def model_ranks(self) -> int:
        return self.tp_degree * self.cp_degree * self.cfg_degree

    @property
    def replicas(self) -> int:
        return self.world_size // self.model_ranks

    @property
    def replica(self) -> int:
        return self.rank // self.model_ranks

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp_degree

    @property
    def cp_rank(self) -> int:
        return self.rank // self.tp_degree % self.cp_degree

    @property
    def cfg_rank(self) -> int:
        return self.rank // (self.tp_degree * self.cp_degree) % self.cfg_degree

    @property
    def leader(self) -> bool:
        return self.rank % self.model_ranks == 0

    def my_share(self, req: SampleRequest) -> range:
        """The global indices of the images this rank's replica draws (image i: req.images()[i])."""
        return share(len(req.images()), self.replicas, self.replica)


@dataclass(frozen=True)
class GroupConfig:
    """What a worker group is: changing it means stopping the group and starting another."""

    kind: str  # "tpu" | "cuda" | "cpu"
    world_size: int = 1
    hosts: tuple[str, ...] = ()  # the other hosts taking a share, in node-rank order (empty: this host only)
    per_host: int = 0  # worker processes per host when `hosts` is not empty
