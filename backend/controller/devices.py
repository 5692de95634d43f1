"""Which device this host has, found without starting any runtime (controller side).

Detection must be cheap and must never start the TPU runtime: with torch_tpu installed on a host
without a TPU, starting the runtime blocks ~10 minutes retrying the cloud metadata server and then
aborts the process. So we only look at signals that cost nothing (the package can be found, a TPU
sits on the PCI bus: /sys and /dev). This module imports torch lazily so that `prestartup_script.py` can use it
before ComfyUI imports torch. TorchTPU itself is imported only by workers (`worker.device`), and by short child
processes: `tpu_host` here (its hardware module alone: names, HBM, the worker counts it launches) and the launch
helper in `process_env`. ComfyUI's process never loads it. The environment processes start with is
`process_env`'s job.

TPU hosts this module refuses, with the reason: TPU v4 (TorchTPU 0.2.0 counts chips through VFIO only), chips
this process cannot open, torch_tpu missing, and hosts of a multi-host slice (unless COMFYUI_TPU_LOCAL_GROUP=1).
"""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .. import families
from ..protocol import settings
from ..protocol.errors import DeviceError
from ..protocol.spec import DEVICE_CHOICES
from ..protocol.units import format_bytes

# Google's PCI vendor id and the TPU device ids TorchTPU 0.2.0 itself recognises (its hardware.py). TorchTPU
# counts a PCI function as a device only when this process can open /dev/vfio/<its iommu group>.
_GOOGLE_PCI_VENDOR = "0x1ae0"
_TPU_PCI_DEVICES = {
    "0x0062": "v5p",
    "0x0063": "v5e",
    "0x006f": "v6e",
    "0x0076": "v7x",
    "0x005e": "v4",
}
V4_UNSUPPORTED = "TPU v4 is not supported by TorchTPU 0.2.0"
SYS_ROOT = "/"  # where /sys and /dev are read (tests point it at a fake tree)

@dataclass(frozen=True)
class DeviceInfo:
    kind: str  # "tpu" | "cuda" | "cpu"
    name: str  # e.g. "TPU v6e", "NVIDIA H200", "cpu"
    chips: int  # TPU chips, GPUs, or 1 (CPU)
    devices: int  # what one worker process drives each: TPU devices (a v7x chip is 2), GPUs, or 1 (CPU)
    memory_gib: float | None  # per device, when known without starting a runtime
    torch_tpu_installed: bool
    group_sizes: tuple[int, ...] | None = None  # TPU: the worker counts TorchTPU launches on this host
    notes: tuple[str, ...] = ()  # what the user should know: unusable TPU, pod host, v7x default layout


@dataclass(frozen=True)
class PciScan:
    """The Google TPU functions on this host's PCI bus (read from /sys and /dev only)."""

    usable: tuple[str, ...]  # generation of each TPU device this process can open through VFIO (not v4)
    unusable: tuple[str, ...]  # generation of each TPU function it cannot use: v4, or no /dev/vfio/<group>
    accel: bool  # /dev/accel* exists: chips behind the accel driver, as on TPU v4 hosts

    def problem(self, installed: bool = True) -> str | None:
        """Why the TPU hardware on the bus cannot be used here (None: usable, or no TPU at all)."""
        if self.usable and installed:
            return None
        if self.usable:
            return (f"this host has TPU {self.usable[0]} chips, but torch_tpu (TorchTPU) is not installed in "
                    "ComfyUI's Python: pip install 'torch-tpu>=0.2' (the pack's 'tpu' extra)")
        if "v4" in self.unusable or (self.unusable and self.accel):
            return (f"this host's TPU is exposed through /dev/accel (TPU v4 or its driver), not VFIO: "
                    f"{V4_UNSUPPORTED}. Use a v5e, v5p, v6e or v7x TPU VM")
        if self.unusable:
            return (f"this host has {len(self.unusable)} TPU {self.unusable[0]} device(s) on the PCI bus that this "
                    "process cannot open through VFIO (no /dev/vfio/<group>, or no permission): another process "
                    "may hold them, or ComfyUI runs without access to /dev/vfio")
        return None


