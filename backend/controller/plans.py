"""Plans and their checks: how many chips a pipeline uses and how (Shard TP, Context Parallel, CFG Parallel,
Data Parallel), how it samples (Sampling Options), and how it is compiled. Controller side: reads configs,
never imports torch, never starts a device.

A worker group has `replicas × cfg × context × tp` ranks, one per chip, tp fastest (`protocol.spec.Layout`): the
`model_ranks = tp × context × cfg` ranks of one replica run one copy of the model together. All ranks receive the
same request; each replica draws its own contiguous slice of the images, and only the first rank of each replica
sends its images back. Every check raises an InputError that names the input, the value and the fix.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from ..protocol.errors import CompileError, ParallelError
from ..protocol.spec import (
    COMPILE_BACKENDS,
    COMPILE_TARGETS,
    CP_MODES,
    FAMILIES,
    CompilePlan,
    PipelineSpec,
    listed_components,
    read_json,
)
from . import devices, hosts

# ---- Shard TP and Data Parallel


def families_with_tp_plan() -> list[str]:
    return sorted({f.name for f in FAMILIES.values() if f.tp_plan})


def chip_count(kind: str) -> int | None:
    """Chips of this kind on this host, or None on the CPU (no chips: the limit is the number of cores)."""
    if kind == "tpu":
        return len(devices.tpu_chips())
    if kind == "cuda":
        return devices.cuda_count()
    return None


def transformer_heads(model_path: str) -> int | None:
    """num_attention_heads of the pipeline's transformer (from its config.json; no weights are read)."""
    heads = read_json(Path(model_path) / "transformer" / "config.json", {}).get("num_attention_heads")
    return heads if isinstance(heads, int) else None


@dataclass(frozen=True)
class TextEncoder:
    name: str  # component name, e.g. "text_encoder_2"
    class_name: str  # e.g. "T5EncoderModel"
    has_tp_plan: bool  # transformers ships a tensor-parallel plan for it
    heads: tuple[int, ...]  # attention and key/value head counts that a TP degree must divide


def _tp_plan_of(config: dict) -> bool:
    """Whether transformers has a TP plan for a model config (its config class or its text_config's)."""
    try:
        from transformers import CONFIG_MAPPING
    except ImportError:
        return False
    model_type = config.get("model_type")
    try:
        cls = CONFIG_MAPPING[model_type]
    except KeyError:
        return False
    if getattr(cls, "base_model_tp_plan", None):
        return True
    text = config.get("text_config")
    if isinstance(text, dict):
        sub = getattr(cls, "sub_configs", {}).get("text_config")
        text = {"model_type": getattr(sub, "model_type", None), **text}
        return bool(text.get("model_type")) and _tp_plan_of(text)
    return False


def text_encoders(model_path: str) -> list[TextEncoder]:
    """The pipeline's text encoders and whether each could be sharded (reads configs only)."""
    root = Path(model_path)
    index = read_json(root / "model_index.json", {})
    found = []
    for name, (_, class_name) in sorted(listed_components(index).items()):
        if not name.startswith("text_encoder"):
            continue
        config = read_json(root / name / "config.json", {})
        text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
        heads = tuple(h for h in (text.get("num_attention_heads"), text.get("num_key_value_heads"))
                      if isinstance(h, int))
        found.append(TextEncoder(name, class_name, _tp_plan_of(config), heads))
    return found


def _describe_degree_limit(kind: str, chips: int | None) -> str:
    if chips is None:
        return f"this CPU host has {os.cpu_count()} cores (one worker process each)"
    return f"this host has {chips} {kind.upper()} chip{'s' if chips != 1 else ''}"


def _largest_divisor(n: int, limit: int, heads: int | None) -> int:
    return max(d for d in range(1, limit + 1) if n % d == 0 and (heads is None or heads % d == 0))


