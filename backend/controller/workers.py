"""The worker group as the nodes see it: loading a pipeline into it, which group a description runs on, what the
running workers and this host's devices say, the other hosts of a slice, the warm start, and stopping it all.
The group itself (starting, talking to and stopping the workers) is group.py's.
"""

from __future__ import annotations

import atexit
import logging
import threading
from collections.abc import Callable

from ..protocol.errors import TPUError, WorkerCrashed
from ..protocol.messages import Status
from ..protocol.spec import GroupConfig, PipelineSpec
from . import capacity, devices, group, hosts, resolve
from . import warm_start as warm
from .group import ProgressFn

log = logging.getLogger("comfyui_tpu")
atexit.register(group.shutdown)


def group_config(spec: PipelineSpec) -> GroupConfig:
    """The group `spec` runs on: this host's chips, or (a group larger than one host) the joined hosts too."""
    across = capacity.span(spec.kind)
    if across is None or spec.world_size <= across.per_host:
        return GroupConfig(kind=spec.kind, world_size=spec.world_size)
    others = hosts.sharing_hosts(hosts.registry(), spec.kind, across.per_host)
    share = tuple(h.address for h in others[: spec.world_size // across.per_host - 1])
    return GroupConfig(kind=spec.kind, world_size=spec.world_size, hosts=share, per_host=across.per_host)


def status_adapter(on_progress: ProgressFn | None) -> Callable[[str], None] | None:
    """The group's status lines as the nodes' progress messages."""
    if on_progress is None:
        return None
    return lambda text: on_progress(Status(None, text))


def load(spec: PipelineSpec, on_progress: ProgressFn | None = None,
         should_interrupt: Callable[[], bool] | None = None) -> dict:
    """Makes sure the pipeline is loaded and warm in the workers (warm-up shapes compiled); returns rank 0's info."""
    spec = resolve.resolve(spec)
    results = group.run(group_config(spec), lambda g: g.load(spec, on_progress, should_interrupt),
                        status_adapter(on_progress), should_interrupt)
    return results[0].value


def worker_info() -> list[dict]:
    """Per-rank state of the running group (empty when none runs)."""
    workers = group.current_group()
    if workers is None:
        return []
    try:
        return [r.value for r in workers.info()]
    except WorkerCrashed:  # it died just now: Device Info is safe to run at any time, and it has no workers
        return []


def device_info() -> devices.DeviceInfo:
    return devices.detect()


def start_hosts() -> None:
    """Starts waiting for the other hosts when ComfyUI starts (several hosts configured); says why it cannot."""
    try:
        hosts.registry()
    except (TPUError, OSError) as e:
        log.error("comfyui-tpu: the other hosts cannot join: %s", e)


def topology() -> str:
    """Which hosts have joined ('' on one host): nodes whose 'auto' counts chips re-plan when it changes."""
    try:
        reg = hosts.registry()
    except TPUError as e:  # a broken cluster setting: Sample says so, with its fix
        return f"unusable: {e}"
    return "" if reg is None else ",".join(f"{h.address}/{h.procs}" for h in reg.hosts())


def hosts_info() -> dict | None:
    """The other hosts of a slice (joined, waiting for, left), or None on one host."""
    reg = hosts.registry()
    return None if reg is None else reg.describe()


def shutdown() -> None:
    """Stops all workers (frees every chip and the host memory they hold)."""
    group.shutdown()


def warm_start_enabled() -> bool:
    return warm.enabled()


def warm_start() -> threading.Thread | None:
    """With COMFYUI_TPU_WARM_START=1: starts this host's worker group in the background (never blocks)."""
    return warm.start()