def torch_tpu_installed() -> bool:
    """True when the torch_tpu package can be imported (found, not imported)."""
    return importlib.util.find_spec("torch_tpu") is not None


def scan_pci(sys_root: str | None = None) -> PciScan:
    """The TPU functions on the PCI bus, as TorchTPU counts them: a function is a device when this process can
    open /dev/vfio/<its iommu group>. v4 (known by id, exposed through /dev/accel) is never usable. Reads /sys
    and /dev only; never starts a runtime."""
    root = Path(SYS_ROOT if sys_root is None else sys_root)
    usable: list[str] = []
    unusable: list[str] = []
    try:
        entries = sorted((root / "sys/bus/pci/devices").iterdir())
    except OSError:
        entries = []
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
        gen = _TPU_PCI_DEVICES[device]
        ok = gen != "v4" and bool(group) and (root / "dev/vfio" / group).exists()
        (usable if ok else unusable).append(gen)
    accel = any((root / "dev").glob("accel[0-9]*"))
    return PciScan(tuple(usable), tuple(unusable), accel)


def tpu_devices(sys_root: str | None = None) -> list[str]:
    """Generation of each TPU device this process can use (one worker each; a v7x chip is two)."""
    return list(scan_pci(sys_root).usable)


def tpu_present() -> bool:
    """A TPU is usable only if torch_tpu is installed and a chip is on the PCI bus."""
    return torch_tpu_installed() and bool(tpu_devices())


# ---- what TorchTPU itself says about this host

@dataclass(frozen=True)
class TpuHost:
    """This host's TPU as the installed TorchTPU sees it (its own tables, asked in a child process)."""

    name: str  # TorchTPU's name, e.g. "TPU v6e"
    devices: int  # devices on the PCI bus: one worker process each
    devices_per_chip: int  # 2 on v7x (two TensorCores, each its own device), else 1
    hbm_bytes_per_device: int | None
    group_sizes: tuple[int, ...]  # worker counts TorchTPU launches on this host: its topology table, <= devices

    @property
    def chips(self) -> int:
        return max(1, self.devices // self.devices_per_chip)

    def describe(self) -> str:
        """'1 TPU v7 chip (2 devices)' / '4 TPU v6e chips'."""
        chips = f"{self.chips} {self.name} chip{'s' if self.chips != 1 else ''}"
        return f"{chips} ({self.devices} devices)" if self.devices_per_chip > 1 else chips


# Runs in a short child process with the workers' environment. TorchTPU's hardware module reads /sys and /dev
# only; it is imported without running the torch_tpu package's __init__, which would load torch and libtpu
# (seconds and hundreds of MB) for nothing. get_tpu_topology(n) raises for a count its table lacks.
_TPU_PROBE = """
import importlib, importlib.util, json, sys, types
root = importlib.util.find_spec("torch_tpu").submodule_search_locations[0]
for name, sub in (("torch_tpu", ""), ("torch_tpu._internal", "/_internal"),
                  ("torch_tpu._internal.utils", "/_internal/utils")):
    package = types.ModuleType(name)
    package.__path__ = [root + sub]
    sys.modules[name] = package
hw = importlib.import_module("torch_tpu._internal.utils.hardware")
sizes = []
for n in range(1, int(sys.argv[1]) + 1):
    try:
        if hw.get_tpu_topology(n):
            sizes.append(n)
    except RuntimeError:
        pass
print(json.dumps({"name": hw.get_tpu_device_name(), "devices": hw.get_tpu_device_count(),
                  "devices_per_chip": hw.get_devices_per_chip(), "hbm": hw.get_hbm_bytes_per_device(),
                  "sizes": sizes}))
"""


def tpu_host() -> TpuHost:
    """This host's TPU, its memory and the worker counts TorchTPU launches here (never a runtime start).

    Raises DeviceError when the TPU cannot be used: none, v4, not openable, torch_tpu missing, or a pod host
    (see `check_single_host`). Asked once per process and host."""
    scan = scan_pci()
    if problem := scan.problem(torch_tpu_installed()):
        raise DeviceError(f"device 'tpu': {problem}.")
    if not scan.usable:
        raise DeviceError("device 'tpu': no TPU chip was found on this host's PCI bus. Choose device 'auto' or "
                          "'cpu'.")
    check_single_host()
    return _probe(SYS_ROOT, scan.usable)


@functools.lru_cache(maxsize=32)
def _probe(sys_root: str, usable: tuple[str, ...]) -> TpuHost:
    import json
    import subprocess
    import sys

    # TorchTPU's hardware module reads no environment variable: this process's environment is enough (the
    # workers' own, process_env.worker_env, only adds launch and allocator settings it does not use)
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "TPU_SKIP_MDS_QUERY": "1"}
    try:
        out = subprocess.run([sys.executable, "-c", _TPU_PROBE, str(len(usable))], env=env, timeout=60,
                             capture_output=True, text=True)
        found = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        found, out = None, None
    if not found:
        tail = "\n".join(((out.stderr if out else "") or "").strip().splitlines()[-5:])
        raise DeviceError(f"device 'tpu': the installed TorchTPU could not describe this host's TPU (its hardware "
                          f"module failed in a child process):\n{tail}")
    devices = min(len(usable), int(found["devices"]))  # TorchTPU would count a VFIO v4 too; we never do
    return TpuHost(name=found["name"], devices=devices, devices_per_chip=int(found["devices_per_chip"] or 1),
                   hbm_bytes_per_device=found["hbm"],
                   group_sizes=tuple(n for n in found["sizes"] if n <= devices))  # TorchTPU does not check this


