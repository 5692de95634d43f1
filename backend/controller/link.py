"""The controller's end of the workers' channels (the mirror of `worker.channel`).

`Listener` accepts the workers' connections and authenticates each with the group's secret (the HMAC challenge
of `multiprocessing.connection`, both ways) in a thread of its own with a deadline, so a connection that sends
nothing never blocks the group's start, Cancel or ComfyUI's shutdown. `accept_forever` is that accept loop, also
used by the several-hosts port (`hosts.HostRegistry`): at most MAX_PENDING connections are authenticated at once
(more are closed on arrival), resource errors (out of file descriptors, EMFILE) are waited out, never fatal,
and refusals are logged at most LOG_BURST times per LOG_EVERY_S. `Link` sends requests to one rank and reads its typed
replies; arrays arrive through /dev/shm (`protocol.handoff`).
"""

from __future__ import annotations

import errno
import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge

from ..protocol import handoff, messages
from ..protocol.messages import Reply

log = logging.getLogger("comfyui_tpu")

AUTH_TIMEOUT_S = 10.0  # a new connection must complete the handshake within this
MAX_PENDING = 32  # connections authenticated at once per port (each holds two descriptors and two threads)
LOG_EVERY_S, LOG_BURST = 10.0, 5  # refusals and accept errors: at most LOG_BURST lines per LOG_EVERY_S
ACCEPT_BACKOFF_S = (0.05, 2.0)  # after an accept error (EMFILE...): first and longest wait before trying again
_CLOSED_ERRNOS = {errno.EBADF, errno.EINVAL, errno.ENOTSOCK}  # accept() on a socket that was closed


class Link:
    """One authenticated connection to a worker rank."""

    def __init__(self, conn: Connection, peer: str = ""):
        self.conn = conn
        self.peer = peer

    def fileno(self) -> int:  # so that multiprocessing.connection.wait() can watch links
        return self.conn.fileno()

    def send(self, msg: dict, inline: list | None = None) -> None:
        """Sends a request; `inline` are the bytes of input arrays that could not go through /dev/shm."""
        self.conn.send(msg)
        for a in inline or ():
            self.conn.send_bytes(memoryview(a).cast("B"))

    def recv(self) -> Reply:
        """The next reply (blocking); raises EOFError or OSError when the worker is gone."""
        data = self.conn.recv()
        arrays = handoff.unpack(self.conn, data.pop("arrays")) if "arrays" in data else None
        return messages.read_reply(data, arrays)

    def close(self) -> None:
        self.conn.close()


def authenticate(sock: socket.socket, secret: bytes, timeout: float = AUTH_TIMEOUT_S) -> Link | None:
    """The HMAC handshake on a fresh connection, both ways; None (connection closed, refusal logged without
    the secret) when the peer fails it or stays silent past `timeout`, or when this process cannot take it
    (no descriptor or thread left)."""
    peer = _peer(sock)
    conn = None
    timed_out = threading.Event()  # set before the cut, so the handshake's error is never read as the peer's

    def cut_off() -> None:
        timed_out.set()
        _cut(sock)

    timer = threading.Timer(timeout, cut_off)
    try:
        conn = Connection(os.dup(sock.fileno()))  # the socket object stays ours, to cut a silent peer off
        timer.start()
        deliver_challenge(conn, secret)
        answer_challenge(conn, secret)
        return Link(conn, peer)
    except Exception as e:  # a process without the secret, one that said nothing in time, or no resources here
        why = "it sent nothing in time" if timed_out.is_set() else f"{type(e).__name__}: {e}"
        refusals.warning(f"refused a connection from {peer or '?'} that failed authentication ({why})")
        if conn is not None:
            conn.close()
        return None
    finally:
        timer.cancel()
        sock.close()


def _cut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _peer(sock: socket.socket) -> str:
    try:
        name = sock.getpeername()
    except OSError:
        return ""
    return f"{name[0]}:{name[1]}" if isinstance(name, tuple) else str(name)


