"""Starting one host's worker processes, keeping their log, stopping them, and saying how a rank ended.

On one host the workers are started directly, one process per rank, with the standard RANK / LOCAL_RANK /
WORLD_SIZE environment, and they meet in torch.distributed through a FileStore in a fresh 0700 folder: no
rendezvous server, nothing that listens on the network (gloo's and NCCL's own connections are pinned to the
loopback interface). The group's secret reaches them in a 0600 file in that folder, never in their environment
or on a command line. Their output goes to one file that is unlinked at once (they write through their
descriptor, the controller reads the tail through its own), so no log is left behind even when ComfyUI is killed.

When the group spans several hosts (controller/hosts.py), host 0's share is started by torch's own launcher
instead, torchrun with static rendezvous at node rank 0, whose store listens on the cluster's address only
(`bound_torchrun`); the other hosts' agents run the same command at their own node ranks.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..protocol import settings

PACK_ROOT = Path(__file__).resolve().parents[2]
RUN_DIR_PREFIX = "comfyui-tpu-run-"
WORKER_COMMAND = [sys.executable, "-m", "backend.worker"]


def torchrun_command(nnodes: int, node_rank: int, nproc: int, master_addr: str, master_port: int) -> list[str]:
    """One host's torchrun agent for a group over `nnodes` hosts: static rendezvous (fixed node ranks, nothing
    pickled in its store), no restarts. Node rank 0 runs it through `bound_torchrun`, so the store listens on
    `master_addr` only, not on every interface."""
    args = [f"--nnodes={nnodes}", f"--node-rank={node_rank}", f"--nproc-per-node={nproc}", "--rdzv-backend=static",
            f"--master-addr={master_addr}", f"--master-port={master_port}", "--max-restarts=0",
            "--monitor-interval=0.5", "-m", "backend.worker"]
    entry = ["-m", "backend.controller.bound_torchrun", master_addr] if node_rank == 0 else ["-m", "torch.distributed.run"]
    return [sys.executable, *entry, *args]


def loopback_env(kind: str) -> dict[str, str]:
    """Pins the collectives' connections to the loopback interface (gloo and NCCL otherwise listen on the
    address the hostname resolves to, which on a cloud VM is its network address)."""
    env = {"GLOO_SOCKET_IFNAME": "lo"}
    if kind == "cuda":
        env["NCCL_SOCKET_IFNAME"] = "=lo"  # '=': exactly this interface, not every name starting with it
    return env


class Launcher:
    """One host's worker processes: started together, watched, stopped together."""

    def __init__(self, nprocs: int):
        self.nprocs = nprocs
        self.procs: list[subprocess.Popen] = []
        self.run_dir: Path | None = None
        self._log_fd: int | None = None
        self.torchrun = False  # one torchrun agent (procs[0]) stands for the ranks

    def start(self, env: dict[str, str], secret: bytes, torchrun: list[str] | None = None) -> None:
        """Starts the workers with `env` (through `torchrun`, host 0's share of a group over several hosts, when
        given). On any failure, nothing is left behind (file, folder, process)."""
        try:
            self.run_dir = Path(tempfile.mkdtemp(prefix=f"{RUN_DIR_PREFIX}{os.getpid()}-"))  # mode 0700
            secret_file = self.run_dir / "secret"
            fd = os.open(secret_file, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
            with open(fd, "w") as f:
                f.write(secret.hex())
            self._log_fd, log_name = tempfile.mkstemp(prefix="comfyui-tpu-group-", suffix=".log", dir=self.run_dir)
            os.unlink(log_name)
            pythonpath = os.pathsep.join([str(PACK_ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
            if torchrun is not None:
                self.torchrun = True
                self.procs.append(subprocess.Popen(
                    torchrun, env={**env, settings.SECRET_FILE.name: str(secret_file), "PYTHONPATH": pythonpath,
                                   "PYTHONUNBUFFERED": "1"},
                    cwd=str(PACK_ROOT), stdin=subprocess.DEVNULL, stdout=self._log_fd, stderr=subprocess.STDOUT,
                    start_new_session=True))
                return
            common = {
                **env, **loopback_env(settings.DEVICE_KIND.raw(env) or "cpu"),
                settings.SECRET_FILE.name: str(secret_file),
                settings.STORE.name: str(self.run_dir / "store"),
                "WORLD_SIZE": str(self.nprocs), "LOCAL_WORLD_SIZE": str(self.nprocs),
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),  # TorchTPU's runtime asks for them
                "PYTHONPATH": pythonpath, "PYTHONUNBUFFERED": "1",
            }
            for rank in range(self.nprocs):
                self.procs.append(subprocess.Popen(
                    WORKER_COMMAND, env={**common, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                    cwd=str(PACK_ROOT), stdin=subprocess.DEVNULL, stdout=self._log_fd, stderr=subprocess.STDOUT,
                    start_new_session=True))
        except BaseException:
            self.stop(timeout=2.0)
            self.close()
            raise

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def running(self) -> bool:
        """Every rank is still alive."""
        return bool(self.procs) and all(p.poll() is None for p in self.procs)

    def exited(self) -> dict[int, int]:
        """rank → exit code of the ranks that have ended."""
        return {r: code for r, p in enumerate(self.procs) if (code := p.poll()) is not None}

    def wait_any(self, timeout: float) -> bool:
        """Waits up to `timeout` for some rank to end; True when one has."""
        deadline = time.monotonic() + timeout
        while not self.exited():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def stop(self, timeout: float) -> None:
        """Ends every rank: waits up to `timeout / 2` for them to leave, then SIGTERM, then SIGKILL (the whole
        session of a torchrun agent: its workers too)."""
        for sig, wait in ((None, timeout / 2), (signal.SIGTERM, timeout / 2), (signal.SIGKILL, None)):
            for p in self.procs:
                if sig is not None and (p.poll() is None or self.torchrun):
                    _kill(-p.pid if self.torchrun else p.pid, sig)
            for p in self.procs:
                try:
                    p.wait(timeout=wait)
                except subprocess.TimeoutExpired:
                    pass
            if all(p.poll() is not None for p in self.procs):
                return

    def close(self) -> None:
        """Releases the log and the group's folder (store, secret); call after `stop`."""
        if self._log_fd is not None:
            os.close(self._log_fd)
            self._log_fd = None
        if self.run_dir is not None:
            shutil.rmtree(self.run_dir, ignore_errors=True)
            self.run_dir = None

    def log_tail(self, lines: int = 15, max_bytes: int = 16384) -> str:
        """The last lines the workers printed, introduced for an error message."""
        if self._log_fd is None:
            return ""
        try:
            size = os.fstat(self._log_fd).st_size
            data = os.pread(self._log_fd, max_bytes, max(0, size - max_bytes))
        except OSError:
            return ""
        text = data.decode(errors="replace").strip().splitlines()
        return ("\nLast worker log lines:\n" + "\n".join(text[-lines:])) if text else ""

    def exit_cause(self, rank: int) -> str:
        """How rank `rank` ended, e.g. ' (killed by SIGKILL: ...)' or ' (exit code 1)'; '' while it runs, or when
        torchrun started it (its agent knows, not us: the log tail says)."""
        code = self.procs[rank].poll() if rank < len(self.procs) and not self.torchrun else None
        if code is None:
            return ""
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            hint = ": a kill command, or the kernel's out-of-memory killer" if code == -signal.SIGKILL else ""
            return f" (killed by {name}{hint})"
        return f" (exit code {code})"


def free_port(address: str = "127.0.0.1") -> int:
    """A port free on `address` now (a group's rendezvous or TorchTPU handshake port: the workers bind it, not us)."""
    with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET) as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def _kill(pid: int, sig: int) -> None:
    """Signals a process, or a whole session when `pid` is negative."""
    try:
        os.killpg(-pid, sig) if pid < 0 else os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def remove_stale_run_dirs() -> None:
    """Run folders of controllers that died without cleaning up (named after the controller's pid); called once
    per group start (WorkerGroup.start)."""
    for path in Path(tempfile.gettempdir()).glob(f"{RUN_DIR_PREFIX}*-*"):
        pid = path.name[len(RUN_DIR_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(path, ignore_errors=True)
