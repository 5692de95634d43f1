"""The worker group: N warm worker processes (one per chip; a single chip is a group of size 1).

It starts them (`launcher`), waits until every rank has dialled in and said hello (`link`), sends each request
to every rank, collects the answers while passing progress on, interrupts, and turns a dead, silent or stuck
worker into a clear error and a stopped group. Liveness means progress: every busy rank sends a heartbeat each
HEARTBEAT_S, so a rank that sends nothing is stopped or hung, whatever its peers say; a rank waiting in a
collective for a stuck peer fails on the process group's timeout. There is one current group: chips are
exclusive, so a group for another configuration replaces it.
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
from typing import TypeVar

import numpy as np

from ..protocol import handoff, messages, settings
from ..protocol.errors import INPUT_ERRORS, Interrupted, WorkerCrashed, WorkerError
from ..protocol.messages import (
    FINAL,
    Accepted,
    Failure,
    Heartbeat,
    Hello,
    Reply,
    Result,
    Status,
    Step,
    Stopped,
)
from ..protocol.spec import GroupConfig, PipelineSpec, SampleRequest
from . import hosts, process_env
from .launcher import Launcher, free_port, remove_stale_run_dirs, torchrun_command
from .link import Link, Listener

log = logging.getLogger("comfyui_tpu")

START_TIMEOUT_S = settings.START_TIMEOUT.number()
SILENCE_TIMEOUT_S = settings.SILENCE_TIMEOUT.number()
# After Cancel, a rank that has not stopped within this ends the group: it is silent (stopped, hung), or busy
# inside one step, VAE pass, load or compile longer than this (it heartbeats but reaches no step boundary).
CANCEL_GRACE_S = settings.CANCEL_GRACE.number()
STOP_TIMEOUT_S = 2.0  # stopping a group Cancel gave up on: polite, then SIGTERM, then SIGKILL, within this
ERROR_GRACE_S = settings.ERROR_GRACE.number()  # peers of a failed rank, then restart
EXIT_REPORT_S = 2.0  # how long a crash report waits for a dying rank's exit status
QUIET_S = 2 * messages.HEARTBEAT_S + 1.0  # a busy rank heard from less recently than this is stopped or hung

ProgressFn = Callable[[Status | Step], None]
T = TypeVar("T")


class WorkerGroup:
    """N warm worker processes for one GroupConfig, reused across requests until it changes or dies."""

    def __init__(self, config: GroupConfig):
        self.config = config
        self.secret = secrets.token_bytes(32)
        self.group_id = f"{os.getpid()}-{secrets.token_hex(8)}"  # names this group's /dev/shm files
        self.launcher = Launcher(config.per_host if config.hosts else config.world_size)
        self.remote: list[hosts.Host] = []  # the other hosts taking a share
        self.links: list[Link] = []
        self.pids: list[int] = []
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self.closed = False
        self.start_s = 0.0  # how long `start` took (the latency report's group start)
        self.tpu_env: dict[str, str] = {}  # a TPU group's own handshake port and tier-2 cache name

    # ---- lifecycle
    def start(self, on_status: Callable[[str], None] | None = None,
              should_interrupt: Callable[[], bool] | None = None) -> None:
        """Starts every rank and waits for each one's hello. Cancel (`should_interrupt`) stops the group being
        started at once: starting is all it has done, and a rank may never say hello (a stopped one)."""
        t0 = time.perf_counter()
        remove_stale_run_dirs()
        handoff.remove_stale()
        cluster = self._joined_hosts() if self.config.hosts else None
        listener = Listener(self.secret, host=cluster.cluster.listen) if cluster else Listener(self.secret)
        env = self._several_hosts_env(cluster) if cluster else self._one_host_env()
        env.update({settings.CONTROLLER.name: listener.address, settings.GROUP_ID.name: self.group_id,
                    settings.DEVICE_KIND.name: self.config.kind})
        if on_status:
            n, kind = self.config.world_size, self.config.kind
            where = f" on {1 + len(self.config.hosts)} hosts" if self.config.hosts else ""
            on_status(f"starting {n} {kind} worker{'s' if n > 1 else ''}{where}")
        log.info("comfyui-tpu: starting worker group %s", self.config)
        hellos: dict[int, tuple[Link, Hello]] = {}
        joined: list[Link] = []  # authenticated, hello not yet received (it comes after the rendezvous)
        try:
            if cluster:
                self._launch_across_hosts(cluster, env, listener.address)
            else:
                self.launcher.start(env, self.secret)
                self.pids = self.launcher.pids
            self._wait_for_hellos(listener, cluster, hellos, joined, should_interrupt)
        except BaseException as e:
            for link in [*joined, *(lk for lk, _ in hellos.values())]:
                link.close()
            self.close(timeout=STOP_TIMEOUT_S if isinstance(e, Interrupted) else 5.0)
            raise
        finally:
            listener.close()
        self.links = [hellos[r][0] for r in range(self.config.world_size)]
        self.pids = [hellos[r][1].pid for r in range(self.config.world_size)]
        self.start_s = time.perf_counter() - t0
        log.info("comfyui-tpu: worker group ready in %.1f s, pids %s", self.start_s, self.pids)

    # ---- starting: one host, or several
    def _one_host_env(self) -> dict[str, str]:
        """One host: TorchTPU's launch environment, once for all ranks (each on its own would pick others)."""
        kind = self.config.kind
        env = process_env.tpu_worker_env(self.config.world_size) if kind == "tpu" else process_env.worker_env(kind)
        self.tpu_env = {k: env[k] for k in (process_env.HANDSHAKE_PORT, process_env.TIER2_CACHE) if k in env}
        return env

    def _joined_hosts(self) -> hosts.HostRegistry:
        """Several hosts: the registry holding the hosts this group takes a share of (each still joined), and
        the group's key, derived from the cluster secret on every host."""
        cluster = hosts.registry()
        self.remote = [h for a in self.config.hosts for h in cluster.hosts() if h.address == a]
        if len(self.remote) != len(self.config.hosts):
            raise WorkerCrashed(f"host(s) {', '.join(self.config.hosts)} no longer all joined; the next run "
                                "plans again with the hosts that have.", request_started=False)
        self.secret = hosts.group_secret(cluster.secret, self.group_id)
        return cluster

    def _several_hosts_env(self, cluster: hosts.HostRegistry) -> dict[str, str]:
        kind = self.config.kind
        env = {**process_env.worker_env(kind, whole_slice=True),
               "GLOO_SOCKET_IFNAME": hosts.interface_of(cluster.cluster.listen)}
        if kind == "tpu":  # rank 0 serves TorchTPU's handshake on this host
            self.tpu_env = process_env.tpu_group_env(cluster.cluster.listen)
        return {**env, **self.tpu_env}

    def _launch_across_hosts(self, cluster: hosts.HostRegistry, env: dict[str, str], controller: str) -> None:
        """Host 0's share through torchrun, then each other host's through its agent (static rendezvous)."""
        port = free_port(cluster.cluster.listen)
        nnodes, per = 1 + len(self.remote), self.config.per_host
        self.launcher.start(env, self.secret, torchrun_command(nnodes, 0, per, cluster.cluster.listen, port))
        cluster.start_group(self.group_id, self.remote, nnodes, per, port, controller, self.config.kind,
                            {k: v for k, v in self.tpu_env.items() if k == process_env.HANDSHAKE_PORT})

    def _wait_for_hellos(self, listener: Listener, cluster: hosts.HostRegistry | None,
                         hellos: dict[int, tuple[Link, Hello]], joined: list[Link],
                         should_interrupt: Callable[[], bool] | None) -> None:
        """Accepts the ranks' links until every rank said hello, or raises why not (a rank ended, a host's share
        ended, Cancel, START_TIMEOUT_S)."""
        n, kind = self.config.world_size, self.config.kind
        deadline = time.monotonic() + START_TIMEOUT_S
        while len(hellos) < n:
            if ended := self.launcher.exited():
                rank = min(ended)
                pid = self.pids[rank] if self.pids else None
                who = f"worker rank {rank} (pid {pid})" if self.pids else "launcher"
                raise WorkerCrashed(f"{kind} {who} ended before all {n} workers were ready"
                                    f"{self.launcher.exit_cause(rank)}.{self.launcher.log_tail()}",
                                    rank=rank if self.pids else None, pid=pid)
            if cluster is not None and (gone := cluster.ended(self.group_id, self.remote)):
                raise WorkerCrashed(f"{gone[0]} before all {n} workers were ready; see that host's "
                                    "`python -m backend join` log.")
            if should_interrupt is not None and should_interrupt():
                raise Interrupted(f"cancelled while the {kind} workers were starting; they were stopped, and "
                                  "the next run starts them again.")
            if time.monotonic() > deadline:
                raise WorkerCrashed(f"workers were not ready after {START_TIMEOUT_S:.0f} s "
                                    f"({settings.START_TIMEOUT.name}).{self.launcher.log_tail()}")
            # Ranks say hello only once all of them joined torch.distributed, so take every rank's link
            # first and never wait on one rank's hello while another waits to be accepted.
            for link in wait(joined, timeout=0) if joined else []:
                joined.remove(link)
                try:
                    hello = link.recv()
                except (EOFError, OSError):
                    link.close()
                    continue
                # one of ours (authenticated with this group's key), once per rank
                ours = hello.pid in self.pids if not self.config.hosts else 0 <= hello.rank < n
                if isinstance(hello, Hello) and ours and hello.rank not in hellos:
                    hellos[hello.rank] = (link, hello)
                else:
                    link.close()
            if (link := listener.get(timeout=0.2)) is not None:
                joined.append(link)

    def alive(self) -> bool:
        if self.closed or not self.launcher.running():
            return False
        return not self.remote or not hosts.registry().ended(self.group_id, self.remote)

    def origin(self, rank: int) -> dict:
        """Where `rank` runs, as the fields of a RankError: rank, pid and host (None: this host, or unknown)."""
        pid = self.pids[rank] if rank < len(self.pids) else None
        host = self.links[rank].peer.rsplit(":", 1)[0] if self.remote and rank < len(self.links) else None
        return {"rank": rank, "pid": pid, "host": host}

    def who(self, rank: int) -> str:
        """'rank 1 (pid 123)', with the host when the group spans several: '... on host 10.0.0.2'."""
        where = self.origin(rank)
        host = f" on host {where['host']}" if where["host"] else ""
        return f"rank {rank} (pid {'?' if where['pid'] is None else where['pid']}{host})"

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
        if self.remote:
            hosts.registry().stop_group(self.group_id, self.remote)
        self.launcher.stop(timeout)
        for link in self.links:
            link.close()
        self.launcher.close()
        handoff.remove_leftovers(handoff.shm_prefix(self.group_id))
        process_env.remove_tier2_cache(self.tpu_env)
        log.info("comfyui-tpu: worker group %s stopped", self.config)

    # ---- requests
    def load(self, spec: PipelineSpec, on_progress: ProgressFn | None = None,
             should_interrupt: Callable[[], bool] | None = None) -> list[Result]:
        return self.request(lambda rid: messages.load_request(rid, spec), on_progress, should_interrupt)

    def sample(self, spec: PipelineSpec, req: SampleRequest, on_progress: ProgressFn | None = None,
               should_interrupt: Callable[[], bool] | None = None,
               arrays: dict[str, np.ndarray] | None = None) -> list[Result]:
        return self.request(lambda rid: messages.sample_request(rid, spec, req), on_progress, should_interrupt,
                            arrays)

    def decode(self, spec: PipelineSpec, arrays: dict[str, np.ndarray], on_progress: ProgressFn | None = None,
               should_interrupt: Callable[[], bool] | None = None) -> list[Result]:
        return self.request(lambda rid: messages.decode_request(rid, spec), on_progress, should_interrupt, arrays)

    def info(self) -> list[Result]:
        return self.request(messages.info_request)

    def request(self, build: Callable[[int], dict], on_progress: ProgressFn | None = None,
                should_interrupt: Callable[[], bool] | None = None,
                arrays: dict[str, np.ndarray] | None = None) -> list[Result]:
        """Sends one request (`build(request id)`) to every rank and waits for every rank's result; returns
        them by rank. `arrays` (input images) are written once to /dev/shm, mapped by every rank, and deleted
        when the request is over (over several hosts they go over every link instead).

        Progress goes to `on_progress` while waiting. If `should_interrupt()` turns true, or `on_progress`
        raises (ComfyUI's progress hook raises on interrupt), every rank is told to stop at its next step, and
        the exception (or `Interrupted`) is raised once they have; a rank that has not stopped CANCEL_GRACE_S
        after that ends the group instead (`_check_liveness`). Cancelled before it is sent, it is not sent.
        """
        with self._lock:
            if not self.alive():
                raise WorkerCrashed("the worker group is not running.", request_started=False)
            if should_interrupt is not None and should_interrupt():
                raise Interrupted(Interrupted.DEFAULT)
            call = _Call(next(self._ids), len(self.links))
            msg, specs, inline = build(call.rid), [], []
            if arrays:  # a group over several hosts: other hosts cannot map this host's /dev/shm, all go inline
                prefix = None if self.remote else handoff.shm_prefix(self.group_id) + "in-"
                specs, inline = handoff.pack(arrays, prefix, call.rid)
                msg = {**msg, "arrays": specs}
            try:
                for rank in range(len(self.links)):
                    self._send(rank, msg, call, inline)
                try:
                    self._collect(call, on_progress, should_interrupt)
                except (Interrupted, WorkerCrashed, WorkerError):
                    raise
                except BaseException:
                    self._interrupt_and_drain(call)
                    raise
            finally:
                handoff.remove(specs)  # every rank mapped them when it received the request
            return [call.replies[r] for r in range(len(self.links))]

    def _send(self, rank: int, msg: dict, call: _Call, inline: list | None = None) -> None:
        try:
            self.links[rank].send(msg, inline)
        except OSError as e:
            self._crashed(rank, e, call)

    def _recv(self, rank: int, call: _Call) -> Reply:
        try:
            reply = self.links[rank].recv()
        except (EOFError, OSError) as e:
            self._crashed(rank, e, call)
            raise AssertionError("unreachable") from None
        call.heard[rank] = time.monotonic()
        if isinstance(reply, Accepted) and reply.id == call.rid:
            call.started = True
        return reply

    def _collect(self, call: _Call, on_progress: ProgressFn | None,
                 should_interrupt: Callable[[], bool] | None) -> None:
        failed_at: float | None = None  # when the first rank reported an error
        while len(call.replies) < len(self.links):
            if should_interrupt is not None and call.cancelled_at is None and should_interrupt():
                self._broadcast_interrupt(call)
            if failed_at is None and any(isinstance(r, Failure) for r in call.replies.values()):
                failed_at = time.monotonic()  # stop the others at their next step: the request has failed
                if call.cancelled_at is None:
                    self._broadcast_interrupt(call)
            if failed_at is not None and time.monotonic() - failed_at > ERROR_GRACE_S:
                # The others are stuck, e.g. in a collective with the failed rank: only a restart frees them.
                error, where = self._first_error(call)
                self.close()
                raise WorkerError(f"{error} The other workers did not stop within {ERROR_GRACE_S:.0f} s "
                                  "(they wait for the failed one), so the group was stopped; the next run "
                                  "starts a fresh one.", **where)
            self._check_liveness(call)
            pending = [link for r, link in enumerate(self.links) if r not in call.replies]
            for link in wait(pending, timeout=0.1):
                rank = self.links.index(link)
                reply = self._recv(rank, call)
                if isinstance(reply, (Heartbeat, Accepted)) or getattr(reply, "id", None) not in (call.rid, None):
                    continue
                if isinstance(reply, (Status, Step)):
                    if on_progress is not None:
                        on_progress(reply)
                elif isinstance(reply, FINAL):
                    call.replies[rank] = reply
        if any(isinstance(r, Failure) for r in call.replies.values()):  # before Stopped: a failure stops the others
            failure = next(r for r in call.replies.values() if isinstance(r, Failure))
            if failure.input_error in INPUT_ERRORS:  # the choice cannot work here: the same answer on every rank
                raise INPUT_ERRORS[failure.input_error](failure.message)
            log.error("comfyui-tpu: a worker request failed:\n%s", failure.traceback)
            error, where = self._first_error(call)
            raise WorkerError(error, **where)
        if any(isinstance(r, Stopped) for r in call.replies.values()):
            raise Interrupted(Interrupted.DEFAULT)

    def _check_liveness(self, call: _Call) -> None:
        """Ends the group when a rank that owes an answer has said nothing for SILENCE_TIMEOUT_S, or, once Cancel
        was sent, has not stopped within CANCEL_GRACE_S (or the silence timeout, if shorter), whether it is
        silent (stopped, hung) or still busy and heartbeating (one step, VAE pass, load or compile that long)."""
        now = time.monotonic()
        owing = [r for r in range(len(self.links)) if r not in call.replies]
        if call.cancelled_at is None:
            silent = [r for r in owing if now - call.heard[r] > SILENCE_TIMEOUT_S]
            if not silent:
                return
            tail = self.launcher.log_tail()  # before close(), which closes the log
            where = self.origin(silent[0])
            self.close()
            raise WorkerCrashed(
                f"the {self.config.kind} worker {', '.join(self.who(r) for r in silent)} stopped answering (no "
                f"message, not even a heartbeat, for {SILENCE_TIMEOUT_S:.0f} s, {settings.SILENCE_TIMEOUT.name}); the "
                f"group was stopped and the next run starts fresh ones.{tail}", request_started=call.started, **where)
        bound = min(SILENCE_TIMEOUT_S, CANCEL_GRACE_S)
        if now - call.cancelled_at <= bound or not owing:
            return
        # A silent rank is the cause; its busy peers may only be waiting for it in a collective.
        if quiet := [r for r in owing if now - call.heard[r] > QUIET_S]:
            why = (f"{', '.join(self.who(r) for r in quiet)} did not answer within {bound:.0f} s of the request to "
                   "stop (no step, no heartbeat: stopped or hung)")
        else:
            why = (f"{', '.join(self.who(r) for r in owing)} did not stop within {bound:.0f} s of the request to "
                   "stop (still busy in one step, VAE pass, load or compile, none of which can stop midway)")
        tail = self.launcher.log_tail()
        where = self.origin((quiet or owing)[0])
        self.close(timeout=STOP_TIMEOUT_S)
        raise Interrupted(f"cancelled; {self.config.kind} worker {why}, so the group was stopped "
                          f"({settings.CANCEL_GRACE.name}); the next run starts a fresh one and loads the model "
                          f"again.{tail}", **where)

    def _first_error(self, call: _Call) -> tuple[str, dict]:
        """The message of the first rank that failed (replies keep their arrival order), naming the rank, and
        where it runs (`origin`)."""
        rank, failure = next((r, msg) for r, msg in call.replies.items() if isinstance(msg, Failure))
        if len(self.links) > 1:
            return f"{self.config.kind} worker rank {rank}: {failure.message}", self.origin(rank)
        return failure.message, self.origin(rank)

    def _broadcast_interrupt(self, call: _Call) -> None:
        """Tells every rank to stop at its next step (once per request: Cancel's bound counts from the first)."""
        if call.cancelled_at is not None:
            return
        call.cancelled_at = time.monotonic()
        for rank in range(len(self.links)):
            self._send(rank, messages.interrupt(call.rid), call)

    def _interrupt_and_drain(self, call: _Call) -> None:
        """After an exception in the controller: stop the ranks and wait until they are idle again (ended within
        CANCEL_GRACE_S by `_check_liveness`)."""
        try:
            self._broadcast_interrupt(call)
            while len(call.replies) < len(self.links):
                self._check_liveness(call)
                pending = [link for r, link in enumerate(self.links) if r not in call.replies]
                for link in wait(pending, timeout=0.2):
                    rank = self.links.index(link)
                    reply = self._recv(rank, call)
                    if isinstance(reply, FINAL) and reply.id == call.rid:
                        call.replies[rank] = reply
        except (WorkerCrashed, Interrupted) as e:  # the group is closed; the caller's own exception is raised
            log.warning("comfyui-tpu: %s", str(e).splitlines()[0])

    def _crashed(self, rank: int, error: BaseException, call: _Call) -> None:
        who, where = self.who(rank), self.origin(rank)
        self.launcher.wait_any(EXIT_REPORT_S)  # a rank that closed its link is usually exiting
        tail = self.launcher.log_tail()
        cause = self.launcher.exit_cause(rank)
        if not cause and not isinstance(error, EOFError):
            cause = f" ({type(error).__name__})"
        if self.remote and (gone := hosts.registry().ended(self.group_id, self.remote)):
            cause += f"; {gone[0]}"
        self.close(timeout=2.0)
        raise WorkerCrashed(
            f"{self.config.kind} worker {who} stopped unexpectedly{cause}. The group was stopped; the next run "
            f"starts a fresh one.{tail}", request_started=call.started, **where)


