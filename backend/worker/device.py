"""The worker's device: the one place that imports TorchTPU (`torch_tpu`). Worker processes only.

These may start a device runtime, so the controller never calls them; it resolves the device kind once and
puts it in the pipeline description.
"""

from __future__ import annotations

import os
from typing import Any


def dist_backend(kind: str) -> str:
    """torch.distributed backend for a device kind. On the CPU "cpu:gloo" (gloo, named for its device): diffusers'
    context parallel with prompt-length text (Qwen-Image) exchanges sizes on the device its backend names."""
    return {"tpu": "tpu_dist", "cuda": "nccl"}.get(kind, "cpu:gloo")


def prepare_worker(kind: str) -> None:
    """Per-rank setup before the device is first used (worker processes only).

    A TPU worker starts with TorchTPU autoloaded (the controller leaves TORCH_DEVICE_BACKEND_AUTOLOAD unset for
    it): with autoload off, `import torch_tpu` installs `torch.tpu` but registers no `tpu` device. Its launch
    environment (TORCH_TPU_TOPOLOGY, the slice-builder addresses, RANK, MASTER_ADDR, ...) was computed once by
    the controller for every rank (controller.process_env.tpu_launch_env); TorchTPU's C++ derives this rank's chip
    from LOCAL_RANK when the device starts.
    """
    if kind == "tpu":
        import torch
        import torch_tpu  # noqa: F401

        accelerator = torch.accelerator.current_accelerator()
        if accelerator is None or accelerator.type != "tpu":
            raise RuntimeError("TorchTPU did not register the 'tpu' device in this worker (accelerator: "
                               f"{accelerator}); is TORCH_DEVICE_BACKEND_AUTOLOAD=0 set for the workers?")
    if kind in FLOAT64_DOWNCAST:
        downcast_float64(kind)


# Devices on which diffusers computes in float32 where it would use float64 (FLUX.1's and FLUX.2's rotary
# embedding), as it does itself on mps, npu and neuron. Whether TorchTPU runs float64 well (natively, emulated, or
# not at all) is unknown: `python -m backend tpu-check` reports it. The CPU pixel difference this makes is in
# tests/test_device.py.
FLOAT64_DOWNCAST = ("tpu",)


def downcast_float64(device_type: str) -> None:
    """Adds `device_type` to diffusers' own list of devices without float64
    (diffusers.utils.torch_utils._FP64_UNSUPPORTED_DEVICES, read by maybe_adjust_dtype_for_device at each call)."""
    import torch
    from diffusers.utils import torch_utils

    devices = torch_utils._DTYPE_UNSUPPORTED_DEVICES[torch.float64] | {device_type}
    torch_utils._FP64_UNSUPPORTED_DEVICES = devices
    torch_utils._DTYPE_UNSUPPORTED_DEVICES[torch.float64] = devices


def tpu_cache_stats(kind: str) -> dict | None:
    """TorchTPU's compile-cache counters (torch.tpu._get_cache_stats()) and the tier-2 cache name this worker was
    given (the controller's process_env); None off TPU."""
    if kind != "tpu":
        return None
    import torch

    stats = torch.tpu._get_cache_stats()
    return {"requests": stats.num_cache_reqs, "hits": stats.num_cache_hits, "compilations": stats.num_compilations,
            "tier2": os.environ.get("TORCH_TPU_TIER2_COMPILATION_CACHE")}


def torch_device(kind: str, local_rank: int):
    """Binds this worker to its device and returns it. TorchTPU gives each process one chip, at index 0."""
    import torch

    if kind == "cuda":
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    if kind == "tpu":
        # As transformers does (distributed/utils.py, _bind_local_device): set_device_index starts this process's
        # runtime (a tensor created on tpu:0 would not; its allocation is deferred). Until it has started,
        # TorchTPU counts every device on the PCI bus, and DeviceMesh and diffusers' TP would pick
        # index LOCAL_RANK, which does not exist in this process. Not run on a TPU yet.
        try:
            torch.accelerator.set_device_index(0)
        except Exception as e:
            raise RuntimeError(f"this TPU worker could not bind its chip ({type(e).__name__}: {e}). "
                               f"{launch_report()}") from e
        check_one_device(torch.accelerator.device_count())
        return torch.device("tpu", 0)
    return torch.device("cpu")


def check_one_device(count: int) -> None:
    """A TPU worker must see exactly one device once bound; anything else means its runtime did not start as
    TorchTPU's launch environment says, and tensor-parallel placement would go wrong."""
    if count != 1:
        raise RuntimeError(f"this TPU worker sees {count} devices after binding, not 1: TorchTPU's runtime did not "
                           f"start with one chip per process. {launch_report()}")


# What the controller gives every rank, then what TorchTPU's C++ sets for this one when its runtime starts.
LAUNCH_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCH_TPU_TOPOLOGY",
                    "TORCH_TPU_SLICEBUILDER_ADDRESSES")
TORCH_TPU_SETS = ("TPU_VISIBLE_CHIPS", "TPU_VISIBLE_DEVICES", "CLOUD_TPU_TASK_ID", "TPU_PROCESS_BOUNDS",
                  "TPU_CHIPS_PER_PROCESS_BOUNDS", "TPU_PROCESS_PORT", "TPU_PROCESS_ADDRESSES")
WORKER_CONFIGURATION = "DistributedWorkerConfiguration: "  # TorchTPU's own log line (a string in its C++ library)


