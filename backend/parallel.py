"""Several chips for one pipeline: tensor parallelism (Shard TP) and data parallelism (replicas).

A worker group has `tp_degree × dp_replicas` ranks, one per chip. Rank r belongs to replica r // tp_degree and
holds shard r % tp_degree of that replica's transformer. All ranks receive the same request; each replica
draws its own contiguous slice of the images, and only the first rank of each replica sends its images back.

The first half of this module is controller-side planning and validation (reads JSON, never imports torch,
never starts a device). The second half runs only inside worker processes.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from . import device
from .models import FAMILIES, ModelError, listed_components, read_json
from .spec import PipelineSpec, SampleRequest

# ---- controller side: plans and validation (no torch, no device runtime)


def families_with_tp_plan() -> list[str]:
    return sorted({f.name for f in FAMILIES.values() if f.tp_plan})


def chip_count(kind: str) -> int | None:
    """Chips of this kind on this host, or None on the CPU (no chips: the limit is the number of cores)."""
    if kind == "tpu":
        return len(device.tpu_chips())
    if kind == "cuda":
        return device._cuda_count()
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

    degree 0 = auto: every chip of the host (on the CPU, which has no chips: 1). Raises ModelError naming the
    input, the value and the fix.
    """
    family = FAMILIES[spec.class_name]
    name = Path(spec.model_path).name
    if degree < 0:
        raise ModelError(f"degree: {degree} is not allowed; use 0 (auto: all chips) or a number of chips.")
    if not family.tp_plan:
        raise ModelError(
            f"pipeline: '{name}' is a {family.name} model ({spec.class_name}), which has no "
            f"tensor-parallel plan in diffusers, so it cannot be sharded. Models that can: "
            f"{', '.join(families_with_tp_plan())}. Remove Shard TP; to use several chips for throughput, "
            "use Data Parallel instead.")
    if spec.offload != "none":
        raise ModelError(
            f"offload: '{spec.offload}' cannot be combined with Shard TP (diffusers refuses offload on a "
            "sharded model; both decide where a weight lives). Set offload to 'none' in Load TPU Pipeline — "
            "sharding already splits the weights over the chips — or remove Shard TP.")
    kind = device.resolve_kind(spec.device)
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
    spec = spec.with_changes(tp_degree=degree, tp_text_encoders=bool(shard_text_encoders))
    check_tp(spec, kind, chips, heads)
    return spec, describe_tp(spec, heads, notes)


