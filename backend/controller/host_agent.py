"""`python -m backend join HOST0[:PORT]`: runs on every host of a slice but the one with ComfyUI.

It dials host 0, proves it holds the cluster secret (the HMAC handshake, both ways; the secret file must be
private to its owner), says which address it has and how many worker processes it runs, then waits. For each
group host 0 starts, it runs torch's own launcher (torchrun, static rendezvous, its fixed node rank) for this
host's share, with the group's key (derived here from the cluster secret) in a 0600 file; it stops them when
asked, when they end, or when host 0 goes away, and then dials again. It never listens on the network: gloo's
connections (bound to the cluster's interface) and the workers' own links to host 0 are all it opens.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from multiprocessing.connection import AuthenticationError, Client, Connection
from pathlib import Path

from ..protocol import settings
from . import hosts, process_env
from .launcher import PACK_ROOT, torchrun_command

log = logging.getLogger("comfyui_tpu.join")
RETRY_S = 3.0


class Share:
    """This host's share of one group: a torchrun agent and its workers."""

    def __init__(self, group_id: str, proc: subprocess.Popen, run_dir: Path, log_fd: int, tpu_env: dict[str, str]):
        self.group_id, self.proc, self.run_dir, self.log_fd = group_id, proc, run_dir, log_fd
        self.tpu_env = tpu_env  # its tier-2 compile cache name, removed with it
        self.stopping = False  # asked to stop (by host 0, or because host 0 left): its exit is no news

    def tail(self, lines: int = 12) -> str:
        try:
            size = os.fstat(self.log_fd).st_size
            text = os.pread(self.log_fd, 8192, max(0, size - 8192)).decode(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.strip().splitlines()[-lines:])

    def stop(self) -> None:
        self.stopping = True
        if self.proc.poll() is None:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(self.proc.pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
                try:
                    self.proc.wait(timeout=5)
                    break
                except subprocess.TimeoutExpired:
                    continue
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # workers that outlived their agent
        except (ProcessLookupError, PermissionError):
            pass
        os.close(self.log_fd)
        shutil.rmtree(self.run_dir, ignore_errors=True)
        process_env.remove_tier2_cache(self.tpu_env)


class Agent:
    def __init__(self, controller: str, secret: bytes, kind: str, procs: int):
        host, sep, port = controller.rpartition(":")
        self.address = (host, int(port)) if sep and port.isdigit() else (controller, int(settings.HOST_PORT.default))
        self.secret, self.kind, self.procs = secret, kind, procs
        self.shares: dict[str, Share] = {}
        self.send_lock = threading.Lock()

    def serve_forever(self) -> int:
        while True:
            try:
                conn = Client(self.address, authkey=self.secret)
            except AuthenticationError:
                log.error("host 0 (%s:%d) refused this host's cluster secret: copy host 0's secret file here "
                          "(`%s`).", *self.address, settings.CLUSTER_SECRET.name)
                return 2
            except (ConnectionError, OSError) as e:
                log.info("waiting for host 0 at %s:%d (%s)", *self.address, e.strerror or e)
                time.sleep(RETRY_S)
                continue
            try:
                self.serve(conn)
            except (EOFError, OSError):
                log.warning("host 0 went away; stopping this host's workers and dialling again")
            finally:
                for share in list(self.shares.values()):
                    share.stop()
                self.shares.clear()
                conn.close()
            time.sleep(RETRY_S)

    def serve(self, conn: Connection) -> None:
        with socket.socket(fileno=os.dup(conn.fileno())) as sock:
            mine = sock.getsockname()[0]  # the address this host reaches host 0 from
        conn.send({"address": mine, "hostname": socket.gethostname(), "kind": self.kind, "procs": self.procs,
                   "pid": os.getpid()})
        log.info("joined host 0 at %s:%d as %s with %d %s worker process(es)", *self.address, mine, self.procs,
                 self.kind)
        while True:
            msg = conn.recv()
            if msg.get("op") == "start":
                self.start(conn, msg, mine)
            elif msg.get("op") == "stop" and (share := self.shares.pop(msg.get("group_id"), None)):
                share.stop()

    def start(self, conn: Connection, msg: dict, mine: str) -> None:
        gid = str(msg["group_id"])
        index = os.environ.get("JOB_COMPLETION_INDEX")
        if msg["kind"] == "tpu" and index is not None and index != str(msg["node_rank"]):
            # TorchTPU lays the slice out by this index; torchrun's node rank must be the same
            self._send(conn, {"type": "ended", "group_id": gid, "why": (
                f"this host is worker {index} of the slice but COMFYUI_TPU_HOSTS lists it as host {msg['node_rank']}: "
                "list the hosts in worker order, worker 0 first")})
            return
        run_dir = Path(tempfile.mkdtemp(prefix="comfyui-tpu-join-"))
        secret_file = run_dir / "secret"
        fd = os.open(secret_file, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        with open(fd, "w") as f:
            f.write(hosts.group_secret(self.secret, gid).hex())
        log_fd, log_name = tempfile.mkstemp(dir=run_dir, suffix=".log")
        os.unlink(log_name)
        tpu = process_env.tpu_group_env() if msg["kind"] == "tpu" else {}  # this host's own tier-2 cache name
        allocator = process_env.allocator_env(os.environ) if msg["kind"] == "tpu" else {}
        env = {**os.environ, **allocator, **tpu, **{str(k): str(v) for k, v in msg.get("env", {}).items()},
               settings.CONTROLLER.name: str(msg["controller"]), settings.SECRET_FILE.name: str(secret_file),
               settings.GROUP_ID.name: gid, settings.DEVICE_KIND.name: str(msg["kind"]),
               settings.INLINE_ARRAYS.name: "1",  # another host: images go over the link, not /dev/shm
               "GLOO_SOCKET_IFNAME": hosts.interface_of(mine), "PYTHONUNBUFFERED": "1",
               "PYTHONPATH": os.pathsep.join([str(PACK_ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
        cmd = torchrun_command(int(msg["nnodes"]), int(msg["node_rank"]), int(msg["nproc"]), str(msg["master_addr"]),
                               int(msg["master_port"]))
        try:
            proc = subprocess.Popen(cmd, env=env, cwd=str(PACK_ROOT), stdin=subprocess.DEVNULL, stdout=log_fd,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as e:
            os.close(log_fd)
            shutil.rmtree(run_dir, ignore_errors=True)
            self._send(conn, {"type": "ended", "group_id": gid, "why": f"could not start torchrun: {e}"})
            return
        share = self.shares[gid] = Share(gid, proc, run_dir, log_fd, tpu)
        log.info("started this host's %d worker(s) of group %s (node rank %s)", msg["nproc"], gid, msg["node_rank"])
        self._send(conn, {"type": "started", "group_id": gid, "pid": proc.pid})
        threading.Thread(target=self._watch, args=(conn, share), daemon=True).start()

    def _watch(self, conn: Connection, share: Share) -> None:
        code = share.proc.wait()
        why = f"torchrun exited with code {code}"
        if share.stopping:
            log.info("stopped this host's workers of group %s", share.group_id)
        elif code:
            log.warning("group %s ended on this host (%s):\n%s", share.group_id, why, share.tail())
        try:
            self._send(conn, {"type": "ended", "group_id": share.group_id, "why": why})
        except OSError:
            pass

    def _send(self, conn: Connection, msg: dict) -> None:
        with self.send_lock:
            conn.send(msg)


def main(controller: str, secret_file: str | None, kind: str, procs: int | None) -> int:
    logging.basicConfig(level=logging.INFO, format="[ComfyUI-TPU join] %(message)s")
    cluster = hosts.cluster_from_env()
    secret = hosts.read_secret(Path(secret_file).expanduser() if secret_file else cluster.secret_file)
    if kind == "auto":
        from .devices import detect

        kind = detect().kind
    from .capacity import host_capacity

    cap = host_capacity(kind)
    count = procs or hosts.procs_per_host(kind, cap.limit if cap.chips else None)
    return Agent(controller, secret, kind, count).serve_forever()