class _Call:
    """One request under way: its id, the replies so far, when each rank was last heard, whether any rank took
    it up (`Accepted`), and when Cancel was sent."""

    def __init__(self, rid: int, ranks: int):
        self.rid = rid
        self.replies: dict[int, Reply] = {}
        now = time.monotonic()
        self.heard = dict.fromkeys(range(ranks), now)
        self.started = False
        self.cancelled_at: float | None = None


_current: WorkerGroup | None = None
_current_lock = threading.Lock()


def get_group(config: GroupConfig, on_status: Callable[[str], None] | None = None,
              should_interrupt: Callable[[], bool] | None = None) -> WorkerGroup:
    """The running group for `config`, started if needed (Cancel stops a start: `WorkerGroup.start`). Chips are
    exclusive: another group is stopped first."""
    global _current
    with _current_lock:
        if _current is not None and _current.config == config and _current.alive():
            return _current
        if _current is not None:
            _current.close()
            _current = None
        group = WorkerGroup(config)
        group.start(on_status, should_interrupt)
        _current = group
        return group


def run(config: GroupConfig, call: Callable[[WorkerGroup], T], on_status: Callable[[str], None] | None = None,
        should_interrupt: Callable[[], bool] | None = None) -> T:
    """`call(group)` on the running group for `config`. If a worker had died before any rank took the request
    up (e.g. while idle), nothing had started: the request runs once more, on a fresh group."""
    try:
        return call(get_group(config, on_status, should_interrupt))
    except WorkerCrashed as e:
        if e.request_started:
            raise
        log.warning("comfyui-tpu: a worker had died before the request started (%s); retrying on a fresh group",
                    str(e).splitlines()[0])
    return call(get_group(config, on_status, should_interrupt))


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