def check_tp(spec: PipelineSpec, kind: str, chips: int | None, heads: int | None) -> None:
    degree = spec.tp_degree
    if degree == 1:
        return
    limit = (os.cpu_count() or 1) if chips is None else chips
    where = _describe_degree_limit(kind, chips)
    if degree > limit:
        raise ModelError(f"degree: {degree} is more than {where}; use at most {limit} (or 0 for auto).")
    if chips is not None and chips % degree:
        good = [d for d in range(1, chips + 1) if chips % d == 0 and (heads is None or heads % d == 0)]
        raise ModelError(f"degree: {degree} does not divide the {chips} chips of this host; use one of "
                         f"{', '.join(map(str, good))}.")
    if heads is not None and heads % degree:
        good = [d for d in range(1, min(limit, heads) + 1)
                if heads % d == 0 and (chips is None or chips % d == 0)]
        raise ModelError(f"degree: {degree} does not divide the {heads} attention heads of "
                         f"'{Path(spec.model_path).name}' (each chip must hold whole heads); use one of "
                         f"{', '.join(map(str, good))}.")
    if spec.tp_text_encoders:
        for enc in text_encoders(spec.model_path):
            bad = [h for h in enc.heads if h % degree]
            if enc.has_tp_plan and bad:
                raise ModelError(
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
        raise ModelError(f"replicas: {replicas} is not allowed; use 0 (auto: all chips) or a number of "
                         "copies.")
    kind = device.resolve_kind(spec.device)
    chips = chip_count(kind)
    notes = []
    if replicas == 0:
        if chips is None:
            replicas = 1
            notes.append(f"auto on the CPU is 1 (no chips); set replicas up to "
                         f"{(os.cpu_count() or 1) // spec.tp_degree} to use more processes")
        else:
            replicas = max(1, chips // spec.tp_degree)
    spec = spec.with_changes(dp_replicas=replicas)
    check_world(spec, kind, chips)
    workers = spec.world_size
    text = (f"{replicas} replica{'s' if replicas != 1 else ''} × {spec.tp_degree} chip"
            f"{'s' if spec.tp_degree != 1 else ''} each = {workers} worker{'s' if workers != 1 else ''}. "
            "A batch (and each prompt line) is split across replicas in order; image i always uses seed + i.")
    return spec, "\n".join([text, *notes])


def check_world(spec: PipelineSpec, kind: str, chips: int | None) -> None:
    if spec.dp_replicas < 1:
        raise ModelError(f"replicas: {spec.dp_replicas} is too small; use at least 1.")
    if spec.tp_text_encoders and spec.tp_degree > 1 and spec.dp_replicas > 1 and any(
            e.has_tp_plan for e in text_encoders(spec.model_path)):
        raise ModelError(
            "shard_text_encoders: sharding text encoders cannot be combined with Data Parallel replicas > 1 "
            "yet (transformers' tensor parallelism spans the whole worker group). Turn shard_text_encoders "
            "off in Shard TP (the encoders are then replicated) or set replicas to 1.")
    limit = (os.cpu_count() or 1) if chips is None else chips
    if spec.world_size > limit:
        where = _describe_degree_limit(kind, chips)
        raise ModelError(
            f"replicas: {spec.dp_replicas} replicas × TP degree {spec.tp_degree} = {spec.world_size} "
            f"workers, but {where}; use at most {max(1, limit // spec.tp_degree)} replica(s) (or 0 for "
            "auto). Connect Data Parallel after Shard TP so that auto accounts for the degree.")


def check_spec(spec: PipelineSpec) -> None:
    """Re-checks the parallel layout of a spec before any worker is started (specs may come from scripts)."""
    if spec.tp_degree == 1 and spec.dp_replicas == 1:
        return
    kind = device.resolve_kind(spec.device)
    chips = chip_count(kind)
    if spec.tp_degree < 1:
        raise ModelError(f"degree: {spec.tp_degree} is too small; use at least 1.")
    if spec.tp_degree > 1:
        family = FAMILIES[spec.class_name]
        if not family.tp_plan or spec.offload != "none":
            plan_tp(spec, spec.tp_degree, spec.tp_text_encoders)  # raises the same message the node gives
        check_tp(spec, kind, chips, transformer_heads(spec.model_path))
    check_world(spec, kind, chips)


def prompts_of(req: SampleRequest) -> list[str]:
    """The prompts of a request: one, or each non-empty line when prompt_per_line is on."""
    if req.prompt_per_line:
        return [line.strip() for line in req.prompt.splitlines() if line.strip()]
    return [req.prompt]


def images_of(req: SampleRequest) -> list[tuple[str, int]]:
    """Every image of a request in order, as (prompt, seed): batch_size images per prompt, global image i
    uses seed + i wherever it is drawn."""
    prompts = prompts_of(req)
    return [(p, (req.seed + i * req.batch_size + j) % 2**64) for i, p in enumerate(prompts)
            for j in range(req.batch_size)]


def share(n: int, replicas: int, replica: int) -> range:
    """Replica `replica`'s contiguous slice of n images; the first n % replicas replicas take one more."""
    base, extra = divmod(n, replicas)
    start = replica * base + min(replica, extra)
    return range(start, start + base + (1 if replica < extra else 0))


@dataclass(frozen=True)
class Layout:
    """Where a rank sits: which replica, which shard, and whether it sends that replica's images back."""

    tp_degree: int
    world_size: int
    rank: int

    @property
    def replicas(self) -> int:
        return self.world_size // self.tp_degree

    @property
    def replica(self) -> int:
        return self.rank // self.tp_degree

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp_degree

    @property
    def leader(self) -> bool:
        return self.tp_rank == 0

    def my_images(self, req: SampleRequest) -> list[tuple[str, int]]:
        images = images_of(req)
        return [images[i] for i in share(len(images), self.replicas, self.replica)]


# ---- Below: worker-side only (imports torch, may start a device runtime).


def patch_diffusers_tp_for_cpu() -> None:
    """Lets diffusers' TensorParallelConfig run on a CPU (gloo) mesh. CPU workers only; idempotent.

    diffusers 0.42 allows TP only on cuda/neuron/tpu/xpu and resolves the device as
    `rank % torch.accelerator.device_count()`, which divides by zero on a CPU host. This adds "cpu" to the
    gate and resolves the device and mesh to the CPU; the installed package is not changed on disk, and it
    is never applied on TPU or CUDA workers.
    """
    import diffusers.hooks.tensor_parallel as tp_hooks
    import torch
    import torch.distributed as dist
    from diffusers.models._modeling_parallel import ParallelConfig, TensorParallelConfig
    from diffusers.models.modeling_utils import ModelMixin
    from torch.distributed.device_mesh import init_device_mesh

    if "cpu" not in tp_hooks._SUPPORTED_TP_DEVICES:
        tp_hooks._SUPPORTED_TP_DEVICES = (*tp_hooks._SUPPORTED_TP_DEVICES, "cpu")
    if getattr(ModelMixin._resolve_parallel_config, "_cpu_tp", False):
        return
    original = ModelMixin._resolve_parallel_config

    def _resolve_parallel_config(self, config):
        if isinstance(config, TensorParallelConfig):
            config = ParallelConfig(tensor_parallel_config=config)
        tp = getattr(config, "tensor_parallel_config", None)
        if tp is None or not dist.is_initialized():
            return original(self, config)
        mesh = tp.mesh
        if mesh is None:
            mesh = init_device_mesh("cpu", (tp.tp_degree,), mesh_dim_names=("tp",))
        config.setup(dist.get_rank(), dist.get_world_size(), torch.device("cpu"), mesh=mesh)
        self._parallel_config = config
        return config

    _resolve_parallel_config._cpu_tp = True
    ModelMixin._resolve_parallel_config = _resolve_parallel_config


def tp_mesh(kind: str, tp_degree: int):
    """This rank's tensor-parallel mesh: the whole group, or its replica's row of a (dp, tp) mesh.

    Collective: every rank of the group must call it, in the same order.
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    replicas = dist.get_world_size() // tp_degree
    if replicas == 1:
        return init_device_mesh(kind, (tp_degree,), mesh_dim_names=("tp",))
    return init_device_mesh(kind, (replicas, tp_degree), mesh_dim_names=("dp", "tp"))["tp"]


def tp_load_kwargs(spec: PipelineSpec, kind: str) -> dict[str, dict]:
    """The extra from_pretrained arguments, per component, that load it sharded (see loading.load_pipeline).

    The transformer gets `parallel_config` (each rank reads only its slices of the safetensors); with
    `tp_text_encoders`, each text encoder that has a transformers TP plan gets a `distributed_config`.
    Collective (builds the device mesh): every rank must call it.
    """
    from diffusers import TensorParallelConfig

    if kind == "cpu":
        patch_diffusers_tp_for_cpu()
    extra = {"transformer": {"parallel_config": TensorParallelConfig(tp_degree=spec.tp_degree,
                                                                     mesh=tp_mesh(kind, spec.tp_degree))}}
    if spec.tp_text_encoders:
        from transformers.distributed import DistributedConfig

        for enc in text_encoders(spec.model_path):
            if enc.has_tp_plan:
                extra[enc.name] = {"distributed_config": DistributedConfig(tp_size=spec.tp_degree)}
    return extra


class StopVote:
    """Whether to stop, agreed by every rank of one tensor-parallel group.

    The ranks of a sharded model run collectives at every layer: if one stopped a step earlier than the
    others, they would wait for it forever. So at each step end every rank contributes its own interrupt
    flag and all stop if any saw it. The vote goes over a CPU (gloo) group, so it never syncs the device.
    Without tensor parallelism each rank simply decides alone.
    """

    def __init__(self, tp_degree: int):
        import torch.distributed as dist

        self.group = None
        if tp_degree > 1:
            world, rank = dist.get_world_size(), dist.get_rank()
            for start in range(0, world, tp_degree):  # new_group is collective: all ranks create all groups
                group = dist.new_group(list(range(start, start + tp_degree)), backend="gloo")
                if start <= rank < start + tp_degree:
                    self.group = group

    def __call__(self, local: bool) -> bool:
        if self.group is None:
            return local
        import torch
        import torch.distributed as dist

        flag = torch.tensor([1 if local else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
        return bool(flag.item())
