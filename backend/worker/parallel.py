"""Splitting one model over ranks inside the worker group: device meshes, tensor- and context-parallel loading
(diffusers' own configs), the CFG peers' group, and the stop vote.

The controller has checked the layout (`controller.layouts`, `controller.resolve`); here each rank builds its part. Meshes and the
vote's process groups are made once per worker process and reused by every reload, so reloading a sharded
model never leaves process groups behind.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from datetime import timedelta
from functools import cache
from typing import Any, TypeVar

from ..protocol.errors import ParallelError
from ..protocol.spec import PipelineSpec

T = TypeVar("T")
LOAD_TURN_TIMEOUT_S = 3600.0  # how long a replica may wait for the ones loading before it


def patch_diffusers_parallel_device(kind: str) -> None:
    """Makes diffusers' TensorParallelConfig and ContextParallelConfig place every rank on this worker's own
    device. CPU and TPU workers only (never CUDA, where rank % device_count is right); idempotent; nothing on
    disk changes.

    diffusers 0.42 resolves a rank's device as `rank % torch.accelerator.device_count()`. On TPU each process
    has one chip, at index 0 (TorchTPU), so every rank must resolve to tpu:0, as it does once the runtime has
    started; before that the count is every device on the PCI bus. On a CPU host the count is 0 (a division by
    zero) and "cpu" is not in diffusers' TP device gate: the gate gets "cpu" and ranks resolve to the CPU; ring
    attention gets the log-sum-exp it needs from the CPU attention kernel (`_patch_native_lse_for_cpu`).
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

    if kind not in tp_hooks._SUPPORTED_TP_DEVICES:
        tp_hooks._SUPPORTED_TP_DEVICES = (*tp_hooks._SUPPORTED_TP_DEVICES, kind)
    if kind == "cpu":
        _patch_native_lse_for_cpu()
    if getattr(ModelMixin._resolve_parallel_config, "_own_device", None) == kind:
        return
    original = getattr(ModelMixin._resolve_parallel_config, "_original", ModelMixin._resolve_parallel_config)
    device = torch.device("tpu", 0) if kind == "tpu" else torch.device("cpu")

    def _resolve_parallel_config(self, config):
        if isinstance(config, ContextParallelConfig):
            config = ParallelConfig(context_parallel_config=config)
        elif isinstance(config, TensorParallelConfig):
            config = ParallelConfig(tensor_parallel_config=config)
        cp, tp = config.context_parallel_config, config.tensor_parallel_config
        if (cp is None and tp is None) or not dist.is_initialized():
            return original(self, config)
        if cp is not None:
            mesh = cp.mesh or init_device_mesh(kind, cp.mesh_shape, mesh_dim_names=cp.mesh_dim_names)
        else:
            mesh = tp.mesh or init_device_mesh(kind, (tp.tp_degree,), mesh_dim_names=("tp",))
        config.setup(dist.get_rank(), dist.get_world_size(), device, mesh=mesh)
        self._parallel_config = config
        return config

    _resolve_parallel_config._own_device = kind
    _resolve_parallel_config._original = original
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
    Context parallel: the transformer (and a second expert, transformer_2) gets a ContextParallelConfig (Ulysses
    or ring over the context ranks), and diffusers adds its hooks; every split is even (Qwen-Image's prompt is padded: `even_text`).
    Collective (builds the device mesh the first time): every rank must call it.
    """
    if spec.tp_degree == 1 and spec.cp_degree == 1:
        return None
    from diffusers import ParallelConfig, TensorParallelConfig

    if kind in ("cpu", "tpu"):
        patch_diffusers_parallel_device(kind)
    mesh = spec_mesh(spec, kind)
    if spec.cp_degree > 1:  # the controller refuses context parallel together with tensor parallel
        # Every split is even (`even_text`, `check_even_split`): diffusers' plain Ulysses, whose all-to-all has
        # equal splits, the only kind TorchTPU's all_to_all_single takes (its "anything" variants exchange sizes
        # and split unevenly).
        degrees = ({"ring_degree": spec.cp_degree} if spec.cp_mode == "ring" else
                   {"ulysses_degree": spec.cp_degree})
        # wrapped in ParallelConfig: from_pretrained reads `.tensor_parallel_config` off a bare CP config. Both
        # experts of a pair (Wan 2.2 A14B's transformer_2) get the same layout, each its own config (diffusers
        # sets a config up on the model it is given), and MiniMax H3's ref2va partition (transformer_ref); a
        # pipeline without one never reads its entry.
        # The family's plan where it declares one in place of diffusers' (`planned_cp_config`).
        _patch_ulysses_mask_heads()
        make = planned_cp_config(spec)
        return {name: {"parallel_config": ParallelConfig(context_parallel_config=make(**degrees, mesh=mesh))}
                for name in ("transformer", "transformer_2", "transformer_ref")}
    extra = {"transformer": {"parallel_config": TensorParallelConfig(tp_degree=spec.tp_degree, mesh=mesh["tp"])}}
    if spec.sharded_encoders:
        from transformers.distributed import DistributedConfig

        for name in spec.sharded_encoders:
            extra[name] = {"distributed_config": DistributedConfig(tp_size=spec.tp_degree)}
    return extra


def planned_cp_config(spec: PipelineSpec) -> Callable[..., Any]:
    """diffusers' ContextParallelConfig, made to carry the plans the family declares in place of diffusers' own
    `_cp_plan` (Pipeline.cp_plan_module: that module's PLANS, by denoiser class; LTX-2's does not fit its rotary
    embeddings), and what follows each call's shapes once it is applied (its FOLLOW, by class, where it has one:
    LTX-2's sound stays whole where it does not split). This is the one place a family's plan is applied:
    diffusers' enable_parallelism, which every context-parallel load reaches (from_pretrained's parallel_config,
    a converted or modular denoiser), takes the plan for the model's class and config (`_use_family_plans`). A
    family without one keeps diffusers'."""
    from diffusers import ContextParallelConfig

    module = spec.family.cp_plan_module
    if not module:
        return ContextParallelConfig
    from .. import families

    declared = families.module(spec.family.family, module)
    plans, follow = declared.PLANS, getattr(declared, "FOLLOW", {})
    _use_family_plans()

    def config(**kwargs: Any) -> Any:
        made = ContextParallelConfig(**kwargs)
        made.family_plans, made.family_follow = plans, follow  # read by _use_family_plans; diffusers reads its own
        return made

    return config