def plan_tp(spec: PipelineSpec, degree: int, shard_text_encoders: bool = False) -> tuple[PipelineSpec, str]:
    """Checks a Shard TP request against the model and this host; returns the new spec and what will happen.

    degree 0 = auto: every chip of the host (on the CPU, which has no chips: 1). Raises ParallelError naming the
    input, the value and the fix.
    """
    family = FAMILIES[spec.class_name]
    name = Path(spec.model_path).name
    if degree < 0:
        raise ParallelError(f"degree: {degree} is not allowed; use 0 (auto: all chips) or a number of chips.")
    if not family.tp_plan:
        raise ParallelError(
            f"pipeline: '{name}' is a {family.name} model ({spec.class_name}), which has no "
            f"tensor-parallel plan in diffusers, so it cannot be sharded. Models that can: "
            f"{', '.join(families_with_tp_plan())}. Remove Shard TP; to use several chips for throughput, "
            "use Data Parallel instead.")
    if spec.offload != "none":
        raise ParallelError(
            f"offload: '{spec.offload}' cannot be combined with Shard TP (diffusers refuses offload on a "
            "sharded model; both decide where a weight lives). Set offload to 'none' in Load TPU Pipeline — "
            "sharding already splits the weights over the chips — or remove Shard TP.")
    kind = spec.kind
    chips = chip_count(kind)
    heads = transformer_heads(spec.model_path)
    notes = []
    if degree == 0:
        if chips is None:
            degree = 1
            notes.append(f"auto on the CPU is 1 (no chips); set degree up to {os.cpu_count()} to use more "
                         "processes")
        else:
            degree = _largest_divisor(chips, chips, heads) if chips else 1
            if chips and degree != chips:
                notes.append(f"auto: {degree} of {chips} chips, the largest count that divides both the "
                             f"chips and the {heads} attention heads")
    spec = with_sharded_encoders(spec.with_changes(tp_degree=degree, tp_text_encoders=bool(shard_text_encoders)))
    check_tp(spec, kind, chips, heads)
    return spec, describe_tp(spec, heads, notes)


def check_tp(spec: PipelineSpec, kind: str, chips: int | None, heads: int | None) -> None:
    degree = spec.tp_degree
    if degree == 1:
        return
    limit = (os.cpu_count() or 1) if chips is None else chips
    where = _describe_degree_limit(kind, chips)
    if degree > limit:
        raise ParallelError(f"degree: {degree} is more than {where}; use at most {limit} (or 0 for auto).")
    if chips is not None and chips % degree:
        good = [d for d in range(1, chips + 1) if chips % d == 0 and (heads is None or heads % d == 0)]
        raise ParallelError(f"degree: {degree} does not divide the {chips} chips of this host; use one of "
                         f"{', '.join(map(str, good))}.")
    if heads is not None and heads % degree:
        good = [d for d in range(1, min(limit, heads) + 1)
                if heads % d == 0 and (chips is None or chips % d == 0)]
        raise ParallelError(f"degree: {degree} does not divide the {heads} attention heads of "
                         f"'{Path(spec.model_path).name}' (each chip must hold whole heads); use one of "
                         f"{', '.join(map(str, good))}.")
    if spec.tp_text_encoders:
        for enc in text_encoders(spec.model_path):
            bad = [h for h in enc.heads if h % degree]
            if enc.has_tp_plan and bad:
                raise ParallelError(
                    f"shard_text_encoders: {enc.name} ({enc.class_name}) has {bad[0]} attention/key-value "
                    f"heads, which degree {degree} does not divide; turn shard_text_encoders off (the "
                    "encoder is then replicated on every chip) or choose a degree that divides it.")


def describe_tp(spec: PipelineSpec, heads: int | None, notes: Sequence[str] = ()) -> str:
    """One line per component: what is sharded and what is replicated, shown next to the node."""
    n = spec.tp_degree
    if n == 1:
        lines = ["degree 1: nothing is sharded (one chip per model copy)"]
    else:
        per = f", {heads // n} of {heads} heads per chip" if heads else ""
        lines = [f"transformer: sharded over {n} chips{per}"]
    for enc in text_encoders(spec.model_path):
        if n > 1 and spec.tp_text_encoders and enc.has_tp_plan:
            lines.append(f"{enc.name} ({enc.class_name}): sharded over {n} chips")
        elif enc.has_tp_plan:
            lines.append(f"{enc.name} ({enc.class_name}): replicated on every chip "
                         "(shard_text_encoders is off)")
        else:
            lines.append(f"{enc.name} ({enc.class_name}): replicated on every chip "
                         "(no TP plan in transformers)")
    lines.append("vae: replicated on every chip")
    return "\n".join([*lines, *notes])


