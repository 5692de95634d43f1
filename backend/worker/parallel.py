"""Splitting one model over ranks inside the worker group: device meshes, tensor- and context-parallel loading
(diffusers' own configs), the CFG peers' group, and the stop vote.

The controller has checked the layout (`controller.plans`); here each rank builds its part. Meshes and the
vote's process groups are made once per worker process and reused by every reload, so reloading a sharded
model never leaves process groups behind.
"""

from __future__ import annotations

from functools import cache

from ..protocol.spec import PipelineSpec


def patch_diffusers_parallel_for_cpu() -> None:
    """Lets diffusers' TensorParallelConfig and ContextParallelConfig run on a CPU (gloo) mesh. CPU workers only;
    idempotent.

    diffusers 0.42 allows TP only on cuda/neuron/tpu/xpu and resolves the device of either parallelism as
    `rank % torch.accelerator.device_count()`, which divides by zero on a CPU host. This adds "cpu" to the TP
    gate and resolves the device and mesh to the CPU; ring attention gets the log-sum-exp it needs from the CPU
    attention kernel (`_patch_native_lse_for_cpu`). The installed package is not changed on disk, and none of
    this is applied on TPU or CUDA workers.
    """
    import diffusers.hooks.tensor_parallel as tp_hooks
    import torch
    import torch.distributed as dist
    from diffusers.models._modeling_parallel import (
        ContextParallelConfig,
        ParallelConfig,
        TensorParallelConfig,
    )
    from diffusers.models.modeling_utils import ModelMixin
    from torch.distributed.device_mesh import init_device_mesh

    if "cpu" not in tp_hooks._SUPPORTED_TP_DEVICES:
        tp_hooks._SUPPORTED_TP_DEVICES = (*tp_hooks._SUPPORTED_TP_DEVICES, "cpu")
    _patch_native_lse_for_cpu()
    if getattr(ModelMixin._resolve_parallel_config, "_cpu_parallel", False):
        return
    original = ModelMixin._resolve_parallel_config

    def _resolve_parallel_config(self, config):
        if isinstance(config, ContextParallelConfig):
            config = ParallelConfig(context_parallel_config=config)
        elif isinstance(config, TensorParallelConfig):
            config = ParallelConfig(tensor_parallel_config=config)
        cp, tp = config.context_parallel_config, config.tensor_parallel_config
        if (cp is None and tp is None) or not dist.is_initialized():
            return original(self, config)
        if cp is not None:
            mesh = cp.mesh or init_device_mesh("cpu", cp.mesh_shape, mesh_dim_names=cp.mesh_dim_names)
        else:
            mesh = tp.mesh or init_device_mesh("cpu", (tp.tp_degree,), mesh_dim_names=("tp",))
        config.setup(dist.get_rank(), dist.get_world_size(), torch.device("cpu"), mesh=mesh)
        self._parallel_config = config
        return config

    _resolve_parallel_config._cpu_parallel = True
    ModelMixin._resolve_parallel_config = _resolve_parallel_config


def _patch_native_lse_for_cpu() -> None:
    """Ring attention asks the attention op for its log-sum-exp, which diffusers' 'native' (SDPA) op refuses.
    On the CPU, `return_lse=True` is answered by aten's CPU flash-attention kernel, which returns it (or by the
    plain formula when there is a mask); everything else goes to the original op."""
    import diffusers.models.attention_dispatch as dispatch
    import torch

    original = dispatch._native_attention_forward_op
    if getattr(original, "_cpu_lse", False):
        return

    def forward_op(ctx, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                   enable_gqa=False, return_lse=False, _save_ctx=True, _parallel_config=None):
        if not return_lse or query.device.type != "cpu":
            return original(ctx, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, return_lse,
                            _save_ctx=_save_ctx, _parallel_config=_parallel_config)
        q, k, v = (x.transpose(1, 2) for x in (query, key, value))  # (B, S, H, D) -> (B, H, S, D)
        if attn_mask is None and not enable_gqa:
            out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, dropout_p, is_causal,
                                                                                 scale=scale)[:2]
        else:
            scores = (q @ k.transpose(-1, -2)) * (scale if scale is not None else q.shape[-1] ** -0.5)
            if attn_mask is not None:
                mask = attn_mask if attn_mask.dtype != torch.bool else torch.zeros_like(
                    attn_mask, dtype=scores.dtype).masked_fill(~attn_mask, float("-inf"))
                scores = scores + mask
            lse = torch.logsumexp(scores, dim=-1)
            out = torch.softmax(scores, dim=-1) @ v
        return out.transpose(1, 2).contiguous(), lse.transpose(1, 2).contiguous()

    forward_op._cpu_lse = True
    dispatch._native_attention_forward_op = forward_op


