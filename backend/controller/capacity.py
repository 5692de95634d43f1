"""How many worker processes this host runs for a device kind, and which counts launch (TPU: the counts the
installed TorchTPU launches; several hosts: the joined hosts' processes). Controller side: reads no weights,
never imports torch_tpu here (devices asks it in a child process).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..protocol.units import or_list
from . import devices, hosts


@dataclass(frozen=True)
class Capacity:
    """How many worker processes this host runs for a device kind, and which counts launch."""

    kind: str
    limit: int  # the most workers: TPU devices (a v7x chip is two), GPUs, or CPU cores
    sizes: tuple[int, ...] | None  # TPU: the only counts TorchTPU launches here; None: any count up to `limit`
    where: str  # "this host has 4 TPU v6e chips", for messages
    chips: bool  # workers drive chips (TPU, CUDA); on the CPU they are processes on cores

    def launches(self, n: int) -> bool:
        return 1 <= n <= self.limit and (self.sizes is None or n in self.sizes)

    def sizes_text(self) -> str:
        return or_list(self.sizes or ())

    def tp_degrees(self, heads: int | None) -> list[int]:
        """Shard TP degrees that can run here: each divides the attention heads and fits the host (TPU: divides a
        worker count TorchTPU launches; CUDA: divides the GPUs)."""
        good = []
        for d in range(1, self.limit + 1):
            if heads is not None and heads % d:
                continue
            if self.sizes is not None and not any(s % d == 0 for s in self.sizes):
                continue
            if self.sizes is None and self.chips and self.limit % d:
                continue
            good.append(d)
        return good

    def replica_counts(self, tp_degree: int) -> list[int]:
        """Data Parallel replica counts that launch with this Shard TP degree."""
        return [r for r in range(1, self.limit // tp_degree + 1) if self.launches(r * tp_degree)]


def host_capacity(kind: str) -> Capacity:
    """This host's capacity for `kind`. On TPU the worker counts come from the installed TorchTPU itself (its
    topology table, asked once in a child process; `devices.tpu_host`), limited to the devices on the bus,
    which TorchTPU does not check."""
    if kind == "tpu":
        host = devices.tpu_host()
        return Capacity("tpu", host.devices, host.group_sizes, f"this host has {host.describe()}", True)
    if kind == "cuda":
        n = devices.cuda_count()
        return Capacity("cuda", n, None, f"this host has {n} CUDA GPU{'s' if n != 1 else ''}", True)
    cores = os.cpu_count() or 1
    return Capacity("cpu", cores, None, f"this CPU host has {cores} cores (one worker process each)", False)


def span(kind: str, cap: Capacity | None = None) -> hosts.Span | None:
    """The hosts a group of `kind` may span now (None on one host): processes per host default to its chips
    (`cap`: this host's capacity for `kind`, where the caller has it)."""
    cap = cap or host_capacity(kind)
    return hosts.span(kind, cap.limit if cap.chips else None)
