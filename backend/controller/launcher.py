"""Starting one host's worker processes, keeping their log, stopping them, and saying how a rank ended.

The workers are started by torch's own elastic launcher (`torch.distributed.run`, i.e. torchrun), so that
ranks get the standard RANK / WORLD_SIZE / MASTER_* environment. Their output goes to one file that is
unlinked at once (the launcher writes through its descriptor, the controller reads the tail through its own),
so no log is left behind even when ComfyUI is killed; torchrun's own log folder is removed when the group stops.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

PACK_ROOT = Path(__file__).resolve().parents[2]
RUN_DIR_PREFIX = "comfyui-tpu-run-"


def launch_command(nproc_per_node: int, nnodes: int = 1, rdzv_endpoint: str = "127.0.0.1:0",
                   rdzv_id: str | None = None, log_dir: str | None = None) -> list[str]:
    """The torchrun command that starts one host's workers (one per chip) and joins them into a group."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}",
           f"--nproc-per-node={nproc_per_node}", "--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint}",
           "--max-restarts=0", "--monitor-interval=0.5"]
    if rdzv_id:
        cmd.append(f"--rdzv-id={rdzv_id}")
    if log_dir:  # torchrun otherwise leaves a /tmp/torchelastic_* folder behind at every start
        cmd.append(f"--log-dir={log_dir}")
    return [*cmd, "-m", "backend.worker"]


class Launcher:
    """One host's worker processes: started together, watched through their launcher, stopped together."""

    def __init__(self, nprocs: int):
        self.nprocs = nprocs
        self.proc: subprocess.Popen | None = None
        self._log_fd: int | None = None
        self._run_dir: str | None = None

    def start(self, env: dict[str, str]) -> None:
        """Starts the workers with `env`. On any failure, nothing is left behind (file, folder, process)."""
        _remove_stale_run_dirs()
        try:
            fd, log_name = tempfile.mkstemp(prefix="comfyui-tpu-group-", suffix=".log")
            self._log_fd = fd
            os.unlink(log_name)
            self._run_dir = tempfile.mkdtemp(prefix=f"{RUN_DIR_PREFIX}{os.getpid()}-")
            env = {**env, "PYTHONPATH": os.pathsep.join([str(PACK_ROOT), env.get("PYTHONPATH", "")]).rstrip(
                os.pathsep), "PYTHONUNBUFFERED": "1"}
            self.proc = subprocess.Popen(launch_command(self.nprocs, log_dir=self._run_dir), env=env,
                                         cwd=str(PACK_ROOT), stdin=subprocess.DEVNULL, stdout=fd,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        except BaseException:
            self.close()
            raise

    @property
    def exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait(self, timeout: float) -> bool:
        """Waits up to `timeout` for the launcher to end; True when it has."""
        if self.proc is None:
            return True
        try:
            self.proc.wait(timeout=timeout)
            return True
        except subprocess.TimeoutExpired:
            return False

    def stop(self, worker_pids: list[int], timeout: float) -> None:
        """Ends the launcher and its workers: waits `timeout / 2`, then SIGTERM, then SIGKILL."""
        if self.proc is not None and not self.wait(timeout / 2):
            self._signal_all(signal.SIGTERM, worker_pids)
            if not self.wait(timeout / 2):
                self._signal_all(signal.SIGKILL, worker_pids)
                self.proc.wait()
        for pid in worker_pids:  # a worker that outlived its launcher
            _kill(pid, signal.SIGKILL)

    def _signal_all(self, sig: int, worker_pids: list[int]) -> None:
        for pid in [*worker_pids, *([self.proc.pid] if self.proc else [])]:
            _kill(pid, sig)
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def close(self) -> None:
        """Releases the log and torchrun's folder (after `stop`)."""
        if self._log_fd is not None:
            os.close(self._log_fd)
            self._log_fd = None
        if self._run_dir is not None:
            shutil.rmtree(self._run_dir, ignore_errors=True)
            self._run_dir = None

    def log_tail(self, lines: int = 15, max_bytes: int = 16384) -> str:
        """The last lines the workers and their launcher printed, introduced for an error message."""
        if self._log_fd is None:
            return ""
        try:
            size = os.fstat(self._log_fd).st_size
            data = os.pread(self._log_fd, max_bytes, max(0, size - max_bytes))
        except OSError:
            return ""
        text = data.decode(errors="replace").strip().splitlines()
        return ("\nLast worker log lines:\n" + "\n".join(text[-lines:])) if text else ""

    def exit_cause(self, pid: int | str) -> str:
        """How torchrun saw the rank with `pid` end (from its failure report), e.g. ' (killed by SIGKILL)'."""
        pattern = rf"exitcode\s*:\s*(-?\d+)\s*\(pid:\s*{re.escape(str(pid))}\)"
        found = re.findall(pattern, self.log_tail(lines=200))
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


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _remove_stale_run_dirs() -> None:
    """torchrun log folders of controllers that died without cleaning up (named after the controller's pid)."""
    for path in Path(tempfile.gettempdir()).glob(f"{RUN_DIR_PREFIX}*-*"):
        pid = path.name[len(RUN_DIR_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(path, ignore_errors=True)
