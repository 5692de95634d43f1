"""Which device this host has, found without starting any runtime (controller side).

Detection must be cheap and must never start the TPU runtime: with torch_tpu installed on a host
without a TPU, starting the runtime blocks ~10 minutes retrying the cloud metadata server and then
aborts the process. So we only look at signals that cost nothing (the package can be found, a TPU
sits on the PCI bus). This module imports torch lazily so that `prestartup_script.py` can use it
before ComfyUI imports torch. TorchTPU itself is imported only by workers (`worker.device`), and by the
short child process of `tpu_launch_env`.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from ..protocol.errors import DeviceError
from ..protocol.spec import DEVICE_CHOICES

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


def cuda_count() -> int:
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
    n = cuda_count()
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
    if requested == "cuda" and not cuda_count():
        raise DeviceError("device 'cuda' was asked for but no CUDA GPU is available. Choose 'auto' or 'cpu'.")
    return requested


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