# ---- hosts of a multi-host slice

def pod_hosts(environ: Mapping[str, str] | None = None) -> list[str] | None:
    """The hosts of the multi-host slice this VM is one of, by TorchTPU's own test (TPU_WORKER_HOSTNAMES lists
    two or more, or JOB_COMPLETION_INDEX is set); None on a single host."""
    env = os.environ if environ is None else environ
    hosts = [h for h in env.get("TPU_WORKER_HOSTNAMES", "").split(",") if h.strip()]
    if len(hosts) > 1 or env.get("JOB_COMPLETION_INDEX") is not None:
        return hosts
    return None


def local_group(environ: Mapping[str, str] | None = None) -> bool:
    """Groups of this host's own chips on a pod host: asked for (COMFYUI_TPU_LOCAL_GROUP=1), or the hosts of the
    slice are configured (COMFYUI_TPU_HOSTS: a group that fits one host runs there alone; larger ones span the
    hosts through controller/hosts.py and keep the pod variables)."""
    env = os.environ if environ is None else environ
    return settings.LOCAL_GROUP.on(env) or len([h for h in settings.HOSTS.raw(env).split(",") if h.strip()]) > 1


def check_single_host(environ: Mapping[str, str] | None = None) -> None:
    """Refuses at once on a host of a multi-host slice whose hosts are not configured (a one-host group would
    wait for the others, then time out), unless the operator asked for groups of this host's own chips."""
    hosts = pod_hosts(environ)
    if hosts is None or local_group(environ):
        return
    listed = f"TPU_WORKER_HOSTNAMES lists {len(hosts)} hosts" if len(hosts) > 1 else "JOB_COMPLETION_INDEX is set"
    raise DeviceError(
        f"device 'tpu': this TPU VM is one host of a multi-host slice ({listed}). To use the slice's hosts, start "
        f"ComfyUI with {settings.HOSTS.name} listing them (worker 0 first) and run `python -m backend join` on the others "
        f"(docs/pod-slices.md); to use only this host's own chips, start ComfyUI with {settings.LOCAL_GROUP.name}=1; or run "
        "ComfyUI on a single-host TPU VM.")


def cuda_count() -> int:
    if settings.DISABLE_CUDA.on():
        return 0
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        return 0


