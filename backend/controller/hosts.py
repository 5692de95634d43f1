"""Several hosts as one worker group (a TPU pod slice): the cluster settings, its secret, and the other hosts.

ComfyUI runs on host 0. Every other host runs `python -m backend join` (controller/host_agent.py), which dials
host 0, proves it holds the cluster secret, says how many worker processes it runs, and then starts and stops
its share of each group on request, with torch's own launcher (torchrun, static rendezvous). Nothing secret
crosses the network: each group's key is derived on every host from the cluster secret and the group's id.

Configured in ComfyUI's environment (host 0) by the settings HOSTS, LISTEN, HOST_PORT, CLUSTER_SECRET and
PROCS_PER_HOST (protocol/settings.py, docs/settings.md).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import socket
import stat
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..protocol import settings
from ..protocol.errors import DeviceError, WorkerCrashed
from .link import Link, accept_forever

log = logging.getLogger("comfyui_tpu")

START_TIMEOUT_S = 60.0  # a host agent must answer a start request within this


@dataclass(frozen=True)
class Cluster:
    hosts: tuple[str, ...]  # addresses, host 0 (this one) first
    listen: str  # where host 0 listens for hosts and workers
    port: int  # where host agents join
    secret_file: Path

    @property
    def multi(self) -> bool:
        return len(self.hosts) > 1


def cluster_from_env(environ: dict | os._Environ = os.environ) -> Cluster:
    hosts = tuple(h.strip() for h in settings.HOSTS.raw(environ).replace(" ", ",").split(",") if h.strip())
    listen = settings.LISTEN.raw(environ) or (hosts[0] if len(hosts) > 1 else "127.0.0.1")
    try:
        port = int(settings.HOST_PORT.raw(environ))
    except ValueError:
        raise DeviceError(f"{settings.HOST_PORT.name}: {settings.HOST_PORT.raw(environ)!r} is not a port number; "
                          f"set a number such as {settings.HOST_PORT.default}, or unset it.") from None
    return Cluster(hosts, listen, port, Path(settings.CLUSTER_SECRET.raw(environ)).expanduser())


def read_secret(path: Path) -> bytes:
    """The cluster secret, refused unless the file is private to its owner (the operator's user)."""
    try:
        info = path.stat()
        text = path.read_text().strip()
    except OSError as e:
        raise DeviceError(f"{settings.CLUSTER_SECRET.name}: the cluster secret file '{path}' cannot be read ({e.strerror}). "
                          "Make one with `python -m backend make-secret` and copy it to every host.") from None
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO) or info.st_uid != os.geteuid():
        raise DeviceError(f"{settings.CLUSTER_SECRET.name}: '{path}' can be read by other users (mode "
                          f"{stat.S_IMODE(info.st_mode):o}); run `chmod 600 {path}` (it must belong to this user).")
    try:
        secret = bytes.fromhex(text)
    except ValueError:
        secret = b""
    if len(secret) < 16:
        raise DeviceError(f"{settings.CLUSTER_SECRET.name}: '{path}' does not hold a secret made by `python -m backend "
                          "make-secret`; make a new one and copy it to every host.")
    return secret


def make_secret(path: Path) -> Path:
    """Writes a new random cluster secret to `path`, readable by its owner only."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    with open(fd, "w") as f:
        f.write(secrets.token_hex(32) + "\n")
    os.replace(tmp, path)
    return path


def group_secret(cluster_secret: bytes, group_id: str) -> bytes:
    """One group's key, derived on each host from the cluster secret: it never crosses the network."""
    return hmac.new(cluster_secret, f"comfyui-tpu group {group_id}".encode(), hashlib.sha256).digest()


def interface_of(address: str) -> str:
    """The network interface that holds `address` (gloo must use it, not the hostname's address)."""
    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address == address for a in addrs):
            return name
    raise DeviceError(f"{settings.LISTEN.name}: no network interface of this host has the address {address}; give one of "
                      "this host's own addresses.")


