"""The environment each process starts with (controller side): ComfyUI's own, the workers', and TorchTPU's launch
environment for a group.

ComfyUI's process must never start the TPU runtime and never loads TorchTPU (`configure_process_env`). A worker
gets ComfyUI's environment with TorchTPU autoloaded on TPU hosts (`worker_env`), tcmalloc preloaded when the
system has it (TorchTPU warns without it), and, for a TPU group, what TorchTPU's launch helper computes once for
all ranks (`tpu_launch_env`) plus what keeps two groups on one VM apart (`tpu_group_env`): their own handshake
port and their own tier-2 compile cache. Which device the host has is `devices`' job.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import secrets
import shutil
from collections.abc import Mapping
from pathlib import Path

from ..protocol import settings
from ..protocol.errors import DeviceError
from .devices import local_group, pod_hosts, torch_tpu_installed, tpu_devices
from .launcher import free_port

log = logging.getLogger("comfyui_tpu")

# A multi-host slice: TorchTPU lays out the whole pod when either is set (its set_tpu_launch_env), and a group
# of this host's workers alone would wait for the other hosts. settings.LOCAL_GROUP=1 runs this host's chips only,
# with these variables taken out of the workers' environment.
POD_VARIABLES = ("TPU_WORKER_HOSTNAMES", "JOB_COMPLETION_INDEX", "TPU_WORKER_ID", "NNODES", "NODE_RANK")

# TorchTPU's handshake (torch_tpu/_internal/distributed/handshake.py): before a compiled graph with collectives
# runs, rank 0 serves a ZeroMQ ROUTER socket bound to tcp://*:<port> (every interface; the address is hard-coded,
# the port comes from this variable, default 36423) and the other ranks connect to MASTER_ADDR:<port>. The
# messages are unauthenticated JSON (docs/tpu.md says what a stranger's message can do).
HANDSHAKE_PORT = "TORCH_TPU_INTERNAL_HANDSHAKE_PORT"
# TorchTPU's shared-memory compile cache, looked up before the on-disk one: /dev/shm/torch_tpu_cache/<name>
# (the root is hard-coded in its C++), name "default" unless this variable says otherwise; "disabled" turns the
# on-disk tier off too. On for groups of more than one rank when the on-disk cache is set.
TIER2_CACHE = "TORCH_TPU_TIER2_COMPILATION_CACHE"
TIER2_ROOT = Path("/dev/shm/torch_tpu_cache")
TIER2_PREFIX = "comfyui-tpu-"

# tcmalloc, as TorchTPU's own start-up check (torch_tpu/_tcmalloc_check.py) asks for it.
TCMALLOC_NAMES = ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4")
LIBRARY_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib")
TCMALLOC_WARNING_FILTER = "ignore:<TorchTpu/Performance/TcMalloc/"  # the filter TorchTPU's warning itself names


def configure_process_env(environ: os._Environ | dict = os.environ) -> list[str]:
    """Environment for a process that must never start the TPU runtime (ComfyUI's own process).

    Called from prestartup_script.py, before ComfyUI imports torch. Returns what it changed.
    - No usable TPU here: TPU_SKIP_MDS_QUERY=1 makes a stray runtime start fail in seconds, not ~10 minutes.
    - torch_tpu installed: stop torch from autoloading it into ComfyUI's process (saves ~3 s and
      ~300 MiB, and keeps torch_tpu's torch.compile patches out of the UI process); workers load it.
    """
    changed = []
    if torch_tpu_installed():
        if not tpu_devices() and "TPU_SKIP_MDS_QUERY" not in environ:
            environ["TPU_SKIP_MDS_QUERY"] = "1"
            changed.append("TPU_SKIP_MDS_QUERY=1")
        if "TORCH_DEVICE_BACKEND_AUTOLOAD" not in environ:
            environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
            settings.AUTOLOAD_WAS_UNSET.set("1", environ)
            changed.append("TORCH_DEVICE_BACKEND_AUTOLOAD=0")
    return changed


# MKL's strict reproducible mode: without it, a CPU matrix product can round differently with the memory
# alignment of its weights (seen on AMD EPYC: up to 1.6e-6 between the same weights read from a diffusers folder,
# which safetensors leaves unaligned, and from artists' files or an offloaded copy, which are freshly allocated).
# With it, the same weights give the same pixels wherever they were read from. A user's own MKL_CBWR wins.
CPU_MATH_ENV = {"MKL_CBWR": "AUTO,STRICT"}


def worker_env(kind: str, environ: Mapping[str, str] | None = None, whole_slice: bool = False) -> dict[str, str]:
    """The environment a worker process for `kind` starts with (copied from this process). TPU workers get
    TorchTPU autoloaded (it registers the `tpu` device; importing torch_tpu with autoload off does not), and
    on a pod host a group of this host's own chips gets no pod variable, so TorchTPU lays out this host alone
    (`whole_slice`: a group that spans the slice's hosts keeps them)."""
    env = dict(os.environ if environ is None else environ)
    env.update({k: v for k, v in CPU_MATH_ENV.items() if k not in env})
    if settings.AUTOLOAD_WAS_UNSET.pop(env):
        env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    if kind == "tpu":
        env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
        if pod_hosts(env) is not None and local_group(env) and not whole_slice:
            for name in POD_VARIABLES:
                env.pop(name, None)
        env.update(allocator_env(env))
    elif torch_tpu_installed():
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"  # CPU/CUDA workers do not need it
        if not tpu_devices():
            env.setdefault("TPU_SKIP_MDS_QUERY", "1")
    return env




_TPU_LAUNCH_ENV = """
import json, os, sys
import torch, torch_tpu  # noqa: F401  (autoload off: the launch helper needs no device)
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

    child_env = {**env, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "TPU_SKIP_MDS_QUERY": "1"}
    out = subprocess.run([sys.executable, "-c", _TPU_LAUNCH_ENV, str(nproc_per_node)], env=child_env,
                         timeout=timeout, capture_output=True, text=True)
    lines = out.stdout.strip().splitlines()
    if out.returncode or not lines:
        tail = "\n".join((out.stderr or "").strip().splitlines()[-5:])
        raise DeviceError(f"TorchTPU could not prepare the launch of {nproc_per_node} TPU workers "
                          f"(torch.tpu.distributed.set_tpu_launch_env failed):\n{tail}")
    return json.loads(lines[-1])


def tpu_worker_env(nproc: int) -> dict[str, str]:
    """The environment every rank of a one-host TPU group of `nproc` starts with: the workers' environment,
    TorchTPU's launch environment (computed once for all ranks) and the group's own handshake port and tier-2
    cache name."""
    env = worker_env("tpu")
    return {**env, **tpu_launch_env(nproc, env), **tpu_group_env()}


def tcmalloc_path(dirs: tuple[str, ...] = LIBRARY_DIRS) -> str | None:
    """The system's tcmalloc library (Debian/Ubuntu: `apt install libtcmalloc-minimal4`), or None."""
    for folder in dirs:
        for name in TCMALLOC_NAMES:
            if os.path.isfile(path := os.path.join(folder, name)):
                return path
    return None


def allocator_env(env: Mapping[str, str], dirs: tuple[str, ...] = LIBRARY_DIRS) -> dict[str, str]:
    """What a TPU worker needs for its allocator: tcmalloc preloaded when the system has it (TorchTPU's eager
    runtime frees across threads, which contends under glibc's malloc); otherwise TorchTPU's warning, printed by
    every worker, filtered out, and said once here with the fix instead."""
    preload = env.get("LD_PRELOAD", "")
    if any(name.split(".so")[0] in preload for name in TCMALLOC_NAMES):
        return {}
    if path := tcmalloc_path(dirs):
        return {"LD_PRELOAD": f"{path} {preload}".strip()}
    _say_no_tcmalloc()
    warnings = env.get("PYTHONWARNINGS", "")
    return {"PYTHONWARNINGS": f"{warnings},{TCMALLOC_WARNING_FILTER}" if warnings else TCMALLOC_WARNING_FILTER}


@functools.cache
def _say_no_tcmalloc() -> None:
    log.warning("comfyui-tpu: tcmalloc was not found, so TPU workers run with glibc's malloc (TorchTPU says host "
                "performance may suffer). Install it (Debian/Ubuntu: sudo apt install libtcmalloc-minimal4) and "
                "restart ComfyUI; docs/tpu.md.")


def tpu_group_env(address: str = "127.0.0.1") -> dict[str, str]:
    """What keeps this TPU group apart from any other on the VM (another ComfyUI, another user, a script):
    its own free handshake port (TorchTPU's default 36423 would refuse a second group: "handshake port 36423 is
    not available"), picked on `address` (where rank 0 runs), and its own tier-2 compile cache name,
    comfyui-tpu-<uid>-<pid>-<random> (removed with the group: `remove_tier2_cache`)."""
    return {HANDSHAKE_PORT: str(free_port(address)),
            TIER2_CACHE: f"{TIER2_PREFIX}{os.getuid()}-{os.getpid()}-{secrets.token_hex(4)}"}


def remove_tier2_cache(env: Mapping[str, str]) -> None:
    """Deletes the group's tier-2 cache folder in /dev/shm (only a name `tpu_group_env` made), and those of this
    user's groups whose process is gone."""
    name = env.get(TIER2_CACHE, "")
    if re.fullmatch(rf"{TIER2_PREFIX}{os.getuid()}-\d+-[0-9a-f]+", name):
        shutil.rmtree(TIER2_ROOT / name, ignore_errors=True)
    try:
        stale = list(TIER2_ROOT.glob(f"{TIER2_PREFIX}{os.getuid()}-*-*"))
    except OSError:
        stale = []
    for path in stale:
        pid = path.name.split("-")[3]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(path, ignore_errors=True)
