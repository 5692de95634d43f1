"""Fake TPU hosts for the tests: a /sys + /dev tree that both TorchTPU's own PCI scan and ours read.

Test-only. Nothing here starts a TPU runtime. TorchTPU 0.2.0's hardware module hard-codes
`pathlib.Path("/sys/bus/pci/devices")` and `pathlib.Path("/dev/vfio")` with no root prefix, so `reroot` swaps the
`pathlib` name inside that module only for one that maps absolute /sys and /dev paths into the fake tree; all of
TorchTPU's code (scan, VFIO check, names, HBM, topology table, set_tpu_launch_env) then runs unchanged. Our own
scan (`backend.controller.devices`) reads the same tree through its SYS_ROOT.
"""

from __future__ import annotations

import pathlib
import types

PCI_IDS = {"v4": "0x005e", "v5p": "0x0062", "v5e": "0x0063", "v6e": "0x006f", "v7x": "0x0076"}
FUNCTIONS_PER_CHIP = {"v7x": 2}  # a v7x chip shows two VFIO PCI functions: two devices
POD = {"TPU_WORKER_HOSTNAMES": "h0,h1", "JOB_COMPLETION_INDEX": "0"}  # one host of a two-host slice


def make_root(path: str | pathlib.Path, gen: str, chips: int, vfio: bool = True, accel: bool = False) -> str:
    """A fake host at `path`: `chips` TPU chips of generation `gen` on its PCI bus (v7x: two functions each), an
    unrelated Intel device, /dev/vfio/<group> per function when `vfio`, /dev/accel<i> per chip when `accel`."""
    root = pathlib.Path(path)
    pci, groups, dev = root / "sys/bus/pci/devices", root / "sys/kernel/iommu_groups", root / "dev"
    for p in (pci, groups, dev / "vfio"):
        p.mkdir(parents=True, exist_ok=True)
    (dev / "vfio" / "vfio").touch()  # the container device, as on a real host
    other = pci / "0000:00:01.0"
    other.mkdir(exist_ok=True)
    (other / "vendor").write_text("0x8086\n")
    (other / "device").write_text("0x1237\n")
    for i in range(chips * FUNCTIONS_PER_CHIP.get(gen, 1)):
        fn = pci / f"0000:00:{4 + i:02x}.0"
        fn.mkdir(exist_ok=True)
        (fn / "vendor").write_text("0x1ae0\n")
        (fn / "device").write_text(PCI_IDS[gen] + "\n")
        group = str(10 + i)
        (groups / group).mkdir(exist_ok=True)
        if not (fn / "iommu_group").is_symlink():
            (fn / "iommu_group").symlink_to(groups / group)
        if vfio:
            (dev / "vfio" / group).touch()
    for i in range(chips if accel else 0):
        (dev / f"accel{i}").touch()
    return str(root)


def reroot(hardware_module: types.ModuleType, root: str) -> None:
    """Makes TorchTPU's hardware module read /sys and /dev under `root` (this module object only)."""

    def fake_path(*parts):
        p = str(pathlib.Path(*parts))
        return pathlib.Path(root + p) if p.startswith(("/sys/", "/dev/")) else pathlib.Path(p)

    hardware_module.pathlib = types.SimpleNamespace(Path=fake_path)
