"""Moving images between the controller and the workers: through a /dev/shm file, not the socket.

The worker writes each output array once into a private (0600) file in /dev/shm and sends its path; the
controller maps it copy-on-write and unlinks it at once, so the IMAGE tensor ComfyUI receives is that mapping:
one copy in all, and nothing is left in /dev/shm even if a process dies later. Input images (Sample's image and
mask) go the other way: the controller writes them once, every rank maps the same files (`keep=True`), and the
controller deletes them when the request is over. Where /dev/shm is missing or full (a container's 64 MiB
default), the bytes go over the socket instead (received straight into their buffer).
"""

from __future__ import annotations

import glob
import mmap
import os
from multiprocessing.connection import Connection

import numpy as np

from . import settings

SHM_DIR = settings.SHM_DIR.raw()
PREFIX = "comfyui-tpu-"


def shm_prefix(group_id: str) -> str:
    """Path prefix of one group's files (the controller removes leftovers with it when the group stops). A
    group id starts with its controller's pid, so files of controllers that died can be told apart."""
    return os.path.join(SHM_DIR, f"{PREFIX}{group_id}-")


def pack(arrays: dict[str, np.ndarray], prefix: str | None, counter: int) -> tuple[list[dict], list[np.ndarray]]:
    """Writes what it can to /dev/shm (nothing when `prefix` is None); returns the specs to send and the arrays
    that must go inline."""
    specs, inline = [], []
    for i, (name, a) in enumerate(arrays.items()):
        a = np.ascontiguousarray(a)
        spec = {"name": name, "shape": a.shape, "dtype": a.dtype.str}
        if prefix is None:
            inline.append(a)
            specs.append(spec)
            continue
        path = f"{prefix}{counter}-{i}"
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
            try:
                with open(fd, "wb", closefd=False) as f:
                    f.write(memoryview(a).cast("B"))
            finally:
                os.close(fd)
            spec["shm"] = path
        except OSError:  # no /dev/shm, or full: send the bytes over the socket
            _remove(path)
            inline.append(a)
        specs.append(spec)
    return specs, inline


def unpack(conn: Connection, specs: list[dict], keep: bool = False) -> dict[str, np.ndarray]:
    """Receives the arrays described by `specs` (mapped from /dev/shm, or read from the socket in order). The
    files are unlinked once mapped, unless `keep` (other processes map them too; their writer deletes them)."""
    values = {}
    for spec in specs:
        if "shm" in spec:
            values[spec["name"]] = _map(spec["shm"], spec["shape"], np.dtype(spec["dtype"]), keep)
        else:
            arr = np.empty(spec["shape"], dtype=spec["dtype"])
            conn.recv_bytes_into(memoryview(arr).cast("B"))
            values[spec["name"]] = arr
    return values


def _map(path: str, shape: tuple, dtype: np.dtype, keep: bool = False) -> np.ndarray:
    if not os.path.basename(path).startswith(PREFIX) or os.path.dirname(path) != SHM_DIR:
        raise ValueError(f"refusing to map {path}: not one of ComfyUI-TPU's /dev/shm files")
    fd = os.open(path, os.O_RDONLY)
    try:
        size = int(np.prod(shape)) * dtype.itemsize
        if size == 0:
            return np.empty(shape, dtype=dtype)
        mm = mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
        if not keep:
            _remove(path)
    return np.frombuffer(mm, dtype=dtype).reshape(shape)  # writable (copy-on-write), kept alive by the array


def remove_stale() -> list[str]:
    """Deletes the files of controllers that are gone (killed during a hand-off); returns their paths."""
    removed = []
    for path in glob.glob(os.path.join(glob.escape(SHM_DIR), PREFIX + "*")):
        pid = os.path.basename(path)[len(PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            _remove(path)
            removed.append(path)
    return removed


def remove(specs: list[dict]) -> None:
    """Deletes the files of arrays sent with `keep` readers, once every reader has mapped them."""
    for spec in specs:
        if "shm" in spec:
            _remove(spec["shm"])


def remove_leftovers(prefix: str) -> None:
    """Deletes a stopped group's files that never reached the controller (e.g. a reply cut short)."""
    for path in glob.glob(glob.escape(prefix) + "*"):
        _remove(path)


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