def procs_per_host(kind: str, chips: int | None) -> int:
    """Worker processes on a host: COMFYUI_TPU_PROCS_PER_HOST, else its chips (1 on a CPU host)."""
    value = settings.PROCS_PER_HOST.raw()
    if value:
        if not value.isdigit() or int(value) < 1:
            raise DeviceError(f"{settings.PROCS_PER_HOST.name}: {value!r} is not a number of processes; set 1 or more.")
        return int(value)
    return chips or 1


@dataclass
class Host:
    """Another host whose agent has joined."""

    index: int
    address: str
    hostname: str
    kind: str
    procs: int
    pid: int
    link: Link
    joined_at: float = field(default_factory=time.time)
    groups: dict[str, str] = field(default_factory=dict)  # group id → "starting" | "running" | why it ended

    def describe(self) -> dict[str, Any]:
        return {"index": self.index, "address": self.address, "hostname": self.hostname, "device": self.kind,
                "processes": self.procs, "agent_pid": self.pid,
                "joined": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.joined_at)),
                "groups": dict(self.groups)}


class HostRegistry:
    """The other hosts' agents, as host 0 sees them: who joined, who left, and their share of each group."""

    def __init__(self, cluster: Cluster, secret: bytes):
        self.cluster, self.secret = cluster, secret
        self._hosts: dict[int, Host] = {}
        self._left: list[dict[str, Any]] = []
        self._lock = threading.Condition()
        self.sock = socket.create_server((cluster.listen, cluster.port), reuse_port=False)
        self._closed = threading.Event()
        # Survives a flood or running out of descriptors: see link.accept_forever.
        threading.Thread(target=accept_forever, args=(self.sock, secret, self._admit, self._closed,
                                                      "comfyui-tpu-host"),
                         daemon=True, name="comfyui-tpu-hosts").start()
        log.info("comfyui-tpu: waiting for the other hosts on %s:%d (%s)", cluster.listen, cluster.port,
                 ", ".join(cluster.hosts[1:]))

    def _admit(self, link: Link) -> None:
        """An authenticated agent: its hello says which host it is; then its messages are read until it leaves."""
        try:
            hello = link.conn.recv()
            address = str(hello["address"])
            index = self.cluster.hosts.index(address)
        except (EOFError, OSError, KeyError, TypeError, ValueError):
            log.warning("comfyui-tpu: refused a host agent from %s: its address is not one of %s (%s)",
                        link.peer, ", ".join(self.cluster.hosts[1:]), settings.HOSTS.name)
            link.close()
            return
        host = Host(index, address, str(hello.get("hostname", "")), str(hello.get("kind", "")),
                    int(hello.get("procs", 1)), int(hello.get("pid", 0)), link)
        with self._lock:
            old = self._hosts.pop(index, None)
            self._hosts[index] = host
            self._lock.notify_all()
        if old is not None:
            old.link.close()
        log.info("comfyui-tpu: host %d (%s, %s) joined with %d %s worker process(es)", index, address, host.hostname,
                 host.procs, host.kind)
        self._read_forever(host)

    def _read_forever(self, host: Host) -> None:
        try:
            while True:
                msg = host.link.conn.recv()
                with self._lock:
                    if msg.get("type") == "started":
                        host.groups[msg["group_id"]] = "running"
                    elif msg.get("type") == "ended":
                        host.groups[msg["group_id"]] = f"ended ({msg.get('why', 'unknown')})"
                    self._lock.notify_all()
        except (EOFError, OSError):
            pass
        with self._lock:
            if self._hosts.get(host.index) is host:
                del self._hosts[host.index]
                self._left.append({"index": host.index, "address": host.address, "left": time.strftime("%H:%M:%S")})
                for gid in host.groups:
                    host.groups[gid] = "ended (the host left)"
            self._lock.notify_all()
        host.link.close()
        log.warning("comfyui-tpu: host %d (%s) left", host.index, host.address)

    def hosts(self) -> list[Host]:
        with self._lock:
            return [self._hosts[i] for i in sorted(self._hosts)]

    def start_group(self, group_id: str, hosts: list[Host], nnodes: int, nproc: int, master_port: int,
                    controller: str, kind: str, env: dict[str, str] | None = None) -> None:
        """Asks each host to start its share of the group (`env`: variables every rank must share, such as
        TorchTPU's handshake port); returns once each has, or raises naming the one that did not."""
        for node_rank, host in enumerate(hosts, start=1):
            host.groups[group_id] = "starting"
            host.link.conn.send({"op": "start", "group_id": group_id, "node_rank": node_rank, "nnodes": nnodes,
                                 "nproc": nproc, "master_addr": self.cluster.listen, "master_port": master_port,
                                 "controller": controller, "kind": kind, "env": dict(env or {})})
        deadline = time.monotonic() + START_TIMEOUT_S
        with self._lock:
            while any(h.groups.get(group_id) == "starting" for h in hosts):
                if time.monotonic() > deadline:
                    late = [h for h in hosts if h.groups.get(group_id) == "starting"]
                    raise WorkerCrashed(f"host {late[0].index} ({late[0].address}) did not start its workers within "
                                        f"{START_TIMEOUT_S:.0f} s; check its `python -m backend join` log.",
                                        request_started=False, host=late[0].address)
                self._lock.wait(0.2)
            failed = [h for h in hosts if h.groups.get(group_id, "").startswith("ended")]
            if failed:
                raise WorkerCrashed(f"host {failed[0].index} ({failed[0].address}) could not start its workers: "
                                    f"{failed[0].groups[group_id]}", request_started=False, host=failed[0].address)

    def ended(self, group_id: str, hosts: list[Host]) -> list[str]:
        """Why each of `hosts` no longer runs its share of the group (empty while all do)."""
        with self._lock:
            return [f"host {h.index} ({h.address}): {h.groups.get(group_id, 'unknown')}" for h in hosts
                    if h.groups.get(group_id, "").startswith("ended") or self._hosts.get(h.index) is not h]

    def stop_group(self, group_id: str, hosts: list[Host]) -> None:
        for host in hosts:
            try:
                host.link.conn.send({"op": "stop", "group_id": group_id})
            except OSError:
                pass

    def describe(self) -> dict[str, Any]:
        with self._lock:
            return {"this_host": self.cluster.hosts[0], "listening": f"{self.cluster.listen}:{self.cluster.port}",
                    "joined": [self._hosts[i].describe() for i in sorted(self._hosts)],
                    "waiting_for": [a for i, a in enumerate(self.cluster.hosts) if i and i not in self._hosts],
                    "left": list(self._left[-20:])}

    def close(self) -> None:
        self._closed.set()
        try:
            self.sock.close()
        except OSError:
            pass
        for host in self.hosts():
            host.link.close()


_registry: HostRegistry | None = None
_registry_lock = threading.Lock()


def registry() -> HostRegistry | None:
    """The other hosts (started on first use when COMFYUI_TPU_HOSTS lists several); None on one host."""
    global _registry
    with _registry_lock:
        cluster = cluster_from_env()
        if not cluster.multi:
            return None
        if _registry is None:
            _registry = HostRegistry(cluster, read_secret(cluster.secret_file))
        return _registry


@dataclass(frozen=True)
class Span:
    """What a group may span: processes per host, and the hosts that can take a share now (host 0 included)."""

    per_host: int
    hosts: int

    @property
    def processes(self) -> int:
        return self.per_host * self.hosts


def span(kind: str, chips: int | None) -> Span | None:
    """The hosts a group of `kind` can use now (None on one host). Hosts whose agent runs another device kind
    or another process count than host 0 cannot take a share."""
    reg = registry()
    if reg is None:
        return None
    per_host = procs_per_host(kind, chips)
    return Span(per_host, 1 + len(sharing_hosts(reg, kind, per_host)))


def sharing_hosts(reg: HostRegistry, kind: str, per_host: int) -> list[Host]:
    return [h for h in reg.hosts() if h.kind == kind and h.procs == per_host]
