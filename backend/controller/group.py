"""The worker group: N warm worker processes (one per chip; a single chip is a group of size 1).

It starts them (`launcher`), waits until every rank has dialled in and said hello (`link`), sends each request
to every rank, collects the answers while passing progress on, interrupts, and turns a dead or silent worker
into a clear error and a stopped group. There is one current group: chips are exclusive, so a group for
another configuration replaces it.
"""

from __future__ import annotations

import itertools
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import wait

from ..protocol import handoff, messages
from ..protocol.errors import Interrupted, WorkerCrashed, WorkerError
from ..protocol.messages import FINAL, Failure, Heartbeat, Hello, Reply, Result, Status, Step, Stopped
from ..protocol.spec import GroupConfig, PipelineSpec, SampleRequest
from . import devices
from .launcher import Launcher
from .link import Link, Listener

log = logging.getLogger("comfyui_tpu")

START_TIMEOUT_S = float(os.environ.get("COMFYUI_TPU_START_TIMEOUT", "180"))
SILENCE_TIMEOUT_S = float(os.environ.get("COMFYUI_TPU_SILENCE_TIMEOUT", "120"))
INTERRUPT_GRACE_S = 30.0
CRASH_REPORT_S = 2.0  # how long a crash report waits for torchrun's account of the cause
ERROR_GRACE_S = float(os.environ.get("COMFYUI_TPU_ERROR_GRACE", "10"))  # peers of a failed rank, then restart

ProgressFn = Callable[[Status | Step], None]


