"""Device detection and the one place that touches TorchTPU (`torch_tpu`).

Detection must be cheap and must never start the TPU runtime: with torch_tpu installed on a host
without a TPU, starting the runtime blocks ~10 minutes retrying the cloud metadata server and then
aborts the process. So we only look at signals that cost nothing (the package can be found, a TPU
sits on the PCI bus). This module imports torch lazily so that `prestartup_script.py` can use it
before ComfyUI imports torch.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

DEVICE_CHOICES = ("auto", "tpu", "cuda", "cpu")

# Google's PCI vendor id and the TPU device ids torch_tpu 0.2.0 itself recognises (its hardware.py).
_GOOGLE_PCI_VENDOR = "0x1ae0"
_TPU_PCI_DEVICES = {
    "0x0062": "v5p",
    "0x0063": "v5e",
    "0x006f": "v6e",
    "0x0076": "v7x",
    "0x005e": "v4",
}
# HBM per chip in GiB (torch_tpu's hardware table); v7x exposes 2 devices of 96 GiB per chip.
TPU_HBM_GIB = {"v4": 32, "v5e": 16, "v5p": 95, "v6e": 32, "v7x": 96}


class DeviceError(RuntimeError):
    """A requested device cannot be used here; the message says what to do instead."""


@dataclass(frozen=True)
class DeviceInfo:
    kind: str  # "tpu" | "cuda" | "cpu"
    count: int  # chips (TPU), GPUs (CUDA) or 1 (CPU)
    name: str  # e.g. "v6e", "NVIDIA H200", "cpu"
    memory_gib: float | None  # per chip, when known without starting a runtime
    torch_tpu_installed: bool


def torch_tpu_installed() -> bool:
    """True when the torch_tpu package can be imported (found, not imported)."""
    return importlib.util.find_spec("torch_tpu") is not None


def tpu_chips(sys_root: str = "/") -> list[str]:
    """TPU generations of the chips on this host's PCI bus that this process can open (via VFIO).

    Reads /sys and /dev only; never starts a runtime. `sys_root` lets tests point it at a fake tree.
    """
    root = Path(sys_root)
    chips = []
    pci = root / "sys/bus/pci/devices"
    try:
        entries = sorted(pci.iterdir())
    except OSError:
        return []
    for dev in entries:
        try:
            vendor = (dev / "vendor").read_text().strip().lower()
            device = (dev / "device").read_text().strip().lower()
        except OSError:
            continue
        if vendor != _GOOGLE_PCI_VENDOR or device not in _TPU_PCI_DEVICES:
            continue
        try:
            group = os.path.basename(os.readlink(dev / "iommu_group"))
        except OSError:
            group = None
        # Like torch_tpu's own check: a chip counts only when this process can open /dev/vfio/<group>.
        if group and (root / "dev/vfio" / group).exists():
            chips.append(_TPU_PCI_DEVICES[device])
    return chips


def tpu_present() -> bool:
    """A TPU is usable only if torch_tpu is installed and a chip is on the PCI bus."""
    return torch_tpu_installed() and bool(tpu_chips())


def configure_process_env(environ: os._Environ | dict = os.environ) -> list[str]:
    """Environment for a process that must never start the TPU runtime (ComfyUI's own process).

    Called from prestartup_script.py, before ComfyUI imports torch. Returns what it changed.
    - No TPU here: TPU_SKIP_MDS_QUERY=1 makes a stray runtime start fail in seconds, not ~10 minutes.
    - torch_tpu installed: stop torch from autoloading it into ComfyUI's process (saves ~3 s and
      ~300 MiB, and keeps torch_tpu's torch.compile patches out of the UI process); workers load it.
    """
    changed = []
    if torch_tpu_installed():
        if not tpu_chips() and "TPU_SKIP_MDS_QUERY" not in environ:
            environ["TPU_SKIP_MDS_QUERY"] = "1"
            changed.append("TPU_SKIP_MDS_QUERY=1")
        if "TORCH_DEVICE_BACKEND_AUTOLOAD" not in environ:
            environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
            environ["COMFYUI_TPU_AUTOLOAD_WAS_UNSET"] = "1"
            changed.append("TORCH_DEVICE_BACKEND_AUTOLOAD=0")
    return changed


def worker_env(kind: str, environ: dict | None = None) -> dict[str, str]:
    """The environment a worker process for `kind` starts with (copied from this process)."""
    env = dict(os.environ if environ is None else environ)
    if env.pop("COMFYUI_TPU_AUTOLOAD_WAS_UNSET", None):
        env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    if kind == "tpu":
        env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)  # the worker needs torch_tpu loaded
    elif torch_tpu_installed():
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"  # CPU/CUDA workers do not need it
        if not tpu_chips():
            env.setdefault("TPU_SKIP_MDS_QUERY", "1")
    return env


def _cuda_count() -> int:
    if os.environ.get("COMFYUI_TPU_DISABLE_CUDA") == "1":
        return 0
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        return 0


def detect() -> DeviceInfo:
    """The best device on this host, tpu → cuda → cpu, without starting any runtime."""
    installed = torch_tpu_installed()
    chips = tpu_chips() if installed else []
    if chips:
        return DeviceInfo("tpu", len(chips), chips[0], TPU_HBM_GIB.get(chips[0]), installed)
    n = _cuda_count()
    if n:
        import torch

        props = torch.cuda.get_device_properties(0)
        return DeviceInfo("cuda", n, props.name, round(props.total_memory / 2**30, 1), installed)
    return DeviceInfo("cpu", 1, "cpu", None, installed)


def resolve_kind(requested: str) -> str:
    """Turns the user's choice (auto/tpu/cuda/cpu) into a device kind, or says why it can't."""
    if requested not in DEVICE_CHOICES:
        raise DeviceError(f"device '{requested}' is not one of {', '.join(DEVICE_CHOICES)}.")
    if requested == "auto":
        return detect().kind
    if requested == "tpu" and not tpu_present():
        why = "torch_tpu is not installed (pip install 'comfyui-tpu[tpu]')" if not torch_tpu_installed() \
            else "no TPU chip was found on this host's PCI bus"
        raise DeviceError(f"device 'tpu' was asked for but {why}. Choose device 'auto' or 'cpu'.")
    if requested == "cuda" and not _cuda_count():
        raise DeviceError("device 'cuda' was asked for but no CUDA GPU is available. Choose 'auto' or 'cpu'.")
    return requested


def dist_backend(kind: str) -> str:
    """torch.distributed backend for a device kind."""
    return {"tpu": "tpu_dist", "cuda": "nccl"}.get(kind, "gloo")


_TPU_LAUNCH_ENV = """
import json, os, sys
import torch, torch_tpu  # noqa: F401
before = dict(os.environ)
torch.tpu.distributed.set_tpu_launch_env(nproc_per_node=int(sys.argv[1]))
print(json.dumps({k: v for k, v in os.environ.items() if before.get(k) != v}))
"""


def tpu_launch_env(nproc_per_node: int, env: dict[str, str], timeout: float = 120.0) -> dict[str, str]:
    """TorchTPU's launch environment for one host's ranks, computed once for all of them (not run on a TPU).

    `torch.tpu.distributed.set_tpu_launch_env()` must run once in the launcher's parent: on one host it picks
    a random port per chip, so ranks calling it each on their own would disagree. ComfyUI's process must not
    load TorchTPU, so a short child process (with the workers' environment) calls it and reports what it set
    (TORCH_TPU_TOPOLOGY, TORCH_TPU_SLICEBUILDER_ADDRESSES, ...). It reads the PCI bus only; no runtime starts.
    """
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _TPU_LAUNCH_ENV, str(nproc_per_node)], env=env, timeout=timeout,
                         capture_output=True, text=True)
    lines = out.stdout.strip().splitlines()
    if out.returncode or not lines:
        tail = "\n".join((out.stderr or "").strip().splitlines()[-5:])
        raise DeviceError(f"TorchTPU could not prepare the launch of {nproc_per_node} TPU workers "
                          f"(torch.tpu.distributed.set_tpu_launch_env failed):\n{tail}")
    return json.loads(lines[-1])


# ---- Below: worker-side only. These may start a device runtime; never call them in ComfyUI's process.

def prepare_worker(kind: str) -> None:
    """Per-rank setup before the device is first used (worker processes only)."""
    if kind == "tpu":
        import torch
        import torch_tpu  # noqa: F401  (registers torch.tpu when autoload is off)

        # A no-op for what the controller already set (backend.device.tpu_launch_env); fills in the rest.
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


def synchronize(kind: str) -> None:
    import torch

    if kind in ("tpu", "cuda"):
        torch.accelerator.synchronize()


# ---- Execution modes and compile backends. Pure except set_execution_mode (worker only).

# Our mode names → torch.tpu.EagerMode members (torch_tpu 0.2). "compiled" runs the parts outside the
# compiled denoiser (text encoders, VAE) in strict eager.
TPU_EAGER_MODES = {
    "strict eager": "DEFER_NEVER",
    "defer-and-fuse eager": "DEFER_AND_FUSE",
    "compiled": "DEFER_NEVER",
    "debug eager (launch blocking)": "DEFER_NEVER_AND_LAUNCH_BLOCKING",
}


def mode_note(kind: str, mode: str) -> str | None:
    """What the user should know when `kind` runs `mode` differently from a TPU (None: runs as asked)."""
    if kind == "tpu":
        return None
    if mode == "defer-and-fuse eager":
        return f"defer-and-fuse eager exists only on TPU; running strict eager on {kind}."
    if mode == "debug eager (launch blocking)" and kind == "cuda":
        return ("debug eager on CUDA: launch blocking needs CUDA_LAUNCH_BLOCKING=1 in ComfyUI's environment "
                "before the workers start; running strict eager.")
    return None


def set_execution_mode(kind: str, mode: str) -> None:
    """Applies `mode` process-wide before sampling (worker only). Only TorchTPU has eager modes to set."""
    if kind != "tpu":
        return
    import torch

    torch.tpu.eager_mode = getattr(torch.tpu.EagerMode, TPU_EAGER_MODES[mode])


def compile_backend(kind: str, choice: str) -> str:
    """torch.compile backend for a device kind: auto = TorchTPU's "tpu" on TPU, inductor on CUDA/CPU."""
    if choice == "auto":
        return "tpu" if kind == "tpu" else "inductor"
    if choice == "tpu" and kind != "tpu":
        raise DeviceError(f"backend: 'tpu' compiles for TPU chips only, and this pipeline runs on {kind}. "
                          "Choose 'auto' (inductor here).")
    if choice == "inductor" and kind == "tpu":
        raise DeviceError("backend: 'inductor' cannot compile for TPU tensors. Choose 'auto' (TorchTPU's 'tpu').")
    return choice


def compile_cache_env(root: str) -> dict[str, str]:
    """Environment that puts the persistent compile caches under `root` (read when the device starts)."""
    return {
        "TORCHINDUCTOR_CACHE_DIR": os.path.join(root, "inductor"),  # FX graph + AOT autograd caches (CPU, CUDA)
        "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
        "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT": os.path.join(root, "tpu"),  # TorchTPU's on-disk executables
    }
