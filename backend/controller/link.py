"""The controller's end of the workers' channels (the mirror of `worker.channel`).

`Listener` accepts the workers' connections and authenticates each with the group's secret (the HMAC challenge
of `multiprocessing.connection`, both ways) in a thread of its own with a deadline, so a connection that sends
nothing never blocks the group's start, Cancel or ComfyUI's shutdown. `Link` sends requests to one rank and
reads its typed replies; arrays arrive through /dev/shm (`protocol.handoff`).
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge

from ..protocol import handoff, messages
from ..protocol.messages import Reply

log = logging.getLogger("comfyui_tpu")

AUTH_TIMEOUT_S = 10.0  # a new connection must complete the handshake within this


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
    the secret) when the peer fails it or stays silent past `timeout`."""
    peer = _peer(sock)
    conn = Connection(os.dup(sock.fileno()))  # the socket object stays ours, to cut a silent peer off
    timer = threading.Timer(timeout, _cut, (sock,))
    timer.start()
    try:
        deliver_challenge(conn, secret)
        answer_challenge(conn, secret)
        return Link(conn, peer)
    except Exception as e:  # a process without the secret, or one that said nothing in time
        why = "it sent nothing in time" if not timer.is_alive() else type(e).__name__
        log.warning("comfyui-tpu: refused a connection from %s that failed authentication (%s)", peer or "?", why)
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


class Listener:
    """Where one group's workers dial in. Each connection is authenticated in its own thread; the links that
    pass arrive on `ready`."""

    def __init__(self, secret: bytes, host: str = "127.0.0.1"):
        self.secret = secret
        self.sock = socket.create_server((host, 0))
        self.address = f"{host}:{self.sock.getsockname()[1]}"
        self.ready: queue.Queue[Link] = queue.Queue()
        self._closed = threading.Event()
        threading.Thread(target=self._accept_forever, daemon=True, name="comfyui-tpu-listener").start()

    def _accept_forever(self) -> None:
        while not self._closed.is_set():
            try:
                sock, _ = self.sock.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._admit, args=(sock,), daemon=True, name="comfyui-tpu-auth").start()

    def _admit(self, sock: socket.socket) -> None:
        link = authenticate(sock, self.secret)
        if link is None:
            return
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