class WorkerGroup:
    """N warm worker processes for one GroupConfig, reused across requests until it changes or dies."""

    def __init__(self, config: GroupConfig):
        self.config = config
        self.secret = secrets.token_bytes(32)
        self.group_id = secrets.token_hex(8)  # names this group's /dev/shm files
        self.launcher = Launcher(config.world_size)
        self.links: list[Link] = []
        self.pids: list[int] = []
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self.closed = False

    # ---- lifecycle
    def start(self, on_status: Callable[[str], None] | None = None) -> None:
        n, kind = self.config.world_size, self.config.kind
        # TorchTPU's launch environment, once for all ranks (each rank on its own would pick other ports).
        tpu_env = devices.tpu_launch_env(n, devices.worker_env("tpu")) if kind == "tpu" else {}
        listener = Listener(self.secret)
        env = {**devices.worker_env(kind), messages.ENV_CONTROLLER: listener.address,
               messages.ENV_SECRET: self.secret.hex(), messages.ENV_GROUP_ID: self.group_id,
               messages.ENV_DEVICE_KIND: kind, **tpu_env}
        if on_status:
            on_status(f"starting {n} {kind} worker{'s' if n > 1 else ''}")
        log.info("comfyui-tpu: starting worker group %s", self.config)
        hellos: dict[int, tuple[Link, Hello]] = {}
        joined: list[Link] = []  # authenticated, hello not yet received (it comes after the rendezvous)
        try:
            self.launcher.start(env)
            deadline = time.monotonic() + START_TIMEOUT_S
            while len(hellos) < n:
                if not self.launcher.running():
                    raise WorkerCrashed(f"the worker launcher exited (code {self.launcher.exit_code}) before all "
                                        f"{n} workers were ready.{self.launcher.log_tail()}")
                if time.monotonic() > deadline:
                    raise WorkerCrashed(f"workers were not ready after {START_TIMEOUT_S:.0f} s "
                                        f"(COMFYUI_TPU_START_TIMEOUT).{self.launcher.log_tail()}")
                # Ranks say hello only once all of them joined torch.distributed, so take every rank's link
                # first and never wait on one rank's hello while another waits to be accepted.
                for link in wait(joined, timeout=0) if joined else []:
                    joined.remove(link)
                    try:
                        hello = link.recv()
                    except (EOFError, OSError):
                        link.close()
                        continue
                    if isinstance(hello, Hello):
                        hellos[hello.rank] = (link, hello)
                if (link := listener.get(timeout=0.2)) is not None:
                    joined.append(link)
        except BaseException:
            for link in [*joined, *(lk for lk, _ in hellos.values())]:
                link.close()
            self.close()
            raise
        finally:
            listener.close()
        self.links = [hellos[r][0] for r in range(n)]
        self.pids = [hellos[r][1].pid for r in range(n)]
        log.info("comfyui-tpu: worker group ready, pids %s", self.pids)

    def alive(self) -> bool:
        return not self.closed and self.launcher.running()

    def close(self, timeout: float = 5.0) -> None:
        """Stops every rank: asks politely, then terminates, then kills. Leaves no process behind."""
        if self.closed:
            return
        self.closed = True
        for link in self.links:
            try:
                link.send(messages.shutdown())
            except Exception:
                pass
        self.launcher.stop(self.pids, timeout)
        for link in self.links:
            link.close()
        self.launcher.close()
        handoff.remove_leftovers(handoff.shm_prefix(self.group_id))
        log.info("comfyui-tpu: worker group %s stopped", self.config)

    # ---- requests
    def load(self, spec: PipelineSpec, on_progress: ProgressFn | None = None,
             should_interrupt: Callable[[], bool] | None = None) -> list[Result]:
        return self.request(lambda rid: messages.load_request(rid, spec), on_progress, should_interrupt)

    def sample(self, spec: PipelineSpec, req: SampleRequest, on_progress: ProgressFn | None = None,
               should_interrupt: Callable[[], bool] | None = None) -> list[Result]:
        return self.request(lambda rid: messages.sample_request(rid, spec, req), on_progress, should_interrupt)

    def info(self) -> list[Result]:
        return self.request(messages.info_request)

    def request(self, build: Callable[[int], dict], on_progress: ProgressFn | None = None,
                should_interrupt: Callable[[], bool] | None = None) -> list[Result]:
        """Sends one request (`build(request id)`) to every rank and waits for every rank's result; returns
        them by rank.

        Progress goes to `on_progress` while waiting. If `should_interrupt()` turns true, or `on_progress`
        raises (ComfyUI's progress hook raises on interrupt), every rank is told to stop at its next step, and
        the exception (or `Interrupted`) is raised once they have.
        """
        with self._lock:
            if not self.alive():
                raise WorkerCrashed("the worker group is not running.")
            rid = next(self._ids)
            msg = build(rid)
            for rank in range(len(self.links)):
                self._send(rank, msg)
            replies: dict[int, Reply] = {}
            try:
                self._collect(rid, replies, on_progress, should_interrupt)
            except (Interrupted, WorkerCrashed, WorkerError):
                raise
            except BaseException:
                self._interrupt_and_drain(rid, replies)
                raise
            return [replies[r] for r in range(len(self.links))]

    def _send(self, rank: int, msg: dict) -> None:
        try:
            self.links[rank].send(msg)
        except OSError as e:
            self._crashed(rank, e)

    def _recv(self, rank: int) -> Reply:
        try:
            return self.links[rank].recv()
        except (EOFError, OSError) as e:
            self._crashed(rank, e)
            raise AssertionError("unreachable") from None

    def _collect(self, rid: int, replies: dict[int, Reply], on_progress: ProgressFn | None,
                 should_interrupt: Callable[[], bool] | None) -> None:
        last_heard = time.monotonic()
        interrupted = False
        failed_at: float | None = None  # when the first rank reported an error
        while len(replies) < len(self.links):
            if should_interrupt is not None and not interrupted and should_interrupt():
                interrupted = True
                self._broadcast_interrupt(rid)
            if failed_at is None and any(isinstance(r, Failure) for r in replies.values()):
                failed_at = time.monotonic()  # stop the others at their next step: the request has failed
                if not interrupted:
                    interrupted = True
                    self._broadcast_interrupt(rid)
            if failed_at is not None and time.monotonic() - failed_at > ERROR_GRACE_S:
                # The others are stuck, e.g. in a collective with the failed rank: only a restart frees them.
                error = self._first_error(replies)
                self.close()
                raise WorkerError(f"{error} The other workers did not stop within {ERROR_GRACE_S:.0f} s "
                                  "(they wait for the failed one), so the group was stopped; the next run "
                                  "starts a fresh one.")
            pending = [link for r, link in enumerate(self.links) if r not in replies]
            ready = wait(pending, timeout=0.1)
            if not ready:
                if time.monotonic() - last_heard > SILENCE_TIMEOUT_S:
                    tail = self.launcher.log_tail()  # before close(), which closes the log
                    self.close()
                    raise WorkerCrashed(
                        f"the {self.config.kind} workers stopped answering (no message, not even a "
                        f"heartbeat, for {SILENCE_TIMEOUT_S:.0f} s, COMFYUI_TPU_SILENCE_TIMEOUT); they were "
                        f"stopped and the next run starts fresh ones.{tail}")
                continue
            last_heard = time.monotonic()
            for link in ready:
                rank = self.links.index(link)
                reply = self._recv(rank)
                if isinstance(reply, Heartbeat) or getattr(reply, "id", None) not in (rid, None):
                    continue
                if isinstance(reply, (Status, Step)):
                    if on_progress is not None:
                        on_progress(reply)
                elif isinstance(reply, FINAL):
                    replies[rank] = reply
        if any(isinstance(r, Failure) for r in replies.values()):  # before Stopped: a failure stops the others
            failure = next(r for r in replies.values() if isinstance(r, Failure))
            log.error("comfyui-tpu: a worker request failed:\n%s", failure.traceback)
            raise WorkerError(self._first_error(replies))
        if any(isinstance(r, Stopped) for r in replies.values()):
            raise Interrupted("interrupted by the user")

    def _first_error(self, replies: dict[int, Reply]) -> str:
        """The message of the first rank that failed (replies keep their arrival order), naming the rank."""
        rank, failure = next((r, msg) for r, msg in replies.items() if isinstance(msg, Failure))
        if len(self.links) > 1:
            return f"{self.config.kind} worker rank {rank}: {failure.message}"
        return failure.message

    def _broadcast_interrupt(self, rid: int) -> None:
        for rank in range(len(self.links)):
            self._send(rank, messages.interrupt(rid))

    def _interrupt_and_drain(self, rid: int, replies: dict[int, Reply]) -> None:
        """After an exception in the controller: stop the ranks and wait until they are idle again."""
        try:
            self._broadcast_interrupt(rid)
            deadline = time.monotonic() + INTERRUPT_GRACE_S
            while len(replies) < len(self.links) and time.monotonic() < deadline:
                pending = [link for r, link in enumerate(self.links) if r not in replies]
                for link in wait(pending, timeout=0.2):
                    rank = self.links.index(link)
                    reply = self._recv(rank)
                    if isinstance(reply, FINAL) and reply.id == rid:
                        replies[rank] = reply
            if len(replies) < len(self.links):
                self.close()
        except WorkerCrashed:
            pass

    def _crashed(self, rank: int, error: BaseException) -> None:
        pid = self.pids[rank] if rank < len(self.pids) else "?"
        self.launcher.wait(CRASH_REPORT_S)  # torchrun notices within its monitor interval, logs why, stops the rest
        code = self.launcher.exit_code
        tail = self.launcher.log_tail()
        cause = self.launcher.exit_cause(pid)
        if not cause and not isinstance(error, EOFError):
            cause = f" ({type(error).__name__})"
        self.close(timeout=2.0)
        raise WorkerCrashed(
            f"{self.config.kind} worker rank {rank} (pid {pid}) stopped unexpectedly{cause}"
            f"{'' if code is None else f'; launcher exit code {code}'}. The group was stopped; the next run "
            f"starts a fresh one.{tail}")


_current: WorkerGroup | None = None
_current_lock = threading.Lock()


def get_group(config: GroupConfig, on_status: Callable[[str], None] | None = None) -> WorkerGroup:
    """The running group for `config`, started if needed. Chips are exclusive: another group is stopped first."""
    global _current
    with _current_lock:
        if _current is not None and _current.config == config and _current.alive():
            return _current
        if _current is not None:
            _current.close()
            _current = None
        group = WorkerGroup(config)
        group.start(on_status)
        _current = group
        return group


def current_group() -> WorkerGroup | None:
    with _current_lock:
        return _current if _current is not None and _current.alive() else None


def shutdown() -> None:
    """Stops the worker group (called at exit and by Free TPU Workers)."""
    global _current
    with _current_lock:
        if _current is not None:
            _current.close()
            _current = None
