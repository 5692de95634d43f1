"""Parallel layouts and their checks: Shard TP, Data Parallel, CFG Parallel and Context Parallel, and the
layout a pipeline gets by default. Controller side: reads configs, never imports torch, never starts a device.

A worker group has `replicas × cfg × context × tp` ranks, one per chip, tp fastest (`protocol.spec.Layout`): the
`model_ranks = tp × context × cfg` ranks of one replica run one copy of the model together. All ranks receive the
same request; each replica draws its own contiguous slice of the images, and only the first rank of each replica
sends its images back. Every check raises a ParallelError that names the input, the value and the fix.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .. import families
from ..families import PIPELINES
from ..protocol import settings
from ..protocol.errors import ParallelError
from ..protocol.spec import CP_MODES, PipelineSpec, SampleRequest
from ..protocol.units import or_list
from . import capacity, cp_sizes, hosts, offload
from .capacity import Capacity
from .components import Components


def families_with_tp_plan() -> list[str]:
    return sorted({f.name for f in PIPELINES.values() if f.tp_plan})


def families_with(attribute: str) -> list[str]:
    return sorted({f.name for f in PIPELINES.values() if getattr(f, attribute)})


def plan_tp(spec: PipelineSpec, degree: int, shard_text_encoders: bool = False) -> tuple[PipelineSpec, str]:
    """Checks a Shard TP request against the model and this host; returns the new spec and what will happen.

    degree 0 = auto: the most devices of the host that the heads allow and that TorchTPU launches (on the CPU,
    which has no chips: 1). A degree that needs Data Parallel to make a group TorchTPU launches (TP 2 on a v5e
    host, which launches 1, 4 or 8 workers) is accepted with a note; the complete layout is checked when Data
    Parallel is added and again before anything starts. Raises ParallelError naming the input, the value and
    the fix.
    """
    if degree < 0:
        raise ParallelError(f"degree: {degree} is not allowed; use 0 (auto: all chips) or a number of chips.")
    _check_shardable(spec)
    cap, parts = capacity.host_capacity(spec.kind), Components(spec)
    heads = parts.heads
    notes = []
    if degree == 0:
        if not cap.chips:
            degree = 1
            notes.append(f"auto on the CPU is 1 (no chips); set degree up to {cap.limit} to use more processes")
        else:
            good = [d for d in cap.tp_degrees(heads) if cap.launches(d * spec.dp_replicas)]
            degree = max(good, default=1)
            if degree != cap.limit:
                notes.append(f"auto: {degree} of {cap.limit} devices, the largest degree that divides the {heads} "
                             "attention heads and makes a group this host launches")
    spec = with_sharded_encoders(spec.with_changes(tp_degree=degree, tp_text_encoders=bool(shard_text_encoders)),
                                 parts)
    check_tp(spec, cap, parts)
    if spec.dp_replicas > 1:  # Data Parallel came first: the layout is complete
        check_world(spec, cap, capacity.span(spec.kind, cap), parts)
    elif not cap.launches(spec.world_size):
        notes.append(_incomplete_note(spec, cap))
    if spec.offload == "auto":
        notes.append(offload.choose_offload(spec).reason)
    return spec, describe_tp(spec, parts, notes)


def _check_shardable(spec: PipelineSpec) -> None:
    """A model Shard TP can split with this offload (the node's message, and the same before a Sample)."""
    family, name = PIPELINES[spec.class_name], Path(spec.model_path).name
    if not family.tp_plan:
        raise ParallelError(
            f"pipeline: '{name}' is a {family.name} model ({spec.class_name}), which has no "
            f"tensor-parallel plan in diffusers, so it cannot be sharded. Models that can: "
            f"{', '.join(families_with_tp_plan())}. Remove Shard TP; to use several chips for throughput, "
            "use Data Parallel instead.")
    if spec.offload not in ("none", "auto"):
        raise ParallelError(
            f"offload: '{spec.offload}' cannot be combined with Shard TP (diffusers refuses offload on a "
            "sharded model; both decide where a weight lives). Set offload to 'none' or 'auto' in Load TPU "
            "Pipeline — sharding already splits the weights over the chips — or remove Shard TP.")


def _world_or_note(spec: PipelineSpec, cap: Capacity, parts: Components) -> list[str]:
    """After a CFG or Context Parallel node: the whole group checked where it is complete (Data Parallel came
    first, or it launches as it is); else, where Data Parallel after the node makes a group TorchTPU launches (CFG
    Parallel 2 on a v6e host that launches 1, 4 or 8 workers: with Data Parallel 2 or 4), a note saying so, as
    Shard TP does; the complete layout is checked again before anything starts."""
    single = capacity.span(spec.kind, cap) is None
    if (spec.dp_replicas > 1 or not single or cap.launches(spec.world_size) or spec.world_size > cap.limit
            or not cap.replica_counts(spec.model_ranks)):
        check_world(spec, cap, capacity.span(spec.kind, cap), parts)
        return []
    return [_incomplete_note(spec, cap)]


def _incomplete_note(spec: PipelineSpec, cap: Capacity) -> str:
    """What a layout node's group (Shard TP, CFG or Context Parallel) that TorchTPU does not launch by itself needs
    (TPU)."""
    counts = cap.replica_counts(spec.model_ranks)  # one copy: TP × context × CFG
    if spec.world_size == 1 and counts:
        return (f"TorchTPU launches {cap.sizes_text()} worker processes on this host ({cap.where}), not 1: "
                f"without Data Parallel this pipeline runs as Data Parallel {counts[0]}")
    return (f"TorchTPU launches {cap.sizes_text()} worker processes on this host ({cap.where}), not "
            f"{spec.world_size}: add Data Parallel after this node with replicas {or_list(counts)} (or 0 = auto)")


def check_tp(spec: PipelineSpec, cap: Capacity, parts: Components) -> None:
    degree = spec.tp_degree
    if degree == 1:
        return
    gguf = next((c for c in spec.source.components if c.quant == "gguf"), None) if spec.source else None
    if gguf is not None:
        raise ParallelError(f"pipeline: '{Path(gguf.path).name}' is a GGUF file, whose quantized weights cannot be "
                            "sharded. Remove Shard TP, or use the .safetensors version of the model.")
    if degree > cap.limit:
        raise ParallelError(f"degree: {degree} is more than {cap.where}; use at most {cap.limit} (or 0 for auto).")
    heads = parts.heads
    if degree not in cap.tp_degrees(None):
        good = ", ".join(map(str, cap.tp_degrees(heads)))
        if cap.sizes is not None:
            raise ParallelError(f"degree: {degree} cannot make a group TorchTPU launches: it runs "
                                f"{cap.sizes_text()} worker processes on this host ({cap.where}); use one of {good}.")
        raise ParallelError(f"degree: {degree} does not divide the {cap.limit} chips of this host; use one of {good}.")
    if heads is not None and heads % degree:
        good = ", ".join(map(str, [d for d in cap.tp_degrees(heads) if d <= heads]))
        raise ParallelError(f"degree: {degree} does not divide the {heads} attention heads of "
                            f"'{Path(spec.model_path).name}' (each chip must hold whole heads); use one of {good}.")
    if spec.tp_text_encoders:
        for enc in parts.text_encoders:
            bad = [h for h in enc.heads if h % degree]
            if enc.has_tp_plan and bad:
                raise ParallelError(
                    f"shard_text_encoders: {enc.name} ({enc.class_name}) has {bad[0]} attention/key-value "
                    f"heads, which degree {degree} does not divide; turn shard_text_encoders off (the "
                    "encoder is then replicated on every chip) or choose a degree that divides it.")


def describe_tp(spec: PipelineSpec, parts: Components, notes: Sequence[str] = ()) -> str:
    """One line per component: what is sharded and what is replicated, shown next to the node."""
    n, heads = spec.tp_degree, parts.heads
    if n == 1:
        lines = ["degree 1: nothing is sharded (one chip per model copy)"]
    else:
        per = f", {heads // n} of {heads} heads per chip" if heads else ""
        lines = [f"transformer: sharded over {n} chips{per}{_how_ranks_read(spec)}"]
    for enc in parts.text_encoders:
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


def _how_ranks_read(spec: PipelineSpec) -> str:
    """For a transformer from an artist's file: whether each rank reads only its slices of the file (diffusers'
    own keys, read by from_pretrained) or the whole file before keeping its shard (a layout that needs a
    converter: every rank then holds the whole model in host memory while loading)."""
    part = spec.source.component("transformer") if spec.source else None
    if part is None:
        return ""
    if part.layout == "diffusers" and not part.prefix and not part.quant:
        return "; each chip reads only its slices of the file"
    return ("; each chip reads the whole file, converts it and keeps its shard (this file layout has no "
            "per-chip reader: host memory holds one copy per chip while loading)")


def plan_dp(spec: PipelineSpec, replicas: int) -> tuple[PipelineSpec, str]:
    """Checks a Data Parallel request; replicas 0 = auto = the most copies that make a group this host
    launches (all devices / tp_degree where TorchTPU allows it; on the CPU: 1)."""
    if replicas < 0:
        raise ParallelError(f"replicas: {replicas} is not allowed; use 0 (auto: all chips) or a number of "
                            "copies.")
    cap = capacity.host_capacity(spec.kind)
    across = capacity.span(spec.kind, cap)
    notes = []
    if replicas == 0:
        if across is not None:
            replicas = max(1, across.processes // spec.model_ranks)
            notes.append(f"auto: every process of the {across.hosts} host(s) that have joined "
                         f"({across.per_host} per host)")
        elif not cap.chips:
            replicas = 1
            notes.append(f"auto on the CPU is 1 (no chips); set replicas up to "
                         f"{max(1, cap.limit // spec.model_ranks)} to use more processes")
        else:
            replicas = max(cap.replica_counts(spec.model_ranks), default=max(1, cap.limit // spec.model_ranks))
    spec = spec.with_changes(dp_replicas=replicas)
    check_world(spec, cap, across, Components(spec))
    workers = spec.world_size
    per = spec.model_ranks
    text = (f"{replicas} replica{'s' if replicas != 1 else ''} × {per} chip"
            f"{'s' if per != 1 else ''} each = {workers} worker{'s' if workers != 1 else ''}. "
            "A batch (and each prompt line) is split across replicas in order; image i always uses seed + i.")
    return spec, "\n".join([text, *notes])


def check_world(spec: PipelineSpec, cap: Capacity, across: hosts.Span | None, parts: Components) -> None:
    """The whole group: replicas × one copy's ranks, a group this host (or the joined hosts) launches."""
    if spec.dp_replicas < 1:
        raise ParallelError(f"replicas: {spec.dp_replicas} is too small; use at least 1.")
    if spec.tp_text_encoders and 1 < spec.tp_degree < spec.world_size and any(
            e.has_tp_plan for e in parts.text_encoders):
        raise ParallelError(
            "shard_text_encoders: sharding text encoders cannot be combined with Data Parallel replicas > 1 "
            "or CFG Parallel yet (transformers' tensor parallelism spans the whole worker group). Turn "
            "shard_text_encoders off in Shard TP (the encoders are then replicated), or set replicas to 1 and "
            "remove CFG Parallel.")
    if across is not None:
        check_hosts(spec, cap, across)
        return
    if cap.launches(spec.world_size):
        return
    layout = (f"replicas: {spec.dp_replicas} replica{'s' if spec.dp_replicas != 1 else ''} × {_per_copy(spec)} "
              f"= {spec.world_size} worker{'s' if spec.world_size != 1 else ''}")
    counts = cap.replica_counts(spec.model_ranks)
    if cap.sizes is None:
        fix = f"use at most {max(1, cap.limit // spec.model_ranks)} replica(s) (or 0 for auto)"
    elif counts:
        fix = f"use replicas {or_list(counts)} (or 0 for auto)"
    else:
        fix = (f"no replica count works with {_per_copy(spec)}; use Shard TP degree "
               f"{or_list([d for d in cap.tp_degrees(None) if cap.replica_counts(d)])}")
    if spec.world_size > cap.limit:
        raise ParallelError(f"{layout}, but {cap.where}; {fix}. Connect Data Parallel after Shard TP, Context "
                            "Parallel and CFG Parallel so that auto accounts for them.")
    raise ParallelError(f"{layout}, but TorchTPU launches only {cap.sizes_text()} worker processes on this host "
                        f"({cap.where}); {fix}.")


def _per_copy(spec: PipelineSpec) -> str:
    """'TP degree 2', or 'TP 1 × context 2 × CFG 2': the ranks one copy of the model runs on."""
    if spec.cp_degree == 1 and spec.cfg_parallel == 1:
        return f"TP degree {spec.tp_degree}"
    return f"TP {spec.tp_degree} × context {spec.cp_degree} × CFG {spec.cfg_parallel}"


def check_hosts(spec: PipelineSpec, cap: Capacity, across: hosts.Span) -> None:
    """Several hosts: Data Parallel spans hosts, Shard TP stays within one (its chips have the fast links), and
    every host runs a group size it launches (the same on each)."""
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
    if not cap.launches(min(world, per)):
        raise ParallelError(f"replicas: {min(world, per)} worker processes per host, but TorchTPU launches only "
                            f"{cap.sizes_text()} on a host ({cap.where}); set {settings.PROCS_PER_HOST.name} to one of "
                            "them on every host.")


def default_layout(spec: PipelineSpec, cap: Capacity) -> PipelineSpec:
    """A pipeline without Shard TP or Data Parallel on a host where TorchTPU launches no group of one (v7x: a
    chip is two devices) runs as Data Parallel over the smallest group it launches (see devices.v7x_default_note).
    `cap`: this host's capacity for the spec's kind."""
    if spec.kind != "tpu" or spec.world_size != 1:
        return spec
    sizes = cap.sizes
    if sizes and 1 not in sizes:
        return spec.with_changes(dp_replicas=min(sizes))
    return spec


def with_sharded_encoders(spec: PipelineSpec, parts: Components) -> PipelineSpec:
    """`spec` naming the text encoders its tp_text_encoders choice shards: those with a transformers TP plan."""
    names = parts.shardable if spec.tp_text_encoders and spec.tp_degree > 1 else ()
    return spec.with_changes(sharded_encoders=names)


def load_order(spec: PipelineSpec) -> PipelineSpec:
    """Data Parallel replicas load one after another unless the spec says otherwise. A replica's weights pass
    through its private host memory while it loads (converted to the dtype; on TPU/CUDA they leave it once on
    the device), so in turn the host carries one load at a time instead of one per replica: bench
    `load_memory` measures 2 CPU workers at 2.0x one model's size on disk in turn against 2.7x together, and
    Data Parallel 8 of FLUX.1 on a TPU host would carry ~34 GB in flight, not ~270 GB. Each replica's load
    waits for the ones before it; with one replica nothing changes."""
    if spec.load_in_turn is not None:
        return spec
    return spec.with_changes(load_in_turn=spec.dp_replicas > 1)


def resolve_layout(spec: PipelineSpec, cap: Capacity, across: hosts.Span | None, parts: Components,
                   req: SampleRequest | None = None) -> PipelineSpec:
    """The layout of a spec about to run, filled in and checked in one visit: the default layout (v7x), the
    sharded text encoders and the load order filled in; then CFG Parallel, Context Parallel (with a request, its
    image or video tokens against the split), Shard TP and the whole group checked against the model (`parts`)
    and the host (`cap`, `across`: read once by the caller). Specs from scripts pass the checks the
    plan nodes make. Raises ParallelError naming the input, the value and the fix."""
    spec = load_order(with_sharded_encoders(default_layout(spec, cap), parts))
    if spec.cfg_parallel != 1:
        check_cfg(spec)
    if spec.cp_degree != 1:
        check_cp(spec, parts)
    if req is not None:
        cp_sizes.check_cp_size(spec, req.width, req.height, req.frames, req.frame_rate,
                               bool(req.upscale_model))
    if spec.world_size > 1 or spec.kind == "tpu":
        if spec.tp_degree < 1:
            raise ParallelError(f"degree: {spec.tp_degree} is too small; use at least 1.")
        if spec.tp_degree > 1:
            _check_shardable(spec)  # the message the node gives
            check_tp(spec, cap, parts)
        check_world(spec, cap, across, parts)
    return spec


def _distilled(spec: PipelineSpec) -> bool:
    """A model whose guidance is distilled (one pass per step) where its model_index says so (FLUX.2 [klein])."""
    key = spec.family.distilled_key
    return bool(key and spec.model_index().get(key, False))


def plan_cfg(spec: PipelineSpec) -> tuple[PipelineSpec, str]:
    """CFG Parallel: the two guidance passes of each step on two ranks; checked, and what it does for this model."""
    spec = spec.with_changes(cfg_parallel=2)
    check_cfg(spec)
    notes = _world_or_note(spec, capacity.host_capacity(spec.kind), Components(spec))
    family, name = spec.family, Path(spec.model_path).name
    if family.cfg_passes == "batch":
        what = (f"{family.name} runs CFG as one denoiser call on a doubled batch: each of 2 ranks runs half of it "
                f"(guidance above {family.cfg_above:g}; at {family.cfg_above:g} or below both run the whole call). "
                "Images match one chip within about 1e-5 (halved batches round differently).")
    elif family.true_cfg:
        what = (f"{family.name} runs two passes per step only with true CFG: set true_cfg_scale above 1 in Sampling "
                "Options and give a negative prompt (the empty one counts). Rank 0 runs the prompt's pass, rank 1 "
                "the negative prompt's: the same image as one chip, bit for bit.")
    else:
        what = (f"{family.name} runs CFG as two passes per step (guidance above {family.cfg_above:g}"
                f"{' and a negative prompt, the empty one counts' if family.guidance_arg == 'true_cfg_scale' else ''}"
                "): rank 0 runs the prompt's pass, rank 1 the negative prompt's, and they exchange their "
                "predictions once per step: the same image as one chip, bit for bit.")
    return spec, "\n".join([f"CFG Parallel on '{name}': 2 ranks per model copy. {what}", *notes])


def check_cfg(spec: PipelineSpec) -> None:
    family, name = spec.family, Path(spec.model_path).name
    if spec.cfg_parallel != 2:
        raise ParallelError(f"cfg_parallel: {spec.cfg_parallel} ranks is not supported; CFG has two passes, so "
                            "CFG Parallel uses 2 ranks (or remove the node).")
    if family.cfg_passes == "models":
        raise ParallelError(
            f"pipeline: '{name}' is a {family.name} model ({spec.class_name}): its two guidance passes are two "
            "models (a conditional and an unconditional transformer), which CFG Parallel does not split yet (it "
            "splits the passes of one denoiser). Remove CFG Parallel; use Data Parallel for more images at once.")
    if family.modular is not None and family.modular.guider:
        raise ParallelError(
            f"pipeline: '{name}' is a {family.name} model ({spec.class_name}), a diffusers modular pipeline whose "
            "guider runs both CFG passes inside its own denoise loop, which CFG Parallel does not split yet. "
            f"Remove CFG Parallel; Data Parallel runs copies of it. CFG Parallel applies to: "
            f"{families.cfg_parallel_names()}.")
    if not family.cfg_passes or _distilled(spec):
        why = (f" (diffusers' {spec.class_name} has no true CFG: no negative prompt or true_cfg_scale)"
               if any(p.true_cfg for p in families.family_of(family).pipelines) else "")
        raise ParallelError(
            f"pipeline: '{name}' is a {family.name} model ({spec.class_name}) with guidance distilled into the "
            f"model: it runs one denoiser pass per step{why}, so CFG Parallel has nothing to split. It applies to "
            f"models that run two passes per step: {families.cfg_parallel_names()}. Remove CFG Parallel; Shard "
            "TP or Context Parallel split one pass.")


def plan_cp(spec: PipelineSpec, degree: int, mode: str) -> tuple[PipelineSpec, str]:
    """Context Parallel: the transformer's token sequence split over `degree` ranks (0 = auto), through diffusers'
    ContextParallelConfig; checked, and what it does for this model."""
    if degree < 0:
        raise ParallelError(f"degree: {degree} is not allowed; use 0 (auto) or a number of ranks.")
    notes, cap, parts = [], capacity.host_capacity(spec.kind), Components(spec)
    if degree == 0:
        if not cap.chips:
            degree = 1
            notes.append(f"auto on the CPU is 1 (no chips); set degree up to {cap.limit} to use more processes")
        else:
            per = spec.tp_degree * spec.cfg_parallel
            heads = parts.heads if mode == "ulysses" else None
            degree = max((d for d in range(1, cap.limit // per + 1)
                          if (heads is None or heads % d == 0) and cap.replica_counts(per * d)), default=1)
            notes.append(f"auto: {degree} rank(s), the most the chips left after Shard TP and CFG Parallel allow"
                         + (f" that divide the {heads} attention heads" if heads else ""))
    spec = spec.with_changes(cp_degree=degree, cp_mode=mode)
    check_cp(spec, parts)
    notes += _world_or_note(spec, cap, parts)
    name = Path(spec.model_path).name
    if degree == 1:
        return spec, "\n".join(["degree 1: the sequence is not split", *notes])
    how = ("Ulysses: each rank attends over all tokens for 1/{n} of the heads (two all-to-alls per attention)"
           if mode == "ulysses" else
           "ring: each rank keeps 1/{n} of the keys and values and passes them around the ring")
    text = (f"Context Parallel on '{name}': the image and text tokens of every transformer block are split over "
            f"{degree} ranks ({how.format(n=degree)}); text encoders and VAE run on every rank. Pays off on long "
            f"sequences (large images); images match one chip within about 1e-6.")
    if spec.family.cp_packed:
        text += (f" {spec.family.name} packs the prompt's, the images', the sound's and the video's rows into one "
                 f"sequence, split as a whole: its length must be a multiple of {degree}, which the workers check "
                 "at the first step (it follows the prompt: a word more or less changes it).")
    elif spec.family.sound and spec.family.cp_tokens is not None:
        text += (f" {spec.family.name}'s sound is split too where its audio latents (as many as frames / "
                 f"frame_rate seconds take) are a multiple of {degree}; where they are not (at 25 fps they are as "
                 "many as the frames, odd) the sound runs whole on every rank, with the same result. The video's "
                 f"tokens must be a multiple of {degree}, checked before any worker starts.")
    elif spec.family.variable_text:
        text += (f" {spec.family.name}'s text length follows the prompt: its prompt embeddings are padded with "
                 f"masked tokens to a multiple of {degree}, so every rank gets the same number of tokens.")
    return spec, "\n".join([text, *notes])


def check_cp(spec: PipelineSpec, parts: Components) -> None:
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
            "context-parallel plan in diffusers, so its sequence cannot be split. "
            "Models that can: "
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
    if spec.cp_mode == "ring" and (family.variable_text or family.cp_masked_text):
        why = ("padded with masked tokens so the ranks split it evenly" if family.variable_text else
               f"padded to {family.text_tokens} tokens with a mask of its padding, which the ranks split")
        raise ParallelError(f"mode: 'ring' cannot be used with {family.name}: its prompt is {why}, and diffusers' "
                            "ring attention applies each rank's mask to every other rank's keys. Use 'ulysses'.")
    heads = parts.heads
    if spec.cp_mode == "ulysses" and heads is not None and heads % degree:
        good = [d for d in range(2, heads + 1) if heads % d == 0]
        raise ParallelError(f"degree: Ulysses splits the {heads} attention heads of '{name}' over the ranks, and "
                            f"{degree} does not divide them; use one of {', '.join(map(str, good))}, or mode "
                            "'ring'.")
    if not family.variable_text and family.text_tokens % degree:
        good = [d for d in range(2, 9) if family.text_tokens % d == 0]
        raise ParallelError(f"degree: {family.name} pads its prompt to {family.text_tokens} tokens, which {degree} "
                            f"ranks cannot split evenly; use {or_list(good)}.")