def launch_report() -> str:
    """The launch variables as this process sees them, read through libc: TorchTPU sets its own with C setenv,
    which Python's os.environ (a copy made at start-up) never shows; then TorchTPU's DistributedWorkerConfiguration
    line from this process's log, and what to do."""
    values = ", ".join(f"{name}={c_getenv(name)}" for name in (*LAUNCH_VARIABLES, *TORCH_TPU_SETS))
    line = worker_configuration_line()
    said = f" TorchTPU logged: {line}" if line else (" TorchTPU logged no DistributedWorkerConfiguration line in "
                                                     "this worker's log.")
    return (f"Launch variables (read through libc): {values}.{said} Please report it with the output of "
            "`python -m backend tpu-check`.")


def c_getenv(name: str) -> str | None:
    """The variable as the C library sees it now (what TorchTPU's C++ set with setenv included)."""
    import ctypes

    libc = ctypes.CDLL(None)
    libc.getenv.restype = ctypes.c_char_p
    value = libc.getenv(name.encode())
    return None if value is None else value.decode(errors="replace")


def worker_configuration_line(max_bytes: int = 1 << 20) -> str | None:
    """TorchTPU's last 'DistributedWorkerConfiguration: ...' line written by this process (absl's prefix names the
    thread, which for the main thread is the pid), read back from its stderr: the group's log file, which the
    launcher opens for reading and writing. None when stderr is not a readable file or holds no such line."""
    try:
        size = os.fstat(2).st_size
        data = os.pread(2, max_bytes, max(0, size - max_bytes)).decode(errors="replace")
    except OSError:
        return None
    pid = f" {os.getpid()} "
    lines = [line.strip() for line in data.splitlines() if WORKER_CONFIGURATION in line and pid in line]
    return lines[-1] if lines else None


def default_dtype_name(kind: str) -> str:
    """'auto' dtype: bfloat16 on TPU and CUDA (where supported), float32 on CPU."""
    if kind == "tpu":
        return "bfloat16"
    if kind == "cuda":
        import torch

        return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    return "float32"


# ---- Execution modes

# Our mode names → torch.tpu.EagerMode members (torch_tpu 0.2). "compiled" runs the parts outside the
# compiled denoiser (text encoders, VAE) in strict eager.
TPU_EAGER_MODES = {
    "strict eager": "DEFER_NEVER",
    "defer-and-fuse eager": "DEFER_AND_FUSE",
    "compiled": "DEFER_NEVER",
    "debug eager (launch blocking)": "DEFER_NEVER_AND_LAUNCH_BLOCKING",
}


def set_execution_mode(kind: str, mode: str) -> None:
    """Applies `mode` process-wide before sampling (worker only). Only TorchTPU has eager modes to set."""
    if kind != "tpu":
        return
    import torch

    torch.tpu.eager_mode = getattr(torch.tpu.EagerMode, TPU_EAGER_MODES[mode])


# ---- Strict eager on TPU: the UNet's sinusoidal timestep embedding on the CPU

# diffusers' TorchTPU work (huggingface/diffusers#14039, unet_2d_condition.py) runs UNet2DConditionModel's
# `time_proj` on the CPU in eager mode: "torch.cat([sin, cos], dim=-1) inside time_proj lands at an unaligned
# offset in the XLA DUS fusion emitter → crash" (a libtpu CHECK failure: the process aborts). The same embedding
# (Timesteps of block_out_channels[0] = 320 channels) is in SDXL's ControlNets; the transformers' embedders and
# `add_time_proj` (256 channels) were left alone there, and are here. Inside a compiled graph it is not needed
# ("torch.compile with TpuBackend handles this internally").
TIME_PROJ_ON_CPU = ("UNet2DConditionModel", "ControlNetModel", "ControlNetUnionModel")
DETOUR_DEVICES = ("tpu",)  # timesteps on these devices take the detour


def eager_workarounds(kind: str, pipe: Any) -> int:
    """Installs the `time_proj` CPU detour on every UNet and SDXL ControlNet of `pipe` on a TPU (once per module);
    returns how many it installed now. Nothing elsewhere."""
    if kind != "tpu":
        return 0
    from diffusers.models.embeddings import Timesteps
    from torch import nn

    installed = 0
    for component in pipe.components.values():
        if not isinstance(component, nn.Module):
            continue
        for module in component.modules():
            proj = getattr(module, "time_proj", None)
            if (type(module).__name__ in TIME_PROJ_ON_CPU and isinstance(proj, Timesteps)
                    and not getattr(proj, "_cpu_detour", False)):
                proj.forward = _on_cpu(proj.forward)
                proj._cpu_detour = True
                installed += 1
    return installed


def _on_cpu(forward: Any) -> Any:
    """`forward` (Timesteps') computed on the CPU and moved back, for timesteps on DETOUR_DEVICES in eager mode, as
    the PR does: `self.time_proj(timesteps.cpu()).to(sample.device)`."""
    import torch

    def detour(timesteps: Any) -> Any:
        if timesteps.device.type in DETOUR_DEVICES and not torch.compiler.is_compiling():
            return forward(timesteps.cpu()).to(timesteps.device)
        return forward(timesteps)

    return detour


# Allocator messages: torch CUDA ("CUDA out of memory"), torch CPU ("DefaultCPUAllocator: can't allocate
# memory ... Error code 12 (Cannot allocate memory)"; Windows: "not enough memory"), XLA (RESOURCE_EXHAUSTED).
OOM_MARKERS = ("out of memory", "resource_exhausted", "resource exhausted", "cannot allocate memory",
                "can't allocate memory", "not enough memory")


def is_oom(e: BaseException) -> bool:
    """Whether a failed call ran out of memory (on the device or the host), as each backend words it."""
    import torch

    if isinstance(e, (torch.OutOfMemoryError, MemoryError)):
        return True
    return any(m in str(e).lower() for m in OOM_MARKERS)
