"""No open doors, no stuck queue: what a running group listens on, hangs that Cancel must end, what a killed
ComfyUI leaves behind, a worker that died while idle, and numbers and names that used to come back raw.

Each case runs through a real ComfyUI server and ends within the `timeout` its `server.run` states (a deadline
that makes the test fail instead of hanging, not a speed check); afterwards the queue is free and the next
prompt works.
"""

from __future__ import annotations

import glob
import os
import pickle
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from comfy_server import ComfyServer, error_message
from helpers import (
    LONG,
    alive,
    device_info,
    group_processes,
    kill_all,
    node_texts,
    pixels,
    prompt,
    run_ok,
    wait_for_log,
    wait_gone,
)

from backend.controller.launcher import RUN_DIR_PREFIX
from backend.protocol import handoff

pytestmark = pytest.mark.server

LOOPBACK = ("127.0.0.1", "::1")
SHARD = {"10": {"class_type": "TPUShardTP", "inputs": {"pipeline": ["1", 0], "degree": 2,
                                                      "shard_text_encoders": False}}}


def sharded(**inputs) -> dict:
    """The demo prompt with Shard TP degree 2 between Load and Sample (two CPU worker processes)."""
    wf = prompt(**inputs)
    wf.update(SHARD)
    wf["2"]["inputs"]["pipeline"] = ["10", 0]
    return wf


def listening(pid: int) -> list[tuple[str, int]]:
    return [(c.laddr.ip, c.laddr.port) for c in psutil.Process(pid).net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN]


def host_addresses() -> list[str]:
    """This machine's own network addresses (where the old launcher's store was reachable)."""
    return [a.address for addrs in psutil.net_if_addrs().values() for a in addrs
            if a.family == socket.AF_INET and not a.address.startswith("127.")]


