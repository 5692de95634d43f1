"""The worker's device: the one place that imports TorchTPU (`torch_tpu`). Worker processes only.

These may start a device runtime, so the controller never calls them; it resolves the device kind once and
puts it in the pipeline description.
"""

from __future__ import annotations

import os


def dist_backend(kind: str) -> str:
    """torch.distributed backend for a device kind. On the CPU "cpu:gloo" (gloo, named for its device): diffusers'
    context parallel with prompt-length text (Qwen-Image) exchanges sizes on the device its backend names."""
    return {"tpu": "tpu_dist", "cuda": "nccl"}.get(kind, "cpu:gloo")


def prepare_worker(kind: str) -> None:
    """Per-rank setup before the device is first used (worker processes only)."""
    if kind == "tpu":
        import torch
        import torch_tpu  # noqa: F401  (registers torch.tpu when autoload is off)

        # A no-op for what the controller already set (controller.devices.tpu_launch_env); fills in the rest.
        torch.tpu.distributed.set_tpu_launch_env(nproc_per_node=int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def torch_device(kind: str, local_rank: int):
    """The torch.device a worker rank computes on. TorchTPU gives each process one chip at index 0."""
    import torch

    if kind == "cuda":
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    if kind == "tpu":
        # Start this process's chip now (not run on a TPU yet): a DeviceMesh built later for tensor
        # parallelism otherwise calls set_device(LOCAL_RANK) on an uninitialised device, which fails on
        # ranks >= 1 because TorchTPU gives each process its one chip as tpu:0.
        torch.accelerator.set_device_index(0)
        torch.empty(1, device="tpu:0")
        return torch.device("tpu", 0)
    return torch.device("cpu")


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