def v7x_default_note(host: TpuHost) -> str | None:
    """Why a pipeline without Shard TP or Data Parallel runs on more than one worker here (v7x: a chip is two
    devices and TorchTPU launches no group of one)."""
    if 1 in host.group_sizes or not host.group_sizes:
        return None
    n = min(host.group_sizes)
    return (f"{host.name}: each chip is {host.devices_per_chip} devices and TorchTPU launches no group of 1, so "
            f"without Shard TP or Data Parallel a pipeline runs as Data Parallel {n} (a copy on each device of one "
            "chip; the same seed gives the same image). Every supported model's denoiser fits one device's "
            f"{format_bytes(host.hbm_bytes_per_device)} in bfloat16, {families.shard_tp_names(split=False)} cannot be "
            "sharded, and copies need no "
            "collectives per layer. Add Shard TP to split a model over the devices instead.")


def detect() -> DeviceInfo:
    """The best device on this host, tpu → cuda → cpu, without starting any runtime. On a TPU host TorchTPU's
    own tables are asked once (a child process); TPU hardware that cannot be used is said in `notes`."""
    installed = torch_tpu_installed()
    scan = scan_pci()
    notes: list[str] = []
    if scan.usable and installed:
        try:
            host = tpu_host()
        except DeviceError as e:
            notes.append(str(e))
        else:
            if note := v7x_default_note(host):
                notes.append(note)
            if pod_hosts() is not None:
                notes.append(f"pod host: {settings.LOCAL_GROUP.name}=1, so workers use this host's own chips only")
            return DeviceInfo("tpu", host.name, host.chips, host.devices,
                              None if host.hbm_bytes_per_device is None else host.hbm_bytes_per_device / 2**30,
                              installed, host.group_sizes, tuple(notes))
        first = scan.usable[0]
        return DeviceInfo("tpu", f"TPU {first}", len(scan.usable), len(scan.usable), None, installed, (), tuple(notes))
    if problem := scan.problem(installed):
        notes.append(problem)
    n = cuda_count()
    if n:
        import torch

        props = torch.cuda.get_device_properties(0)
        return DeviceInfo("cuda", props.name, n, n, round(props.total_memory / 2**30, 1), installed, None,
                          tuple(notes))
    return DeviceInfo("cpu", "cpu", 1, 1, None, installed, None, tuple(notes))


def resolve_kind(requested: str) -> str:
    """Turns the user's choice (auto/tpu/cuda/cpu) into a device kind, or says why it can't. TPU hardware that
    cannot be used (v4, no VFIO access, torch_tpu missing, a pod host) is refused for 'auto' too rather than
    silently running on the CPU."""
    if requested not in DEVICE_CHOICES:
        raise DeviceError(f"device '{requested}' is not one of {', '.join(DEVICE_CHOICES)}.")
    if requested in ("auto", "tpu"):
        scan = scan_pci()
        if problem := scan.problem(torch_tpu_installed()):
            raise DeviceError(f"device '{requested}': {problem}. Choose device 'cpu' to run on the CPU instead.")
        if scan.usable:
            check_single_host()
            return "tpu"
        if requested == "tpu":
            why = ("torch_tpu is not installed (pip install 'comfyui-tpu[tpu]')" if not torch_tpu_installed()
                   else "no TPU chip was found on this host's PCI bus")
            raise DeviceError(f"device 'tpu' was asked for but {why}. Choose device 'auto' or 'cpu'.")
        return "cuda" if cuda_count() else "cpu"
    if requested == "cuda" and not cuda_count():
        raise DeviceError("device 'cuda' was asked for but no CUDA GPU is available. Choose 'auto' or 'cpu'.")
    return requested


def device_memory_bytes(kind: str) -> int | None:
    """Memory of one device of `kind`, without starting a runtime: TorchTPU's HBM per device, CUDA's total
    memory of GPU 0; None on the CPU (the weights stay in host memory)."""
    if kind == "tpu":
        return tpu_host().hbm_bytes_per_device
    if kind == "cuda" and cuda_count():
        import torch

        return int(torch.cuda.get_device_properties(0).total_memory)
    return None


def host_memory() -> tuple[int, int]:
    """(total, free) bytes of this host's memory: /proc/meminfo's MemTotal and MemAvailable (what can be
    allocated without swapping, reclaimable page cache counted free); without /proc, the physical pages for both."""
    try:
        fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
        return int(fields["MemTotal"].split()[0]) * 1024, int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        return total, total
