"""What the nodes (and scripts, tests, benchmarks) call: one entry point, by name, to the controller's jobs.

- pipelines.py: describing a pipeline (a folder or an artist's files), what the loaders say, the models and files
  they list, and LoRAs, ControlNets and Redux chained onto a description;
- sampling.py: one Sample, checked in one planning pass (`prepare_sample`, with resolve.py), then run; VAE
  Decode; timings;
- speed.py: the parallel layouts, Sampling Options, execution modes and compiling;
- workers.py: loading, the worker group and this host's devices, the other hosts, the warm start, stopping.

Each node checks its own inputs when it runs (the loaders their model and files, the plan nodes their layout);
before a request goes to the workers, `resolve` checks the whole description once more (specs built by scripts
pass the same checks), once per request. Every check raises an InputError (`protocol.errors`) that names the
input, the value and the fix.
"""

from __future__ import annotations

from ..protocol.spec import PipelineSpec, SampleRequest
from . import devices
from .latents import latent_input
from .pipelines import (
    describe_files,
    describe_pipeline,
    list_files,
    list_models,
    make_file_spec,
    make_spec,
    with_controlnet,
    with_lora,
    with_redux,
)
from .resolve import MAX_IMAGES, check_request
from .resolve import resolve as checked
from .sampling import (
    PreparedSample,
    decode,
    describe_inputs,
    last_latency,
    prepare_sample,
    record_queue_wait,
    run_sample,
    run_sample_outputs,
    sample,
    size_from_image,
)
from .speed import (
    cfg_parallel,
    compile_stats,
    context_parallel,
    replicate,
    sampling_options,
    set_compile_cache_dir,
    shard,
    warmup_steps,
    with_compile,
    with_mode,
)
from .workers import (
    ProgressFn,
    device_info,
    group_config,
    hosts_info,
    load,
    shutdown,
    start_hosts,
    topology,
    warm_start,
    warm_start_enabled,
    worker_info,
)

__all__ = [
    "MAX_IMAGES", "PipelineSpec", "PreparedSample", "ProgressFn", "SampleRequest", "cfg_parallel", "check_request",
    "checked", "compile_stats", "context_parallel", "decode", "describe_files", "describe_inputs",
    "describe_pipeline", "device_info", "devices", "group_config", "hosts_info", "last_latency", "latent_input",
    "list_files", "list_models", "load", "make_file_spec", "make_spec", "prepare_sample", "record_queue_wait",
    "replicate", "run_sample", "run_sample_outputs", "sample", "sampling_options", "set_compile_cache_dir", "shard",
    "shutdown", "size_from_image", "start_hosts", "topology", "warm_start", "warm_start_enabled", "warmup_steps",
    "with_compile", "with_controlnet", "with_lora", "with_mode", "with_redux", "worker_info",
]
