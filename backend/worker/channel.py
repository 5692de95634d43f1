"""The worker's end of the link to the controller (the mirror of `controller.link`).

It dials the controller and answers its HMAC challenge, then a receiver thread reads requests (so an interrupt
arrives while the main thread is busy sampling) and exits the process when the controller goes away, so a
worker never outlives ComfyUI. Sends are serialised across threads; arrays travel through /dev/shm both ways.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from multiprocessing.connection import Client

from ..protocol import handoff, messages, settings
from ..protocol.messages import Heartbeat, Reply, Request


class Channel:
    def __init__(self, address: str, secret: bytes, group_id: str = "solo", rank: int = 0):
        host, port = address.rsplit(":", 1)
        self.conn = Client((host, int(port)), authkey=secret)
        self.send_lock = threading.Lock()
        self.requests: queue.Queue[Request] = queue.Queue()
        self.interrupt = threading.Event()
        self.busy = threading.Event()  # heartbeats only while serving a request: nobody reads them when idle
        # Another host's worker cannot share /dev/shm with the controller: its arrays go over the link.
        inline = settings.INLINE_ARRAYS.on()
        self.shm_prefix = None if inline else handoff.shm_prefix(group_id) + f"{rank}-"
        self.sent_arrays = 0

    def send(self, msg: Reply) -> None:
        """Sends a reply; its arrays travel through /dev/shm (protocol.handoff), never pickled."""
        data, arrays = messages.encode_reply(msg)
        with self.send_lock:
            inline = []
            if arrays:
                self.sent_arrays += 1
                specs, inline = handoff.pack(arrays, self.shm_prefix, self.sent_arrays)
                data = {**data, "arrays": specs}
            self.conn.send(data)
            for a in inline:
                self.conn.send_bytes(memoryview(a).cast("B"))

    def receive_forever(self) -> None:
        try:
            while True:
                data = self.conn.recv()
                specs = data.pop("arrays", None)
                # input images: mapped from the controller's /dev/shm files (it deletes them after the request)
                arrays = handoff.unpack(self.conn, specs, keep=True) if specs else None
                request = messages.read_request(data, arrays)
                if request.op == messages.INTERRUPT:
                    self.interrupt.set()
                else:
                    # Cleared here, not when the main loop picks the request up: an interrupt that follows
                    # this request on the channel must not be lost.
                    self.interrupt.clear()
                    self.requests.put(request)
        except (EOFError, OSError):
            os._exit(3)  # the controller is gone: nothing left to serve

    def heartbeat_forever(self) -> None:
        while True:
            time.sleep(messages.HEARTBEAT_S)
            if not self.busy.is_set():
                continue
            try:
                self.send(Heartbeat())
            except OSError:
                os._exit(3)
