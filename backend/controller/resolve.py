"""One trip from a pipeline description to one ready to run: `resolve(spec)` fills in what the choices leave
open (the device kind, the default layout, offload 'auto', the load order, the compile plan) and checks the
whole against the model and this host, once per request, before any worker sees it. Specs built by scripts
pass through the same checks as the nodes' ones.
"""

from __future__ import annotations

from ..families import PIPELINES
from ..protocol.errors import ParallelError
from ..protocol.spec import PipelineSpec
from . import (
    capacity,
    compile_plan,
    components,
    controlnets,
    devices,
    layouts,
    loras,
    offload,
    redux,
    sampling_options,
    storage,
)


def resolve(spec: PipelineSpec) -> PipelineSpec:
    """`spec` ready to run: its device kind, default layout (v7x: Data Parallel over one chip's two devices),
    weight storage, offload 'auto', load order and compile plan resolved, its parallel layout, sampling options, LoRAs, ControlNets and Redux references checked
    against the model and this host (on TPU: a worker count TorchTPU launches). Idempotent."""
    if not spec.kind:
        spec = spec.with_changes(kind=devices.resolve_kind(spec.device))
    spec = storage.resolve_storage(layouts.with_sharded_encoders(layouts.default_layout(spec)))
    spec = resolve_load_order(offload.resolve_offload(spec))
    check_spec(spec)
    for lora in spec.loras:
        loras.check(spec, lora)
    for controlnet in spec.controlnets:
        controlnets.check(spec, controlnet)
    for ref in spec.redux:
        redux.check(spec, ref)
    return compile_plan.resolve_compile(spec)


def resolve_load_order(spec: PipelineSpec) -> PipelineSpec:
    """Data Parallel replicas load one after another unless the spec says otherwise. A replica's weights pass
    through its private host memory while it loads (converted to the dtype; on TPU/CUDA they leave it once on
    the device), so in turn the host carries one load at a time instead of one per replica: bench
    `load_memory` measures 2 CPU workers at 2.0x one model's size on disk in turn against 2.7x together, and
    Data Parallel 8 of FLUX.1 on a TPU host would carry ~34 GB in flight, not ~270 GB. Each replica's load
    waits for the ones before it; with one replica nothing changes."""
    if spec.load_in_turn is not None:
        return spec
    return spec.with_changes(load_in_turn=spec.dp_replicas > 1)


def check_spec(spec: PipelineSpec) -> None:
    """Re-checks the parallel layout and sampling options of a spec before any worker is started (specs may come
    from scripts)."""
    sampling_options.check_sampling(spec)
    if spec.cfg_parallel != 1:
        layouts.check_cfg(spec)
    if spec.cp_degree != 1:
        layouts.check_cp(spec)
    if spec.world_size == 1 and spec.kind != "tpu":
        return
    cap = capacity.host_capacity(spec.kind)
    if spec.tp_degree < 1:
        raise ParallelError(f"degree: {spec.tp_degree} is too small; use at least 1.")
    if spec.tp_degree > 1:
        family = PIPELINES[spec.class_name]
        if not family.tp_plan or spec.offload not in ("none", "auto"):
            layouts.plan_tp(spec, spec.tp_degree, spec.tp_text_encoders)  # raises the same message the node gives
        layouts.check_tp(spec, cap, components.transformer_heads(spec))
    layouts.check_world(spec, cap)