@cache
def group_mesh(kind: str, replicas: int, cfg: int, ring: int, ulysses: int, tp: int):
    """The group's device mesh, rank order replica × cfg × context (ring × ulysses) × tp, tp fastest
    (`protocol.spec.Layout`). Only the dimensions in use are made (a dimension of one rank would only add
    process groups); "ring" and "ulysses" come together, as diffusers' ContextParallelConfig wants both. Made
    once per process and layout, so reloads reuse its process groups.

    Collective the first time: every rank of the group must call it, in the same order.
    """
    from torch.distributed.device_mesh import init_device_mesh

    context = ring * ulysses > 1
    dims = [(name, size) for name, size in (("dp", replicas), ("cfg", cfg), ("ring", ring), ("ulysses", ulysses),
                                            ("tp", tp))
            if size > 1 or (context and name in ("ring", "ulysses"))]
    return init_device_mesh(kind, tuple(s for _, s in dims), mesh_dim_names=tuple(n for n, _ in dims))


def spec_mesh(spec: PipelineSpec, kind: str):
    """`group_mesh` for the layout of `spec` (collective the first time)."""
    import torch.distributed as dist

    ring = spec.cp_degree if spec.cp_mode == "ring" else 1
    ulysses = spec.cp_degree if spec.cp_mode == "ulysses" else 1
    return group_mesh(kind, dist.get_world_size() // spec.model_ranks, spec.cfg_parallel, ring, ulysses,
                      spec.tp_degree)


def load_kwargs(spec: PipelineSpec, kind: str) -> dict[str, dict] | None:
    """The extra from_pretrained arguments, per component, that load it sharded (see loading.load_pipeline), or
    None when the model is not split.

    Tensor parallel: the transformer gets `parallel_config` (each rank reads only its slices of the safetensors);
    each text encoder the controller chose to shard (`spec.sharded_encoders`) gets a `distributed_config`.
    Context parallel: the transformer gets a ContextParallelConfig (Ulysses or ring over the context ranks; the
    "anything" variants where the text length follows the prompt, Qwen-Image), and diffusers adds its hooks.
    Collective (builds the device mesh the first time): every rank must call it.
    """
    if spec.tp_degree == 1 and spec.cp_degree == 1:
        return None
    from diffusers import ContextParallelConfig, ParallelConfig, TensorParallelConfig

    if kind == "cpu":
        patch_diffusers_parallel_for_cpu()
    mesh = spec_mesh(spec, kind)
    if spec.cp_degree > 1:  # the controller refuses context parallel together with tensor parallel
        anything = spec.family.variable_text
        degrees = ({"ring_degree": spec.cp_degree, "ring_anything": anything} if spec.cp_mode == "ring" else
                   {"ulysses_degree": spec.cp_degree, "ulysses_anything": anything})
        # wrapped in ParallelConfig: from_pretrained reads `.tensor_parallel_config` off a bare CP config
        config = ParallelConfig(context_parallel_config=ContextParallelConfig(**degrees, mesh=mesh))
        return {"transformer": {"parallel_config": config}}
    extra = {"transformer": {"parallel_config": TensorParallelConfig(tp_degree=spec.tp_degree, mesh=mesh["tp"])}}
    if spec.sharded_encoders:
        from transformers.distributed import DistributedConfig

        for name in spec.sharded_encoders:
            extra[name] = {"distributed_config": DistributedConfig(tp_size=spec.tp_degree)}
    return extra


def cfg_group(spec: PipelineSpec, kind: str):
    """This rank's CFG peers (same replica, same context and TP shard): the process group CFG Parallel exchanges
    its branches over. Collective the first time."""
    return spec_mesh(spec, kind)["cfg"].get_group()


class StopVote:
    """Whether to stop, agreed by every rank that runs one copy of the model (TP, context and CFG peers).

    The ranks of a split model run collectives at every layer or step: if one stopped a step earlier than the
    others, they would wait for it forever. So at each step end every rank contributes its own interrupt
    flag and all stop if any saw it. The vote goes over a CPU (gloo) group, so it never syncs the device.
    A model on one rank simply decides alone.
    """

    def __init__(self, model_ranks: int):
        self.group = _vote_group(model_ranks) if model_ranks > 1 else None

    def __call__(self, local: bool) -> bool:
        if self.group is None:
            return local
        import torch
        import torch.distributed as dist

        flag = torch.tensor([1 if local else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
        return bool(flag.item())


@cache
def _vote_group(model_ranks: int):
    """This rank's CPU (gloo) group of the ranks of its replica (contiguous); made once per process and size.
    Collective the first time: new_group needs every rank to create every group."""
    import torch.distributed as dist

    world, rank, mine = dist.get_world_size(), dist.get_rank(), None
    for start in range(0, world, model_ranks):
        group = dist.new_group(list(range(start, start + model_ranks)), backend="gloo")
        if start <= rank < start + model_ranks:
            mine = group
    return mine