class RateLimitedLog:
    """Warnings of one kind, at most `burst` lines per `every_s`; the first line after a quiet spell says how many
    were left out (a flood of refused connections writes a few lines, not one per connection)."""

    def __init__(self, every_s: float = LOG_EVERY_S, burst: int = LOG_BURST):
        self.every_s, self.burst = every_s, burst
        self._window = -float("inf")  # when the current window began
        self._logged = self._left_out = 0
        self._lock = threading.Lock()

    def warning(self, text: str) -> None:
        with self._lock:
            now = time.monotonic()
            if now - self._window >= self.every_s:
                self._window, self._logged = now, 0
            if self._logged >= self.burst:
                self._left_out += 1
                return
            self._logged += 1
            left_out, self._left_out = self._left_out, 0
        more = f" ({left_out} more like it were not logged)" if left_out else ""
        log.warning("comfyui-tpu: %s%s", text, more)


refusals = RateLimitedLog()


def accept_forever(sock: socket.socket, secret: bytes, on_link: Callable[[Link], None],
                   closed: threading.Event, name: str) -> None:
    """Accepts connections on `sock` until `closed` is set (or the socket is closed) and authenticates each in a
    thread of its own, at most MAX_PENDING at once: one more is closed on arrival. A link that passes goes to
    `on_link`, in that thread (which may keep it: the slot is freed first). Out of descriptors or threads
    (EMFILE, ENFILE, ENOBUFS, ENOMEM), it waits (ACCEPT_BACKOFF_S, doubling) and goes on."""
    slots = threading.BoundedSemaphore(MAX_PENDING)
    wait_s = 0.0
    while not closed.is_set():
        try:
            conn, _ = sock.accept()
        except OSError as e:
            if closed.is_set() or e.errno in _CLOSED_ERRNOS:
                return
            wait_s = min(max(wait_s * 2, ACCEPT_BACKOFF_S[0]), ACCEPT_BACKOFF_S[1])
            refusals.warning(f"cannot accept connections on {_local(sock)} ({e.strerror or e}); trying again "
                             f"in {wait_s:.2f} s")
            closed.wait(wait_s)
            continue
        wait_s = 0.0
        if not slots.acquire(blocking=False):
            refusals.warning(f"refused a connection from {_peer(conn) or '?'}: {MAX_PENDING} connections are "
                             f"being authenticated on {_local(sock)} already")
            conn.close()
            continue
        try:
            threading.Thread(target=_admit, args=(conn, secret, on_link, slots), daemon=True, name=name).start()
        except RuntimeError as e:  # no thread can be started now
            slots.release()
            refusals.warning(f"refused a connection from {_peer(conn) or '?'}: {e}")
            conn.close()


def _admit(sock: socket.socket, secret: bytes, on_link: Callable[[Link], None],
           slots: threading.BoundedSemaphore) -> None:
    try:
        link = authenticate(sock, secret)
    finally:
        slots.release()
    if link is not None:
        on_link(link)


def _local(sock: socket.socket) -> str:
    try:
        host, port = sock.getsockname()[:2]
    except (OSError, ValueError):
        return "?"
    return f"{host}:{port}"


class Listener:
    """Where one group's workers dial in. Each connection is authenticated in its own thread; the links that
    pass arrive on `ready`."""

    def __init__(self, secret: bytes, host: str = "127.0.0.1"):
        self.secret = secret
        self.sock = socket.create_server((host, 0))
        self.address = f"{host}:{self.sock.getsockname()[1]}"
        self.ready: queue.Queue[Link] = queue.Queue()
        self._closed = threading.Event()
        threading.Thread(target=accept_forever, args=(self.sock, secret, self._arrived, self._closed,
                                                      "comfyui-tpu-auth"),
                         daemon=True, name="comfyui-tpu-listener").start()

    def _arrived(self, link: Link) -> None:
        if self._closed.is_set():
            link.close()
        else:
            self.ready.put(link)

    def get(self, timeout: float) -> Link | None:
        try:
            return self.ready.get(timeout=timeout)
        except queue.Empty:
            return None

    def close(self) -> None:
        """Stops listening; links authenticated but not taken are closed."""
        self._closed.set()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        while True:
            try:
                self.ready.get_nowait().close()
            except queue.Empty:
                return