class _RunsCode:
    """Unpickling this runs `touch MARKER`: what the attacker put into the old launcher's store."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _store_attacks(ports: list[int], marker: Path) -> list[int]:
    """Plays the attack on torchrun's rendezvous store against each port, each from its own process (all at
    once): a c10d store client lists the keys and puts a pickled command where the rendezvous state was. Returns
    the ports that acted as a store. A client that gets no store handshake waits for ever, so the attackers are
    given 20 s."""
    def code(port: int) -> str:
        return textwrap.dedent(f"""
            import os, pickle, sys
            from datetime import timedelta
            from torch.distributed import TCPStore
            class RunsCode:
                def __reduce__(self):
                    return (os.system, ("touch {marker}",))
            store = TCPStore("127.0.0.1", {port}, is_master=False, timeout=timedelta(seconds=5))
            store.set("torch.rendezvous.none", pickle.dumps(RunsCode()))
            print("store", store.num_keys())
        """)

    attackers = {port: subprocess.Popen([sys.executable, "-c", code(port)], stdout=subprocess.PIPE,
                                        stderr=subprocess.DEVNULL, text=True) for port in ports}
    deadline, stores = time.monotonic() + 20, []
    for port, proc in attackers.items():
        try:
            out, _ = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            continue
        if proc.returncode == 0 and out.startswith("store"):
            stores.append(port)
    return stores


# ---- what a running group opens

def test_a_running_group_listens_on_loopback_only_and_no_store_runs_a_pickle(server, tmp_path):
    first = run_ok(server, sharded(seed=4242))
    workers = group_processes(server)
    assert len(workers) == 2, [p.cmdline() for p in workers]
    ports = [(p.pid, ip, port) for p in workers for ip, port in listening(p.pid)]
    assert ports, "gloo's connections listen somewhere: there must be something to attack"
    assert [x for x in ports if x[1] not in LOOPBACK] == [], "a worker listens beyond loopback"
    comfy = [x for x in listening(server.proc.pid) if x[0] not in LOOPBACK]
    assert comfy == [], "ComfyUI's process (with the pack) listens beyond loopback"

    marker = tmp_path / "ran"
    reached = []
    for _, _, port in ports:
        for ip in host_addresses():  # from the host's own network address: refused
            try:
                socket.create_connection((ip, port), timeout=3).close()
                reached.append((ip, port))
            except OSError:
                pass
    stores = _store_attacks([port for _, _, port in ports], marker)  # the old launcher's rendezvous store
    for _, _, port in ports:
        with socket.create_connection(("127.0.0.1", port), timeout=3) as s:  # raw: a sequence number, a pickle
            s.sendall(struct.pack("<Q", 0) + pickle.dumps(_RunsCode(marker)))
    assert reached == [] and stores == []
    again = run_ok(server, sharded(seed=4242))
    assert not marker.exists(), "a connection to the group ran code"
    assert [p.pid for p in group_processes(server)] == [p.pid for p in workers], "the attack cost a restart"
    assert np.array_equal(pixels(first["images"][0]), pixels(again["images"][0]))


def test_the_secret_is_in_no_environment_and_no_command_line(server):
    run_ok(server, prompt())
    workers = group_processes(server)
    assert workers
    for p in workers:
        env, cmd = p.environ(), " ".join(p.cmdline())
        assert "COMFYUI_TPU_SECRET" not in env and "--" not in cmd.split("backend.worker", 1)[1], cmd
        secret_file = Path(env["COMFYUI_TPU_SECRET_FILE"])
        assert oct(secret_file.stat().st_mode & 0o777) == oct(0o600)
        assert oct(secret_file.parent.stat().st_mode & 0o777) == oct(0o700)
        assert secret_file.read_text().strip() not in str(env), "the secret leaked into the environment"
        assert env["GLOO_SOCKET_IFNAME"] == "lo"


# ---- Cancel ends hangs within its grace

def test_cancel_with_a_stopped_tp_rank_ends_the_prompt_names_the_rank_and_frees_the_queue(server):
    run_ok(server, sharded())
    ranks = {w["rank"]: w["pid"] for w in device_info(server)["workers"]}
    group = group_processes(server)
    stopped = []

    def on_message(msg):
        if msg["type"] == "progress" and not stopped:
            stopped.append(ranks[1])
            os.kill(ranks[1], signal.SIGSTOP)  # alive but frozen: rank 0 waits for it in a collective
            server.interrupt()

    try:
        result = server.run(sharded(**LONG), timeout=120, on_message=on_message)
        assert result["status"] == "interrupted", error_message(result)
        texts = node_texts(result, "2")
        assert any(f"rank 1 (pid {ranks[1]}) did not answer within 10 s of the request to stop" in t
                   for t in texts), texts
        assert wait_gone(group, timeout=30) == [], "the stopped rank or its peer was left behind"
        assert len(run_ok(server, sharded())["images"]) == 1
    finally:
        for p in group:
            try:
                p.send_signal(signal.SIGCONT)
            except psutil.Error:
                pass
        kill_all([p for p in group if alive(p)])


def test_cancel_on_a_single_hung_worker_ends_within_the_grace_not_the_silence_timeout(server):
    """The server's silence timeout is the default 120 s; the run's deadline (60 s) is below it."""
    run_ok(server, prompt())
    victim = group_processes(server)[0]
    stopped = []

    def on_message(msg):
        if msg["type"] == "progress" and not stopped:
            stopped.append(victim.pid)
            victim.send_signal(signal.SIGSTOP)
            server.interrupt()

    try:
        result = server.run(prompt(**LONG), timeout=60, on_message=on_message)
        assert result["status"] == "interrupted", error_message(result)
        assert any(f"rank 0 (pid {victim.pid}) did not answer" in t for t in node_texts(result, "2"))
        assert wait_gone([victim], timeout=30) == []
        assert len(run_ok(server, prompt())["images"]) == 1
    finally:
        try:
            victim.send_signal(signal.SIGCONT)
        except psutil.Error:
            pass
        kill_all([victim] if alive(victim) else [])


# ---- a silent connection blocks nothing

def test_a_silent_connection_during_start_blocks_neither_the_start_nor_the_prompt(server):
    run_ok(server, {"1": {"class_type": "TPUFreeWorkers", "inputs": {}}})
    silent: list[socket.socket] = []

    def on_message(msg):  # the Sample node says it starts its workers: the controller's link listens now
        if msg["type"] == "progress_text" and msg["data"]["text"].startswith("starting") and not silent:
            for ip, port in listening(server.proc.pid):
                if port != server.port:
                    silent.append(socket.create_connection((ip, port), timeout=5))

    result = run_ok(server, prompt(), on_message=on_message)
    assert silent, "the link's listener was not found while the workers started"
    assert len(result["images"]) == 1
    for s in silent:  # the controller cuts the silent peer off at its authentication deadline
        s.settimeout(60)
        while s.recv(4096):
            pass
        s.close()
    wait_for_log(server, "failed authentication (it sent nothing in time)")  # logged just after the cut


# ---- SIGKILL of ComfyUI during a hand-off

def test_a_file_left_by_a_killed_comfyui_during_a_hand_off_is_removed_at_the_next_start(
        comfyui_dir, tiny_models, tmp_path):
    first = ComfyServer(str(comfyui_dir), str(tiny_models), work_dir=str(tmp_path / "first")).start()
    pid = first.proc.pid
    workers: list[psutil.Process] = []
    try:
        run_ok(first, prompt())
        workers = group_processes(first)
        stopped = threading.Event()

        def on_message(msg):  # freeze ComfyUI two steps before the end: the worker still finishes and hands off
            if msg["type"] == "progress" and msg["data"]["value"] == 2 and not stopped.is_set():
                os.kill(pid, signal.SIGSTOP)
                stopped.set()

        def follow():
            try:
                first.run(prompt(steps=4, width=256, height=256), timeout=120, on_message=on_message)
            except Exception:
                pass  # its websocket dies with the server

        threading.Thread(target=follow, daemon=True).start()
        assert stopped.wait(120), "the sample never reported its second step"
        pattern = os.path.join(handoff.SHM_DIR, f"{handoff.PREFIX}{pid}-*")
        deadline = time.monotonic() + 60
        while not glob.glob(pattern) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = glob.glob(pattern)
        assert left, "the worker's image never reached /dev/shm"
        os.kill(pid, signal.SIGKILL)
        first.kill()
        assert wait_gone(workers, timeout=30) == [], "the workers outlived their ComfyUI"
        assert all(os.path.exists(p) for p in left), "nothing was left: the case was not reproduced"
    finally:
        for p in [psutil.Process(pid)] if psutil.pid_exists(pid) else []:
            p.send_signal(signal.SIGCONT)
        first.kill()
        kill_all([p for p in workers if alive(p)])

    with ComfyServer(str(comfyui_dir), str(tiny_models), work_dir=str(tmp_path / "second")) as second:
        run_ok(second, prompt())
        assert [p for p in left if os.path.exists(p)] == [], "the next start left the dead controller's file"
        assert glob.glob(os.path.join(str(Path(os.environ.get("TMPDIR", "/tmp"))), f"{RUN_DIR_PREFIX}{pid}-*")) == []


# ---- a worker that died while idle

def test_a_worker_that_died_while_idle_is_replaced_by_the_next_prompt(server):
    run_ok(server, prompt())
    victim = group_processes(server)[0]
    victim.kill()
    result = run_ok(server, prompt(info=True))  # at once: no second prompt needed
    assert len(result["images"]) == 1
    assert [p.pid for p in group_processes(server)] != [victim.pid]
    assert wait_gone([victim], timeout=10) == []


# ---- numbers and names

def test_non_finite_guidance_is_refused_with_a_clear_message(server):
    """NaN passes ComfyUI's own min/max check (every comparison with NaN is false); infinity does not."""
    from comfy_server import PromptFailed

    result = server.run(prompt(guidance=float("nan")), timeout=120)
    assert result["status"] == "error"
    message = error_message(result)
    assert "guidance: nan is not a number the pipeline can use; give a finite value" in message, message
    # ComfyUI keeps the prompt in /history as sent, and its own frontend cannot parse a NaN there (it fails on
    # every page load); this shared server's later frontend tests need it gone
    assert server.post("/history", json={"delete": [result["prompt_id"]]}).status_code == 200
    assert result["prompt_id"] not in server.get("/history").json()
    with pytest.raises(PromptFailed, match="Value inf bigger than max of 30.0: guidance"):
        server.run(prompt(guidance=float("inf")), timeout=120)
    assert len(run_ok(server, prompt())["images"]) == 1


def test_small_messages_are_human(server):
    from comfy_server import PromptFailed

    wf = prompt()
    wf["1"]["inputs"]["model_path"] = "tiny\x00flux"
    with pytest.raises(PromptFailed) as e:
        server.run(wf, timeout=120)
    assert "model_path: 'tiny\\x00flux' contains a NUL character" in str(e.value), str(e.value)
    assert "embedded null byte" not in str(e.value)

    lines = "\n".join(f"a fox number {i}" for i in range(5000))
    result = server.run(prompt(prompt=lines, prompt_per_line=True), timeout=120)
    message = error_message(result)
    assert "prompt: 5000 prompt lines × batch_size 1 = 5000 images in one run is too many" in message, message
    error = next(m for m in result["messages"] if m["type"] == "execution_error")["data"]
    assert error["exception_type"] == "comfyui_tpu.SampleError", error["exception_type"]
