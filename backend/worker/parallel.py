"""Tensor parallelism inside the worker group: device meshes, sharded loading, and the stop vote.

The controller has checked the layout (`controller.plans`); here each rank builds its part. Meshes and the
vote's process groups are made once per worker process and reused by every reload, so reloading a sharded
model never leaves process groups behind.
"""

from __future__ import annotations

from functools import cache

from ..protocol.spec import PipelineSpec


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

    if kind == "cpu":
        patch_diffusers_tp_for_cpu()
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