def plan_dp(spec: PipelineSpec, replicas: int) -> tuple[PipelineSpec, str]:
    """Checks a Data Parallel request; replicas 0 = auto = all chips / tp_degree (on the CPU: 1)."""
    if replicas < 0:
        raise ParallelError(f"replicas: {replicas} is not allowed; use 0 (auto: all chips) or a number of "
                         "copies.")
    kind = spec.kind
    chips = chip_count(kind)
    notes = []
    across = hosts.span(kind, chips)
    if replicas == 0:
        if across is not None:
            replicas = max(1, across.processes // spec.model_ranks)
            notes.append(f"auto: every process of the {across.hosts} host(s) that have joined "
                         f"({across.per_host} per host)")
        elif chips is None:
            replicas = 1
            notes.append(f"auto on the CPU is 1 (no chips); set replicas up to "
                         f"{max(1, (os.cpu_count() or 1) // spec.model_ranks)} to use more processes")
        else:
            replicas = max(1, chips // spec.model_ranks)
    spec = spec.with_changes(dp_replicas=replicas)
    check_world(spec, kind, chips)
    workers = spec.world_size
    per = spec.model_ranks
    text = (f"{replicas} replica{'s' if replicas != 1 else ''} × {per} chip"
            f"{'s' if per != 1 else ''} each = {workers} worker{'s' if workers != 1 else ''}. "
            "A batch (and each prompt line) is split across replicas in order; image i always uses seed + i.")
    return spec, "\n".join([text, *notes])


def check_world(spec: PipelineSpec, kind: str, chips: int | None) -> None:
    if spec.dp_replicas < 1:
        raise ParallelError(f"replicas: {spec.dp_replicas} is too small; use at least 1.")
    if spec.tp_text_encoders and 1 < spec.tp_degree < spec.world_size and any(
            e.has_tp_plan for e in text_encoders(spec.model_path)):
        raise ParallelError(
            "shard_text_encoders: sharding text encoders cannot be combined with Data Parallel replicas > 1 "
            "or CFG Parallel yet (transformers' tensor parallelism spans the whole worker group). Turn "
            "shard_text_encoders off in Shard TP (the encoders are then replicated), or set replicas to 1 and "
            "remove CFG Parallel.")
    if (across := hosts.span(kind, chips)) is not None:
        check_hosts(spec, across)
        return
    limit = (os.cpu_count() or 1) if chips is None else chips
    if spec.world_size > limit:
        where = _describe_degree_limit(kind, chips)
        raise ParallelError(
            f"replicas: {spec.dp_replicas} replicas × {_per_copy(spec)} = {spec.world_size} "
            f"workers, but {where}; use at most {max(1, limit // spec.model_ranks)} replica(s) (or 0 for "
            "auto). Connect Data Parallel after Shard TP, Context Parallel and CFG Parallel so that auto accounts "
            "for them.")


def _per_copy(spec: PipelineSpec) -> str:
    """'TP degree 2', or 'TP 1 × context 2 × CFG 2': the ranks one copy of the model runs on."""
    if spec.cp_degree == 1 and spec.cfg_parallel == 1:
        return f"TP degree {spec.tp_degree}"
    return f"TP {spec.tp_degree} × context {spec.cp_degree} × CFG {spec.cfg_parallel}"


def check_hosts(spec: PipelineSpec, across: hosts.Span) -> None:
    """Several hosts: Data Parallel spans hosts, Shard TP stays within one (its chips have the fast links)."""
    per, world = across.per_host, spec.world_size
    if per % spec.model_ranks:
        raise ParallelError(f"degree: {_per_copy(spec)} = {spec.model_ranks} ranks per model copy does not divide "
                            f"the {per} worker processes of each host (a split model stays within one host); "
                            "choose degrees that divide it.")
    if world > across.processes:
        raise ParallelError(
            f"replicas: {spec.dp_replicas} replicas × {_per_copy(spec)} = {world} workers, but the "
            f"{across.hosts} host(s) that have joined run {across.processes} ({per} each); use at most "
            f"{max(1, across.processes // spec.model_ranks)} replica(s), 0 for auto, or join more hosts "
            "(`python -m backend join`).")
    if world > per and world % per:
        raise ParallelError(f"replicas: {world} workers do not fill whole hosts of {per}; use a replica count "
                            f"that makes a multiple of {per} workers (or at most {per // spec.model_ranks}).")


def with_sharded_encoders(spec: PipelineSpec) -> PipelineSpec:
    """`spec` naming the text encoders its tp_text_encoders choice shards: those with a transformers TP plan."""
    names = ()
    if spec.tp_text_encoders and spec.tp_degree > 1:
        names = tuple(e.name for e in text_encoders(spec.model_path) if e.has_tp_plan)
    return spec.with_changes(sharded_encoders=names)


def check_spec(spec: PipelineSpec) -> None:
    """Re-checks the parallel layout and sampling options of a spec before any worker is started (specs may come
    from scripts)."""
    check_sampling(spec)
    if spec.cfg_parallel != 1:
        check_cfg(spec)
    if spec.cp_degree != 1:
        check_cp(spec)
    if spec.world_size == 1:
        return
    kind = spec.kind
    chips = chip_count(kind)
    if spec.tp_degree < 1:
        raise ParallelError(f"degree: {spec.tp_degree} is too small; use at least 1.")
    if spec.tp_degree > 1:
        family = FAMILIES[spec.class_name]
        if not family.tp_plan or spec.offload != "none":
            plan_tp(spec, spec.tp_degree, spec.tp_text_encoders)  # raises the same message the node gives
        check_tp(spec, kind, chips, transformer_heads(spec.model_path))
    check_world(spec, kind, chips)


# ---- CFG Parallel, Context Parallel, Sampling Options

def families_with(attribute: str) -> list[str]:
    return sorted({f.name for f in FAMILIES.values() if getattr(f, attribute)})


def _distilled_klein(spec: PipelineSpec) -> bool:
    """A FLUX.2 [klein] model whose guidance is distilled (one pass per step; model_index.json says so)."""
    if spec.class_name != "Flux2KleinPipeline":
        return False
    return bool(read_json(Path(spec.model_path) / "model_index.json", {}).get("is_distilled", False))


def plan_cfg(spec: PipelineSpec) -> tuple[PipelineSpec, str]:
    """CFG Parallel: the two guidance passes of each step on two ranks; checked, and what it does for this model."""
    spec = spec.with_changes(cfg_parallel=2)
    check_cfg(spec)
    check_world(spec, spec.kind, chip_count(spec.kind))
    family, name = spec.family, Path(spec.model_path).name
    if family.cfg_passes == "batch":
        what = (f"{family.name} runs CFG as one denoiser call on a doubled batch: each of 2 ranks runs half of it "
                "(guidance above 1; at 1 or below both run the whole call). Images match one chip within about "
                "1e-5 (halved batches round differently).")
    elif spec.class_name == "FluxPipeline":
        what = ("FLUX.1 runs two passes per step only with true CFG: set true_cfg_scale above 1 in Sampling "
                "Options and give a negative prompt (the empty one counts). Rank 0 runs the prompt's pass, rank 1 "
                "the negative prompt's: the same image as one chip, bit for bit.")
    else:
        what = (f"{family.name} runs CFG as two passes per step (guidance above 1"
                f"{' and a negative prompt, the empty one counts' if family.guidance_arg == 'true_cfg_scale' else ''}"
                "): rank 0 runs the prompt's pass, rank 1 the negative prompt's, and they exchange their "
                "predictions once per step: the same image as one chip, bit for bit.")
    return spec, f"CFG Parallel on '{name}': 2 ranks per model copy. {what}"


def check_cfg(spec: PipelineSpec) -> None:
    family, name = spec.family, Path(spec.model_path).name
    if spec.cfg_parallel != 2:
        raise ParallelError(f"cfg_parallel: {spec.cfg_parallel} ranks is not supported; CFG has two passes, so "
                            "CFG Parallel uses 2 ranks (or remove the node).")
    if not family.cfg_passes or _distilled_klein(spec):
        raise ParallelError(
            f"pipeline: '{name}' is a {family.name} model ({spec.class_name}) with guidance distilled into the "
            "model: it runs one denoiser pass per step, so CFG Parallel has nothing to split. It applies to "
            "models that run two passes per step: SD3, SDXL, Qwen-Image, FLUX.1 with true CFG and FLUX.2 "
            "[klein] base models. Remove CFG Parallel; Shard TP or Context Parallel split one pass.")


def plan_cp(spec: PipelineSpec, degree: int, mode: str) -> tuple[PipelineSpec, str]:
    """Context Parallel: the transformer's token sequence split over `degree` ranks (0 = auto), through diffusers'
    ContextParallelConfig; checked, and what it does for this model."""
    if degree < 0:
        raise ParallelError(f"degree: {degree} is not allowed; use 0 (auto) or a number of ranks.")
    notes = []
    if degree == 0:
        chips = chip_count(spec.kind)
        if chips is None:
            degree = 1
            notes.append(f"auto on the CPU is 1 (no chips); set degree up to {os.cpu_count()} to use more "
                         "processes")
        else:
            free = max(1, chips // (spec.tp_degree * spec.cfg_parallel))
            heads = transformer_heads(spec.model_path) if mode == "ulysses" else None
            degree = _largest_divisor(free, free, heads)
            notes.append(f"auto: {degree} rank(s), the chips left after Shard TP and CFG Parallel"
                         + (f" that divide the {heads} attention heads" if heads else ""))
    spec = spec.with_changes(cp_degree=degree, cp_mode=mode)
    check_cp(spec)
    check_world(spec, spec.kind, chip_count(spec.kind))
    name = Path(spec.model_path).name
    if degree == 1:
        return spec, "\n".join(["degree 1: the sequence is not split", *notes])
    how = ("Ulysses: each rank attends over all tokens for 1/{n} of the heads (two all-to-alls per attention)"
           if mode == "ulysses" else
           "ring: each rank keeps 1/{n} of the keys and values and passes them around the ring")
    text = (f"Context Parallel on '{name}': the image and text tokens of every transformer block are split over "
            f"{degree} ranks ({how.format(n=degree)}); text encoders and VAE run on every rank. Pays off on long "
            f"sequences (large images); images match one chip within about 1e-6.")
    if spec.family.variable_text:
        text += f" {spec.family.name}'s text length follows the prompt: diffusers' '{mode}_anything' variant is used."
    return spec, "\n".join([text, *notes])


def check_cp(spec: PipelineSpec) -> None:
    family, name, degree = spec.family, Path(spec.model_path).name, spec.cp_degree
    if degree < 1:
        raise ParallelError(f"degree: {degree} is too small; use at least 1.")
    if spec.cp_mode not in CP_MODES:
        raise ParallelError(f"mode: '{spec.cp_mode}' is not one of {', '.join(CP_MODES)}.")
    if degree == 1:
        return
    if not family.cp_plan:
        raise ParallelError(
            f"pipeline: '{name}' is a {family.name} model ({spec.class_name}), whose transformer has no "
            f"context-parallel plan in diffusers, so its sequence cannot be split. Models that can: "
            f"{', '.join(families_with('cp_plan'))}. Remove Context Parallel; for a model that runs CFG, CFG "
            "Parallel splits its two passes instead.")
    if spec.tp_degree > 1:
        raise ParallelError("degree: Context Parallel cannot be combined with Shard TP on one transformer "
                            "(diffusers 0.42 refuses both at once). Use one of them (or Data Parallel copies of "
                            "either).")
    if spec.offload != "none":
        raise ParallelError(f"offload: '{spec.offload}' cannot be combined with Context Parallel (diffusers adds "
                            "its split to the transformer, which offload would move away); set offload to 'none' "
                            "in Load TPU Pipeline or remove Context Parallel.")
    if spec.cp_mode == "ring" and spec.kind != "cpu":
        raise ParallelError(f"mode: 'ring' needs an attention kernel that returns its log-sum-exp; diffusers' "
                            f"default one does not, and the pack provides one only on the CPU. Use 'ulysses' on "
                            f"{spec.kind}.")
    heads = transformer_heads(spec.model_path)
    if spec.cp_mode == "ulysses" and heads is not None and heads % degree:
        good = [d for d in range(2, heads + 1) if heads % d == 0]
        raise ParallelError(f"degree: Ulysses splits the {heads} attention heads of '{name}' over the ranks, and "
                            f"{degree} does not divide them; use one of {', '.join(map(str, good))}, or mode "
                            "'ring'.")
    if not family.variable_text and TEXT_TOKENS % degree:
        raise ParallelError(f"degree: {family.name} pads its prompt to {TEXT_TOKENS} tokens, which {degree} ranks "
                            "cannot split evenly; use 2, 4 or 8.")


TEXT_TOKENS = 512  # FLUX.1 / FLUX.2: prompts are padded to max_sequence_length, 512 unless compiled otherwise


def check_cp_size(spec: PipelineSpec, width: int, height: int) -> None:
    """Image tokens must split evenly over the context ranks (prompt-length text uses diffusers' 'anything'
    variant, which takes any length)."""
    degree = spec.cp_degree
    if degree == 1 or spec.family.variable_text:
        return
    tokens = (width // spec.size_factor) * (height // spec.size_factor)
    if tokens % degree:
        raise ParallelError(f"width/height: {width}x{height} makes {tokens} image tokens, which Context Parallel "
                            f"degree {degree} cannot split evenly; choose a size where (width/{spec.size_factor}) × "
                            f"(height/{spec.size_factor}) is a multiple of {degree}.")


def plan_sampling(spec: PipelineSpec, prompt_cache: bool, batched: bool,
                  true_cfg_scale: float) -> tuple[PipelineSpec, str]:
    """Sampling Options: the prompt-embedding cache, batched calls, FLUX.1's true CFG; checked, and what they do."""
    spec = spec.with_changes(prompt_cache=bool(prompt_cache), batched=bool(batched),
                             true_cfg_scale=float(true_cfg_scale))
    check_sampling(spec)
    lines = [("prompt_cache on: a prompt seen before on this model reuses its embeddings (no text encoder run, "
              "none moved to the chip under offload); the same pixels as without it."
              if spec.prompt_cache else "prompt_cache off: every image encodes its prompt again."),
             ("batched on: the images of one prompt go through the model in one call (faster where the chip has "
              "room); the pixels differ in the last bits from one call per image, and from one replica count to "
              "another." if spec.batched else
              "batched off: one call per image, so any image can be reproduced alone with any replica count.")]
    if spec.true_cfg_scale > 1:
        lines.append(f"true_cfg_scale {spec.true_cfg_scale:g}: FLUX.1 runs true CFG against the negative prompt "
                     "(two passes per step; CFG Parallel splits them).")
    return spec, "\n".join(lines)


def check_sampling(spec: PipelineSpec) -> None:
    scale = spec.true_cfg_scale
    if not (isinstance(scale, (int, float)) and 0 < scale <= 100):
        raise ParallelError(f"true_cfg_scale: {scale} is out of range; use 1 (off) up to 100.")
    if scale != 1 and spec.class_name != "FluxPipeline":
        raise ParallelError(
            f"true_cfg_scale: only FLUX.1 has a true CFG scale of its own; for {spec.family.name} leave it at 1 "
            "and use the Sample node's guidance (for Qwen-Image that is its true CFG scale).")


# ---- compile plans

MAX_WARMUP_BATCH = 64
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
    adjustments said in the plan's notes); unchanged unless its mode is 'compiled'. Idempotent."""
    if spec.mode != "compiled":
        return spec
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
    if target == "repeated blocks" and not spec.family.repeated_blocks:
        why = " (forced by offload 'model'; set offload to 'none')" if plan.target != target else ""
        raise CompileError(f"target: SD3's transformer has no repeated blocks to compile{why}. "
                           "Choose target 'whole denoiser'.")
    return spec.with_changes(compile=replace(plan, target=target, backend=backend, notes=tuple(notes)))
