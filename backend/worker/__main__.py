"""One worker process (one rank, one chip): `python -m backend.worker`, started by the controller's launcher.

It caps its memory (CPU), dials the controller, prepares the compile cache and the device before torch
starts them, binds its chip, joins torch.distributed (through the group's FileStore on one host, or the
launcher's environment when torchrun started it), says hello, then serves requests one at a time.
"""

from __future__ import annotations

import os
import threading
import traceback
from datetime import timedelta
from pathlib import Path

from ..protocol import messages, settings
from ..protocol.errors import InputError, Interrupted
from ..protocol.messages import Accepted, Failure, Hello, Result, Stopped
from . import compile_cache, device
from .channel import Channel


def limit_memory(kind: str) -> None:
    """Caps a CPU worker's private memory (RLIMIT_DATA: heap and anonymous mappings, not the mapped
    libraries) at COMFYUI_TPU_WORKER_MEMORY_LIMIT_GB (GiB) when set: a runaway request then fails in the
    worker with an out-of-memory error instead of swapping the host or waking the kernel's OOM killer. Not
    applied to TPU or CUDA workers, whose runtimes manage host memory of their own."""
    gib = settings.WORKER_MEMORY_LIMIT_GB.number()
    if gib is None or kind != "cpu":
        return
    import resource

    limit = int(gib * 2**30)
    hard = resource.getrlimit(resource.RLIMIT_DATA)[1]
    soft = limit if hard == resource.RLIM_INFINITY else min(limit, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))


def preload() -> None:
    """Imports diffusers' pipeline machinery before saying hello (on a fresh worker most of a first load is this
    import, many seconds), so it counts as starting the group: a group started early (COMFYUI_TPU_WARM_START)
    then only loads weights when the first prompt comes; otherwise the import just happens before the load
    instead of during it."""
    from diffusers import DiffusionPipeline  # noqa: F401


def main() -> None:
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    kind = settings.DEVICE_KIND.raw()
    limit_memory(kind)
    secret = bytes.fromhex(Path(settings.SECRET_FILE.raw()).read_text().strip())
    channel = Channel(settings.CONTROLLER.raw(), secret, settings.GROUP_ID.raw() or "solo", rank)

    compile_cache.prepare_cache_env()  # before torch loads and the device starts: they read the folders once
    device.prepare_worker(kind)
    import torch
    import torch.distributed as dist

    threads = settings.WORKER_THREADS.raw()
    if threads:
        torch.set_num_threads(int(threads))
    elif kind == "cpu" and int(os.environ.get("LOCAL_WORLD_SIZE", "1")) > 1:  # torchrun would leave 1 each
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["LOCAL_WORLD_SIZE"])))
    bound = device.torch_device(kind, local_rank)  # bind the chip before the process group uses it
    timeout = timedelta(seconds=settings.COLLECTIVE_TIMEOUT.number())
    if store_path := settings.STORE.raw():  # one host: the group's private FileStore
        dist.init_process_group(backend=device.dist_backend(kind), store=dist.FileStore(store_path, world_size),
                                rank=rank, world_size=world_size, timeout=timeout)
    else:  # started by torchrun (several hosts): its environment says where to meet
        dist.init_process_group(backend=device.dist_backend(kind), timeout=timeout)

    from .runtime import Runtime

    preload()
    runtime = Runtime(kind=kind, device=bound, rank=rank, world_size=world_size, channel=channel)
    threading.Thread(target=channel.receive_forever, daemon=True, name="receiver").start()
    channel.send(Hello(rank=rank, local_rank=local_rank, world_size=world_size, pid=os.getpid(),
                       device=str(runtime.device)))
    threading.Thread(target=channel.heartbeat_forever, daemon=True, name="heartbeat").start()

    while True:
        request = channel.requests.get()
        if request.op == messages.SHUTDOWN:
            break
        channel.busy.set()
        channel.send(Accepted(request.id))
        try:
            value, arrays = runtime.handle(request)
            reply = Result(request.id, value, arrays or {})
        except Interrupted:
            reply = Stopped(request.id)
        except InputError as e:  # the request cannot work here; the worker is fine
            reply = Failure(request.id, str(e), traceback.format_exc(), input_error=type(e).__name__)
        except Exception as e:
            reply = Failure(request.id, runtime.describe_error(e), traceback.format_exc())
        channel.busy.clear()
        channel.send(reply)
    try:
        dist.destroy_process_group()
    finally:
        os._exit(0)


if __name__ == "__main__":
    main()
