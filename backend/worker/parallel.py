"""Tensor parallelism inside the worker group: device meshes, sharded loading, and the stop vote.

The controller has checked the layout (`controller.plans`); here each rank builds its part. Meshes and the
vote's process groups are made once per worker process and reused by every reload, so reloading a sharded
model never leaves process groups behind.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from functools import cache
from typing import TypeVar

from ..protocol.spec import Layout, PipelineSpec

T = TypeVar("T")
LOAD_TURN_TIMEOUT_S = 3600.0  # how long a replica may wait for the ones loading before it


def patch_diffusers_tp_device(kind: str) -> None:
    """Makes diffusers' TensorParallelConfig place every rank on this worker's own device. CPU and TPU workers
    only (never CUDA, where rank % device_count is right); idempotent; nothing on disk changes.

    diffusers 0.42 resolves a rank's device as `rank % torch.accelerator.device_count()`. On TPU each process
    has one chip, at index 0 (TorchTPU), so every rank must resolve to tpu:0, as it does once the runtime has
    started; before that the count is every device on the PCI bus. On a CPU host the count is 0 (a division by
    zero) and "cpu" is not in diffusers' TP device gate: the gate gets "cpu" and ranks resolve to the CPU.
    """
    import diffusers.hooks.tensor_parallel as tp_hooks
    import torch
    import torch.distributed as dist
    from diffusers.models._modeling_parallel import ParallelConfig, TensorParallelConfig
    from diffusers.models.modeling_utils import ModelMixin
    from torch.distributed.device_mesh import init_device_mesh

    if kind not in tp_hooks._SUPPORTED_TP_DEVICES:
        tp_hooks._SUPPORTED_TP_DEVICES = (*tp_hooks._SUPPORTED_TP_DEVICES, kind)
    if getattr(ModelMixin._resolve_parallel_config, "_own_device", None) == kind:
        return
    original = getattr(ModelMixin._resolve_parallel_config, "_original", ModelMixin._resolve_parallel_config)
    device = torch.device("tpu", 0) if kind == "tpu" else torch.device("cpu")

    def _resolve_parallel_config(self, config):
        if isinstance(config, TensorParallelConfig):
            config = ParallelConfig(tensor_parallel_config=config)
        tp = getattr(config, "tensor_parallel_config", None)
        if tp is None or not dist.is_initialized():
            return original(self, config)
        mesh = tp.mesh
        if mesh is None:
            mesh = init_device_mesh(kind, (tp.tp_degree,), mesh_dim_names=("tp",))
        config.setup(dist.get_rank(), dist.get_world_size(), device, mesh=mesh)
        self._parallel_config = config
        return config

    _resolve_parallel_config._own_device = kind
    _resolve_parallel_config._original = original
    ModelMixin._resolve_parallel_config = _resolve_parallel_config


@cache
def tp_mesh(kind: str, tp_degree: int):
    """This rank's tensor-parallel mesh: the whole group, or its replica's row of a (dp, tp) mesh. Made once per
    process and degree (the group's world size is fixed), so reloads reuse its process groups.

    Collective the first time: every rank of the group must call it, in the same order.
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    replicas = dist.get_world_size() // tp_degree
    if replicas == 1:
        return init_device_mesh(kind, (tp_degree,), mesh_dim_names=("tp",))
    return init_device_mesh(kind, (replicas, tp_degree), mesh_dim_names=("dp", "tp"))["tp"]


def tp_load_kwargs(spec: PipelineSpec, kind: str) -> dict[str, dict]:
    """The extra from_pretrained arguments, per component, that load it sharded (see loading.load_pipeline).

    The transformer gets `parallel_config` (each rank reads only its slices of the safetensors); each text
    encoder the controller chose to shard (`spec.sharded_encoders`) gets a `distributed_config`.
    Collective (builds the device mesh the first time): every rank must call it.
    """
    from diffusers import TensorParallelConfig

    if kind in ("cpu", "tpu"):
        patch_diffusers_tp_device(kind)
    extra = {"transformer": {"parallel_config": TensorParallelConfig(tp_degree=spec.tp_degree,
                                                                     mesh=tp_mesh(kind, spec.tp_degree))}}
    if spec.sharded_encoders:
        from transformers.distributed import DistributedConfig

        for name in spec.sharded_encoders:
            extra[name] = {"distributed_config": DistributedConfig(tp_size=spec.tp_degree)}
    return extra


class StopVote:
    """Whether to stop, agreed by every rank of one tensor-parallel group.

    The ranks of a sharded model run collectives at every layer: if one stopped a step earlier than the
    others, they would wait for it forever. So at each step end every rank contributes its own interrupt
    flag and all stop if any saw it. The vote goes over a CPU (gloo) group, so it never syncs the device.
    Without tensor parallelism each rank simply decides alone.
    """

    def __init__(self, tp_degree: int):
        self.group = _vote_group(tp_degree) if tp_degree > 1 else None

    def __call__(self, local: bool) -> bool:
        if self.group is None:
            return local
        import torch
        import torch.distributed as dist

        flag = torch.tensor([1 if local else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
        return bool(flag.item())


@cache
def _vote_group(tp_degree: int):
    """This rank's CPU (gloo) group of its tensor-parallel peers; made once per process and degree.
    Collective the first time: new_group needs every rank to create every group."""
    import torch.distributed as dist

    world, rank, mine = dist.get_world_size(), dist.get_rank(), None
    for start in range(0, world, tp_degree):
        group = dist.new_group(list(range(start, start + tp_degree)), backend="gloo")
        if start <= rank < start + tp_degree:
            mine = group
    return mine


def in_turn(spec: PipelineSpec, rank: int, world_size: int, load: Callable[[], T],
            status: Callable[[str], None]) -> T:
    """`load()`, one Data Parallel replica after another when the spec says so (`load_in_turn`): replica r
    starts once replicas 0..r-1 have their weights on their devices, so the host holds about one copy in
    flight instead of one per replica. The ranks of one replica load together (a sharded load has
    collectives among them). Every rank passes every turn's barrier, even after its own load failed, so a
    failure never leaves the others waiting; it is raised once all turns are done.

    Collective: every rank of the group calls it for the same spec.
    """
    if not spec.load_in_turn or world_size == spec.tp_degree:
        return load()
    import torch.distributed as dist

    group = _turn_group()
    mine = Layout(spec.tp_degree, world_size, rank)
    result: T | None = None
    error: BaseException | None = None
    for turn in range(mine.replicas):
        if turn == mine.replica:
            try:
                result = load()
            except BaseException as e:  # re-raised below, after the other replicas' turns
                error = e
            if turn + 1 < mine.replicas:
                status(f"replica {turn + 1} of {mine.replicas} loaded; the next one loads now (one replica at a "
                       "time keeps host memory low)")
        dist.barrier(group=group)
    if error is not None:
        raise error
    return result  # type: ignore[return-value]


@cache
def _turn_group():
    """A CPU (gloo) group of the whole worker group for the load turns, with a bound long enough for one
    replica's load. Made once per process; collective the first time."""
    import torch.distributed as dist

    return dist.new_group(backend="gloo", timeout=timedelta(seconds=LOAD_TURN_TIMEOUT_S))
