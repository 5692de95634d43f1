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
        torch.accelerator.set_device_index(0)
        check_one_device(torch.accelerator.device_count())
        return torch.device("tpu", 0)
    return torch.device("cpu")


def check_one_device(count: int) -> None:
    """A TPU worker must see exactly one device once bound; anything else means its runtime did not start as
    TorchTPU's launch environment says, and tensor-parallel placement would go wrong."""
    if count != 1:
        raise RuntimeError(
            f"this TPU worker sees {count} devices after binding, not 1: TorchTPU's runtime did not start with one "
            f"chip per process (LOCAL_RANK={os.environ.get('LOCAL_RANK')}, TORCH_TPU_TOPOLOGY="
            f"{os.environ.get('TORCH_TPU_TOPOLOGY')}, TPU_VISIBLE_CHIPS={os.environ.get('TPU_VISIBLE_CHIPS')}). "
            "Please report it with the output of `python -m backend tpu-check`.")


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
