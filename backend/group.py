"""Controller side of the worker group: launch, channel, requests, progress, interrupt, failure.

One group = N worker processes (one per chip; a single chip is a group of size 1), launched by torch's
own elastic launcher (`torch.distributed.run`, i.e. torchrun) so that ranks get the standard
RANK/WORLD_SIZE/MASTER_* environment and a c10d rendezvous that other hosts can join. Each rank dials
back to this process over a local TCP socket authenticated with a per-group secret (HMAC challenge of
`multiprocessing.connection`), so no other local user can drive the workers.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge, wait
from pathlib import Path
from typing import Any

from . import device, handoff
from .spec import GroupConfig

log = logging.getLogger("comfyui_tpu")

PACK_ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = float(os.environ.get("COMFYUI_TPU_START_TIMEOUT", "180"))
SILENCE_TIMEOUT_S = float(os.environ.get("COMFYUI_TPU_SILENCE_TIMEOUT", "120"))
HEARTBEAT_S = 2.0
INTERRUPT_GRACE_S = 30.0
CRASH_REPORT_S = 2.0  # how long a crash report waits for torchrun's account of the cause
ERROR_GRACE_S = float(os.environ.get("COMFYUI_TPU_ERROR_GRACE", "10"))  # peers of a failed rank, then restart


class WorkerError(RuntimeError):
    """A request failed inside a worker; the group is still usable."""


class WorkerCrashed(RuntimeError):
    """A worker died or stopped answering; the group was torn down and the next request starts anew."""


class Interrupted(Exception):
    """The user interrupted; every rank stopped at its next step."""


ProgressFn = Callable[[dict], None]


def launch_command(nproc_per_node: int, nnodes: int = 1, rdzv_endpoint: str = "127.0.0.1:0",
                   rdzv_id: str | None = None, log_dir: str | None = None) -> list[str]:
    """The torchrun command that starts one host's workers (one per chip) and joins them into a group.

    One host: nnodes=1 and a local endpoint (port 0: torchrun picks a free one). Several hosts (a TPU pod
    slice): every host runs this same command with nnodes=H, the same rdzv_id and rdzv_endpoint=HOST0:PORT;
    torchrun's c10d rendezvous then numbers the ranks across hosts (README, "Several hosts").
    """
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}",
           f"--nproc-per-node={nproc_per_node}", "--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint}",
           "--max-restarts=0", "--monitor-interval=0.5"]
    if rdzv_id:
        cmd.append(f"--rdzv-id={rdzv_id}")
    if log_dir:  # torchrun otherwise leaves a /tmp/torchelastic_* folder behind at every start
        cmd.append(f"--log-dir={log_dir}")
    return [*cmd, "-m", "backend.worker"]


class WorkerGroup:
    """N warm worker processes for one GroupConfig, reused across requests until it changes or dies."""

    def __init__(self, config: GroupConfig):
        self.config = config
        self.secret = secrets.token_bytes(32)
        self.group_id = secrets.token_hex(8)  # names this group's /dev/shm files
        self.conns: list[Connection] = []
        self.pids: list[int] = []
        self.proc: subprocess.Popen | None = None
        self._log_fd: int | None = None  # the launcher's output file, already unlinked
        self._run_dir: str | None = None  # torchrun's log dir, removed when the group stops
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self.closed = False

    # ---- lifecycle
    def start(self, on_status: Callable[[str], None] | None = None) -> None:
        n = self.config.world_size
        # TorchTPU's launch environment, once for all ranks (each rank on its own would pick other ports).
        tpu_env = device.tpu_launch_env(n, device.worker_env("tpu")) if self.config.kind == "tpu" else {}
        fd, log_name = tempfile.mkstemp(prefix="comfyui-tpu-group-", suffix=".log")
        # Unlinked at once (the launcher writes through its fd, we read the tail through ours), so no log
        # file is left behind even when ComfyUI is killed.
        self._log_fd = fd
        os.unlink(log_name)
        server = socket.create_server(("127.0.0.1", 0))
        server.settimeout(0.2)
        host, port = server.getsockname()[:2]
        env = device.worker_env(self.config.kind)
        env.update({
            "COMFYUI_TPU_CONTROLLER": f"{host}:{port}",
            "COMFYUI_TPU_SECRET": self.secret.hex(),
            "COMFYUI_TPU_GROUP_ID": self.group_id,
            "COMFYUI_TPU_DEVICE_KIND": self.config.kind,
            "PYTHONPATH": os.pathsep.join([str(PACK_ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            "PYTHONUNBUFFERED": "1",
        })
        env.update(tpu_env)
        _remove_stale_run_dirs()
        self._run_dir = tempfile.mkdtemp(prefix=f"{RUN_DIR_PREFIX}{os.getpid()}-")
        cmd = launch_command(n, log_dir=self._run_dir)
        if on_status:
            on_status(f"starting {n} {self.config.kind} worker{'s' if n > 1 else ''}")
        log.info("comfyui-tpu: starting worker group %s", self.config)
        self.proc = subprocess.Popen(cmd, env=env, cwd=str(PACK_ROOT), stdin=subprocess.DEVNULL,
                                     stdout=fd, stderr=subprocess.STDOUT, start_new_session=True)
        hellos: dict[int, tuple[Connection, dict]] = {}
        joined: list[Connection] = []  # authenticated, hello not yet received (it comes after the rendezvous)
        deadline = time.monotonic() + START_TIMEOUT_S
        try:
            while len(hellos) < n:
                if self.proc.poll() is not None:
                    raise WorkerCrashed(f"the worker launcher exited (code {self.proc.returncode}) before all "
                                        f"{n} workers were ready.{self._log_tail()}")
                if time.monotonic() > deadline:
                    raise WorkerCrashed(f"workers were not ready after {START_TIMEOUT_S:.0f} s "
                                        f"(COMFYUI_TPU_START_TIMEOUT).{self._log_tail()}")
                # Ranks say hello only once all of them joined torch.distributed, so accept every rank's
                # connection first and never wait on one rank's hello while another waits to be accepted.
                for conn in wait(joined, timeout=0) if joined else []:
                    joined.remove(conn)
                    try:
                        hello = conn.recv()
                    except (EOFError, OSError):
                        conn.close()
                        continue
                    hellos[hello["rank"]] = (conn, hello)
                try:
                    sock, _ = server.accept()
                except TimeoutError:
                    continue
                conn = self._authenticate(sock)
                if conn is not None:
                    joined.append(conn)
        except BaseException:
            for conn in [*joined, *(c for c, _ in hellos.values())]:
                conn.close()
            self.close()
            raise
        finally:
            server.close()
        self.conns = [hellos[r][0] for r in range(n)]
        self.pids = [hellos[r][1]["pid"] for r in range(n)]
        log.info("comfyui-tpu: worker group ready, pids %s", self.pids)

    def _authenticate(self, sock: socket.socket) -> Connection | None:
        sock.settimeout(10)
        sock.setblocking(True)
        conn = Connection(sock.detach())
        try:
            deliver_challenge(conn, self.secret)
            answer_challenge(conn, self.secret)
            return conn
        except Exception as e:  # a local process without the secret: refuse it and go on
            log.warning("comfyui-tpu: refused a worker-channel connection that failed authentication (%s)", e)
            conn.close()
            return None

    def alive(self) -> bool:
        return not self.closed and self.proc is not None and self.proc.poll() is None

    def close(self, timeout: float = 5.0) -> None:
        """Stops every rank: asks politely, then terminates, then kills. Leaves no process behind."""
        if self.closed:
            return
        self.closed = True
        for conn in self.conns:
            try:
                conn.send({"op": "shutdown"})
            except Exception:
                pass
        if self.proc is not None:
            try:
                self.proc.wait(timeout=timeout / 2)
            except subprocess.TimeoutExpired:
                self._signal_all(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=timeout / 2)
                except subprocess.TimeoutExpired:
                    self._signal_all(signal.SIGKILL)
                    self.proc.wait()
        self._signal_all(signal.SIGKILL, workers_only=True)
        for conn in self.conns:
            conn.close()
        if self._log_fd is not None:
            os.close(self._log_fd)
            self._log_fd = None
        if self._run_dir is not None:
            shutil.rmtree(self._run_dir, ignore_errors=True)
            self._run_dir = None
        handoff.remove_leftovers(handoff.shm_prefix(self.group_id))
        log.info("comfyui-tpu: worker group %s stopped", self.config)

    def _signal_all(self, sig: int, workers_only: bool = False) -> None:
        targets = list(self.pids) + ([] if workers_only or self.proc is None else [self.proc.pid])
        for pid in targets:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        if not workers_only and self.proc is not None:
            try:
                os.killpg(self.proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def _log_tail(self, lines: int = 15, max_bytes: int = 16384) -> str:
        if self._log_fd is None:
            return ""
        try:
            size = os.fstat(self._log_fd).st_size
            data = os.pread(self._log_fd, max_bytes, max(0, size - max_bytes))
        except OSError:
            return ""
        text = data.decode(errors="replace").strip().splitlines()
        return ("\nLast worker log lines:\n" + "\n".join(text[-lines:])) if text else ""

    # ---- requests
    def request(self, op: str, payload: dict[str, Any], on_progress: ProgressFn | None = None,
                should_interrupt: Callable[[], bool] | None = None) -> list[dict]:
        """Sends one request to every rank and waits for every rank's answer; returns them by rank.

        Progress messages go to `on_progress` while waiting. If `should_interrupt()` turns true, or
        `on_progress` raises (ComfyUI's progress hook raises on interrupt), every rank is told to stop at
        its next step, and the exception (or `Interrupted`) is raised once they have.
        """
        with self._lock:
            if not self.alive():
                raise WorkerCrashed("the worker group is not running.")
            rid = next(self._ids)
            msg = {"op": op, "id": rid, **payload}
            for rank, conn in enumerate(self.conns):
                self._send(rank, conn, msg)
            replies: dict[int, dict] = {}
            try:
                self._collect(rid, replies, on_progress, should_interrupt)
            except (Interrupted, WorkerCrashed, WorkerError):
                raise
            except BaseException:
                self._interrupt_and_drain(rid, replies)
                raise
            return [replies[r] for r in range(len(self.conns))]

    def _send(self, rank: int, conn: Connection, msg: dict) -> None:
        try:
            conn.send(msg)
        except OSError as e:
            self._crashed(rank, e)

    def _collect(self, rid: int, replies: dict[int, dict], on_progress: ProgressFn | None,
                 should_interrupt: Callable[[], bool] | None) -> None:
        last_heard = time.monotonic()
        interrupted = False
        failed_at: float | None = None  # when the first rank reported an error
        while len(replies) < len(self.conns):
            if should_interrupt is not None and not interrupted and should_interrupt():
                interrupted = True
                self._broadcast_interrupt(rid)
            if failed_at is None and any(r["type"] == "error" for r in replies.values()):
                failed_at = time.monotonic()  # stop the others at their next step: the request has failed
                if not interrupted:
                    interrupted = True
                    self._broadcast_interrupt(rid)
            if failed_at is not None and time.monotonic() - failed_at > ERROR_GRACE_S:
                # The others are stuck, e.g. in a collective with the failed rank: only a restart frees them.
                rank, error = self._first_error(replies)
                self.close()
                raise WorkerError(f"{error} The other workers did not stop within {ERROR_GRACE_S:.0f} s "
                                  "(they wait for the failed one), so the group was stopped; the next run "
                                  "starts a fresh one.")
            pending = [c for r, c in enumerate(self.conns) if r not in replies]
            ready = wait(pending, timeout=0.1)
            if not ready:
                if time.monotonic() - last_heard > SILENCE_TIMEOUT_S:
                    tail = self._log_tail()  # before close(), which closes the log
                    self.close()
                    raise WorkerCrashed(
                        f"the {self.config.kind} workers stopped answering (no message, not even a "
                        f"heartbeat, for {SILENCE_TIMEOUT_S:.0f} s, COMFYUI_TPU_SILENCE_TIMEOUT); they were "
                        f"stopped and the next run starts fresh ones.{tail}")
                continue
            last_heard = time.monotonic()
            for conn in ready:
                rank = self.conns.index(conn)
                msg = self._recv(rank, conn)
                kind = msg.get("type")
                if kind == "heartbeat" or msg.get("id") not in (rid, None):
                    continue
                if kind == "progress":
                    if on_progress is not None:
                        on_progress({**msg, "rank": rank})
                elif kind in ("result", "error", "interrupted"):
                    replies[rank] = msg
        errors = [r for r in replies.values() if r["type"] == "error"]
        if errors:  # before "interrupted": a failure stops the other ranks, which then report interrupted
            rank, error = self._first_error(replies)
            log.error("comfyui-tpu: a worker request failed:\n%s", replies[rank].get("traceback", ""))
            raise WorkerError(error)
        if any(r["type"] == "interrupted" for r in replies.values()):
            raise Interrupted("interrupted by the user")

    def _first_error(self, replies: dict[int, dict]) -> tuple[int, str]:
        """The first rank that failed (replies keep their arrival order) and its message, naming the rank."""
        rank = next(r for r, msg in replies.items() if msg["type"] == "error")
        message = replies[rank]["message"]
        if len(self.conns) > 1:
            message = f"{self.config.kind} worker rank {rank}: {message}"
        return rank, message

    def _recv(self, rank: int, conn: Connection) -> dict:
        try:
            msg = conn.recv()
            if "arrays" in msg:
                msg["values"] = handoff.unpack(conn, msg.pop("arrays"))
            return msg
        except (EOFError, OSError) as e:
            self._crashed(rank, e)
            raise AssertionError("unreachable") from None

    def _broadcast_interrupt(self, rid: int) -> None:
        for rank, conn in enumerate(self.conns):
            self._send(rank, conn, {"op": "interrupt", "id": rid})

    def _interrupt_and_drain(self, rid: int, replies: dict[int, dict]) -> None:
        """After an exception in the controller: stop the ranks and wait until they are idle again."""
        try:
            self._broadcast_interrupt(rid)
            deadline = time.monotonic() + INTERRUPT_GRACE_S
            while len(replies) < len(self.conns) and time.monotonic() < deadline:
                pending = [c for r, c in enumerate(self.conns) if r not in replies]
                for conn in wait(pending, timeout=0.2):
                    rank = self.conns.index(conn)
                    msg = self._recv(rank, conn)
                    if msg.get("id") == rid and msg.get("type") in ("result", "error", "interrupted"):
                        replies[rank] = msg
            if len(replies) < len(self.conns):
                self.close()
        except WorkerCrashed:
            pass

    def _crashed(self, rank: int, error: BaseException) -> None:
        pid = self.pids[rank] if rank < len(self.pids) else "?"
        if self.proc is not None:  # torchrun notices within its monitor interval, logs why, stops the rest
            try:
                self.proc.wait(timeout=CRASH_REPORT_S)
            except subprocess.TimeoutExpired:
                pass
        code = self.proc.poll() if self.proc else None
        tail = self._log_tail()
        cause = self._exit_cause(pid)
        if not cause and not isinstance(error, EOFError):
            cause = f" ({type(error).__name__})"
        self.close(timeout=2.0)
        raise WorkerCrashed(
            f"{self.config.kind} worker rank {rank} (pid {pid}) stopped unexpectedly{cause}"
            f"{'' if code is None else f'; launcher exit code {code}'}. The group was stopped; the next run "
            f"starts a fresh one.{tail}")

    def _exit_cause(self, pid: int | str) -> str:
        """How torchrun saw the rank with `pid` end (from its failure report), e.g. ' (killed by SIGKILL)'."""
        pattern = rf"exitcode\s*:\s*(-?\d+)\s*\(pid:\s*{re.escape(str(pid))}\)"
        found = re.findall(pattern, self._log_tail(lines=200))
        if not found:
            return ""
        code = int(found[-1])
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            hint = ": a kill command, or the kernel's out-of-memory killer" if code == -signal.SIGKILL else ""
            return f" (killed by {name}{hint})"
        return f" (exit code {code})"


RUN_DIR_PREFIX = "comfyui-tpu-run-"


def _remove_stale_run_dirs() -> None:
    """torchrun log folders of controllers that died without cleaning up (named after the controller's pid)."""
    for path in Path(tempfile.gettempdir()).glob(f"{RUN_DIR_PREFIX}*-*"):
        pid = path.name[len(RUN_DIR_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(path, ignore_errors=True)


_groups: dict[GroupConfig, WorkerGroup] = {}
_groups_lock = threading.Lock()


def get_group(config: GroupConfig, on_status: Callable[[str], None] | None = None) -> WorkerGroup:
    """The running group for `config`, started if needed. Chips are exclusive: other groups are stopped."""
    with _groups_lock:
        group = _groups.get(config)
        if group is not None and group.alive():
            return group
        for other in list(_groups.values()):
            other.close()
        _groups.clear()
        group = WorkerGroup(config)
        group.start(on_status)
        _groups[config] = group
        return group


def current_group() -> WorkerGroup | None:
    with _groups_lock:
        return next((g for g in _groups.values() if g.alive()), None)


def shutdown_all() -> None:
    """Stops every worker group (called at exit and by the Free Memory node)."""
    with _groups_lock:
        for group in _groups.values():
            group.close()
        _groups.clear()