def _use_family_plans() -> None:
    """diffusers' enable_parallelism given the family's plan for this model (`planned_cp_config`) where the
    context-parallel config carries one and the caller passed none, then its FOLLOW for the model; idempotent."""
    from diffusers.models.modeling_utils import ModelMixin

    original = ModelMixin.enable_parallelism
    if getattr(original, "_family_plans", False):
        return

    def enable_parallelism(self, *, config, cp_plan=None):
        cp = getattr(config, "context_parallel_config", config)
        make = getattr(cp, "family_plans", {}).get(type(self).__name__)
        if cp_plan is not None or make is None:
            return original(self, config=config, cp_plan=cp_plan)
        cp_plan = make(self.config)
        original(self, config=config, cp_plan=cp_plan)
        follow = getattr(cp, "family_follow", {}).get(type(self).__name__)
        if follow is not None:
            follow(self, cp_plan)

    enable_parallelism._family_plans = True
    ModelMixin.enable_parallelism = enable_parallelism


def _patch_ulysses_mask_heads() -> None:
    """diffusers 0.42.1's Ulysses attention gives each rank 1/n of the heads but keeps a per-head attention mask
    ([batch, heads, queries, keys]: LTX-2's prompt mask, repeated over the heads by its attention processor) at
    all the heads, which the attention op then cannot broadcast. The mask is cut to this rank's heads, the ones
    its all-to-all brings it (a mask of one head, or none, is left as it is); idempotent."""
    import diffusers.models.attention_dispatch as dispatch

    ulysses = dispatch.TemplatedUlyssesAttention
    original = ulysses.forward
    if getattr(original, "_mask_heads", False):
        return

    def forward(ctx, query, key, value, attn_mask, *args):
        heads = query.shape[2]
        if attn_mask is not None and attn_mask.ndim == 4 and attn_mask.shape[1] == heads > 1:
            cp = args[-1].context_parallel_config  # _parallel_config, the last argument
            local = heads // cp.ulysses_degree
            attn_mask = attn_mask[:, cp._ulysses_local_rank * local:(cp._ulysses_local_rank + 1) * local]
        return original(ctx, query, key, value, attn_mask, *args)

    forward._mask_heads = True
    ulysses.forward = staticmethod(forward)


def pad_tokens(embeds: Any, mask: Any, length: int) -> tuple[Any, Any]:
    """Prompt embeddings [B, S, D] and their mask [B, S] (None: all valid) cut or padded with masked zeros to
    `length` tokens."""
    import torch

    if mask is None:
        mask = torch.ones(embeds.shape[:2], dtype=torch.long, device=embeds.device)
    n = min(embeds.shape[1], length)
    out = embeds.new_zeros(embeds.shape[0], length, embeds.shape[2])
    out[:, :n] = embeds[:, :n]
    m = mask.new_zeros(mask.shape[0], length)
    m[:, :n] = mask[:, :n]
    return out, m


