"""The handback figure: how long the images take from a worker to the controller, through the pack's own
channel code.

The worker side is `backend.worker.channel.Channel` (its connect + HMAC handshake and its `send`, which writes
each array once to /dev/shm, backend.protocol.handoff); the controller side is `backend.controller.link`
(`Listener`, which authenticates, and `Link.recv`, which maps the arrays copy-on-write and unlinks their files).
Nothing is copied from them: this module only runs them in two local processes. The worker stamps
CLOCK_MONOTONIC (shared by all processes of a host) just before it starts sending; the controller stamps it
when `Link.recv` returns.

Run as `python -m bench.handback` it is the worker side (started by `measure`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np

from .common import ROOT, Ctx, alternate, log, median, qty, row, summary, target

ID, TITLE = "handback", "Image hand-back worker → controller, 4×1024×1024 float32 RGB"
TARGET = target("<=", 20.0, on="ours", unit="ms")
SHAPE = (4, 1024, 1024, 3)  # what Sample returns for a batch of 4 at 1024² (float32, 48 MiB)


def worker_main() -> None:
    from backend.protocol.messages import Result
    from backend.worker.channel import Channel

    channel = Channel(os.environ["BENCH_CONTROLLER"], bytes.fromhex(os.environ["BENCH_SECRET"]))
    shape = tuple(int(x) for x in os.environ["BENCH_SHAPE"].split(","))
    images = np.random.default_rng(0).random(shape, dtype=np.float32)
    while True:
        msg = channel.conn.recv()
        if msg.get("op") != "send":
            break
        channel.send(Result(msg["id"], {"t_send": time.monotonic()}, {"images": images}))


def figure(ctx: Ctx) -> list[dict]:
    import secrets

    from backend.controller.link import Listener

    secret = secrets.token_bytes(32)
    listener = Listener(secret)
    env = {**os.environ, "BENCH_CONTROLLER": listener.address, "BENCH_SECRET": secret.hex(),
           "BENCH_SHAPE": ",".join(map(str, SHAPE)), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "bench.handback"], env=env, cwd=str(ROOT),
                            stdin=subprocess.DEVNULL)
    link = None
    try:
        link = listener.get(timeout=60)
        if link is None:
            raise RuntimeError("the bench's hand-back worker did not complete the channel handshake in 60 s")
        ids = iter(range(1, 10**6))
        source = np.random.default_rng(1).random(SHAPE, dtype=np.float32)
        round_trips: list[float] = []

        def ours(_r: int) -> float:
            rid = next(ids)
            t0 = time.monotonic()
            link.send({"op": "send", "id": rid})
            msg = link.recv()
            t1 = time.monotonic()
            images = msg.arrays["images"]
            assert images.shape == SHAPE and images.dtype == np.float32 and msg.id == rid
            round_trips.append(t1 - t0)
            return t1 - msg.value["t_send"]

        def plain(_r: int) -> float:  # a plain script has its images in its own process: one copy at most
            t0 = time.monotonic()
            out = np.array(source, copy=True)
            t1 = time.monotonic()
            assert out.shape == SHAPE
            return t1 - t0

        repeats = max(ctx.repeats, 5)
        times = alternate({"ours": ours, "plain": plain}, repeats=repeats, warmup=max(ctx.warmup, 1))
        link.send({"op": "stop"})
    finally:
        listener.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if link is not None:
            link.close()
    ours_ms, plain_ms = [t * 1e3 for t in times["ours"]], [t * 1e3 for t in times["plain"]]
    mib = int(np.prod(SHAPE)) * 4 / 2**20
    log(f"{ID}: {median(ours_ms):.1f} ms (one in-process copy {median(plain_ms):.1f} ms)")
    return [row(ID, TITLE, ratio=median(ours_ms) / median(plain_ms),
                ratio_of="hand-back time ÷ one in-process copy of the same 48 MiB (what a plain script at most "
                         "pays to get its images out of the pipeline); lower is better",
                ours=summary(ours_ms, "ms"), plain=summary(plain_ms, "ms"), tgt=TARGET,
                details={"bytes_mib": mib, "gib_per_s": mib / 1024 / (median(ours_ms) / 1e3),
                         "round_trip_ms": qty(median([t * 1e3 for t in round_trips[-repeats:]]), "ms"),
                         "measured": "worker's monotonic stamp just before Channel.send → controller's stamp "
                                     "after Link.recv returned the array"})]


if __name__ == "__main__":
    worker_main()
