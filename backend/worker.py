"""One worker process (one rank, one chip). Started by torchrun from backend.group; never by hand.

It dials the controller, joins torch.distributed, then serves requests: a receiver thread reads the
channel (so an interrupt arrives while the main thread is busy sampling) and exits the process when
the controller goes away, so a worker never outlives ComfyUI.
"""

from __future__ import annotations

import os
import queue
import threading
import time
import traceback
from multiprocessing.connection import Client

from . import compiler, device, handoff

MEMORY_LIMIT_ENV = "COMFYUI_TPU_WORKER_MEMORY_LIMIT_GB"


class Channel:
    """The worker's end of the controller connection; sends are serialised across threads."""

    def __init__(self, address: str, secret: bytes):
        host, port = address.rsplit(":", 1)
        self.conn = Client((host, int(port)), authkey=secret)
        self.send_lock = threading.Lock()
        self.requests: queue.Queue[dict] = queue.Queue()
        self.interrupt = threading.Event()
        self.busy = threading.Event()  # heartbeats only while serving a request: nobody reads them when idle
        rank = os.environ.get("RANK", "0")
        self.shm_prefix = handoff.shm_prefix(os.environ.get("COMFYUI_TPU_GROUP_ID", "solo")) + f"{rank}-"
        self.sent_arrays = 0

    def send(self, msg: dict, arrays: dict | None = None) -> None:
        """Sends a message; arrays travel through /dev/shm (backend.handoff), never pickled."""
        with self.send_lock:
            inline = []
            if arrays:
                self.sent_arrays += 1
                specs, inline = handoff.pack(arrays, self.shm_prefix, self.sent_arrays)
                msg = {**msg, "arrays": specs}
            self.conn.send(msg)
            for a in inline:
                self.conn.send_bytes(memoryview(a).cast("B"))

    def receive_forever(self) -> None:
        try:
            while True:
                msg = self.conn.recv()
                if msg.get("op") == "interrupt":
                    self.interrupt.set()
                else:
                    # Cleared here, not when the main loop picks the request up: an interrupt that follows
                    # this request on the channel must not be lost.
                    self.interrupt.clear()
                    self.requests.put(msg)
        except (EOFError, OSError):
            os._exit(3)  # the controller is gone: nothing left to serve

    def heartbeat_forever(self) -> None:
        while True:
            time.sleep(2.0)
            if not self.busy.is_set():
                continue
            try:
                self.send({"type": "heartbeat"})
            except OSError:
                os._exit(3)


def limit_memory(kind: str) -> None:
    """Caps a CPU worker's private memory (RLIMIT_DATA: heap and anonymous mappings, not the mapped
    libraries) at COMFYUI_TPU_WORKER_MEMORY_LIMIT_GB (GiB) when set: a runaway request then fails in the
    worker with an out-of-memory error instead of swapping the host or waking the kernel's OOM killer. Not
    applied to TPU or CUDA workers, whose runtimes manage host memory of their own."""
    value = os.environ.get(MEMORY_LIMIT_ENV, "").strip()
    if not value or kind != "cpu":
        return
    import resource

    try:
        limit = int(float(value) * 2**30)
    except ValueError:
        print(f"comfyui-tpu: ignoring {MEMORY_LIMIT_ENV}={value!r}: not a number of GiB", flush=True)
        return
    hard = resource.getrlimit(resource.RLIMIT_DATA)[1]
    soft = limit if hard == resource.RLIM_INFINITY else min(limit, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))


def main() -> None:
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    kind = os.environ["COMFYUI_TPU_DEVICE_KIND"]
    limit_memory(kind)
    channel = Channel(os.environ["COMFYUI_TPU_CONTROLLER"], bytes.fromhex(os.environ["COMFYUI_TPU_SECRET"]))

    compiler.prepare_cache_env()  # before torch loads and the device starts: they read the cache folders once
    device.prepare_worker(kind)
    import torch
    import torch.distributed as dist

    threads = os.environ.get("COMFYUI_TPU_WORKER_THREADS")
    if threads:
        torch.set_num_threads(int(threads))
    elif kind == "cpu" and int(os.environ.get("LOCAL_WORLD_SIZE", "1")) > 1:  # torchrun would leave 1 each
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["LOCAL_WORLD_SIZE"])))
    dist.init_process_group(backend=device.dist_backend(kind))

    from .runtime import Runtime

    runtime = Runtime(kind=kind, rank=rank, local_rank=local_rank, world_size=world_size, channel=channel)
    threading.Thread(target=channel.receive_forever, daemon=True, name="receiver").start()
    channel.send({"type": "hello", "rank": rank, "local_rank": local_rank, "world_size": world_size,
                  "pid": os.getpid(), "device": str(runtime.device)})
    threading.Thread(target=channel.heartbeat_forever, daemon=True, name="heartbeat").start()

    while True:
        msg = channel.requests.get()
        op, rid = msg.get("op"), msg.get("id")
        if op == "shutdown":
            break
        channel.busy.set()
        try:
            value, arrays = runtime.handle(op, msg)
            reply, reply_arrays = {"type": "result", "id": rid, "value": value}, arrays
        except runtime.Interrupted:
            reply, reply_arrays = {"type": "interrupted", "id": rid}, None
        except Exception as e:
            reply, reply_arrays = {"type": "error", "id": rid, "message": runtime.describe_error(e),
                                   "traceback": traceback.format_exc()}, None
        channel.busy.clear()
        channel.send(reply, reply_arrays)
    try:
        dist.destroy_process_group()
    finally:
        os._exit(0)


if __name__ == "__main__":
    main()