@contextlib.contextmanager
def even_text(pipe: Any, spec: PipelineSpec) -> Iterator[None]:
    """Context Parallel splits the text tokens over the ranks, evenly (TorchTPU's all-to-all takes equal splits
    only). Qwen-Image's prompt embeddings are as long as the prompt: during this call its `encode_prompt` pads them
    with masked zeros to a multiple of the degree (the transformer masks them out of attention)."""
    degree = spec.cp_degree
    if degree == 1 or not spec.family.variable_text or not hasattr(pipe, "encode_prompt"):
        yield
        return
    own = "encode_prompt" in vars(pipe)  # the prompt cache's wrapper, kept as it is
    original = pipe.encode_prompt

    def encode_prompt(*args, **kwargs):
        embeds, mask = original(*args, **kwargs)
        if embeds.shape[1] % degree == 0:
            return embeds, mask
        return pad_tokens(embeds, mask, -(-embeds.shape[1] // degree) * degree)

    pipe.encode_prompt = encode_prompt
    try:
        yield
    finally:
        if own:
            pipe.encode_prompt = original
        else:
            del pipe.encode_prompt


def check_even_split(transformer: Any, degree: int, packed: str = "") -> None:
    """Refuses, before diffusers splits them, image or text tokens the context ranks cannot share evenly: image
    tokens the controller could not count (reference images of an edit) and text a compiled bucket could not
    round; or the packed sequence whose rows argument `packed` describes (Pipeline.cp_packed). Made once per load;
    the check reads shapes only, so a compiled denoiser traces it away."""

    def rows(module, args, kwargs):
        x = kwargs.get(packed)
        if x is not None and x.shape[0] % degree:
            raise ParallelError(f"degree: Context Parallel {degree} cannot split the {x.shape[0]} rows of the packed "
                                "sequence (the prompt's tokens, the start / end / reference images', the sound's and "
                                "the video's) evenly over its ranks (TorchTPU's all-to-all takes equal splits only); "
                                f"add or remove a word in the prompt (each token is one row) so that they are a "
                                f"multiple of {degree}, or use another degree.")

    if packed:
        transformer.register_forward_pre_hook(rows, with_kwargs=True)
        return

    def check(module, args, kwargs):
        for name, what, fix in (("hidden_states", "image tokens (the image and any reference images)",
                                 "change the width/height or the reference images' sizes"),
                                ("encoder_hidden_states", "text tokens", "change the prompt's length")):
            x = kwargs.get(name)
            # [batch, tokens, width] only: a video latent ([batch, channels, frames, h, w]: Wan) becomes tokens
            # inside the transformer, and the controller counted those (layouts.check_cp_size)
            if x is not None and x.ndim == 3 and x.shape[1] % degree:
                raise ParallelError(f"degree: Context Parallel {degree} cannot split {x.shape[1]} {what} evenly "
                                    f"over its ranks (TorchTPU's all-to-all takes equal splits only); {fix} so "
                                    f"that it is a multiple of {degree}, or use another degree.")

    transformer.register_forward_pre_hook(check, with_kwargs=True)


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


def pass_peers(spec: PipelineSpec):
    """The CPU (gloo) group of the ranks that run one denoiser pass together (Shard TP and Context Parallel
    shards of one CFG branch: contiguous ranks), or None when a pass runs on one rank. Collective the first
    time: every rank calls it."""
    size = spec.tp_degree * spec.cp_degree
    return _vote_group(size) if size > 1 else None


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


def in_turn(spec: PipelineSpec, rank: int, load: Callable[[], T], status: Callable[[str], None]) -> T:
    """`load()`, one Data Parallel replica after another when the spec says so (`load_in_turn`): replica r
    starts once replicas 0..r-1 have their weights on their devices, so the host holds about one copy in
    flight instead of one per replica. The ranks of one replica load together (a sharded load has
    collectives among them). Every rank passes every turn's barrier, even after its own load failed, so a
    failure never leaves the others waiting; it is raised once all turns are done.

    Collective: every rank of the group calls it for the same spec.
    """
    mine = spec.layout(rank)
    if not spec.load_in_turn or mine.replicas == 1:
        return load()
    import torch.distributed as dist

    group = _turn_group()
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
