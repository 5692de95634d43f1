"""Several hosts as one worker group, on this machine: two "hosts" in network namespaces this test makes.

Host A runs ComfyUI (with the pack) and host 0's torchrun agent; host B runs the real `python -m backend join`.
They are joined by a virtual link (10.77.0.1 ↔ 10.77.0.2: host addresses are not loopback, and nothing leaves
these namespaces); the test reaches ComfyUI's web API over a second link into host A (10.78.0.2). Namespaces
need root and iproute2: without them the tests skip, saying so.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import numpy as np
import psutil
import pytest
from comfy_server import ComfyServer, error_message
from helpers import LONG, device_info, pixels, prompt, run_ok

pytestmark = pytest.mark.server

ROOT = Path(__file__).resolve().parent.parent
HOST_A, HOST_B, WEB_A = "10.77.0.1", "10.77.0.2", "10.78.0.2"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@pytest.fixture(scope="module")
def namespaces():
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2 (ip): not available here")
    tag = uuid.uuid4().hex[:6]
    a, b = f"ctpu-a-{tag}", f"ctpu-b-{tag}"
    try:
        _ip("netns", "add", a)
        _ip("netns", "add", b)
        _ip("link", "add", f"ca{tag}", "type", "veth", "peer", "name", f"cb{tag}")
        _ip("link", "set", f"ca{tag}", "netns", a)
        _ip("link", "set", f"cb{tag}", "netns", b)
        _ip("-n", a, "addr", "add", f"{HOST_A}/24", "dev", f"ca{tag}")
        _ip("-n", b, "addr", "add", f"{HOST_B}/24", "dev", f"cb{tag}")
        _ip("link", "add", f"cr{tag}", "type", "veth", "peer", "name", f"cw{tag}")
        _ip("link", "set", f"cw{tag}", "netns", a)
        _ip("addr", "add", "10.78.0.1/24", "dev", f"cr{tag}")
        _ip("-n", a, "addr", "add", f"{WEB_A}/24", "dev", f"cw{tag}")
        for ns, dev in ((a, f"ca{tag}"), (b, f"cb{tag}"), (a, f"cw{tag}")):
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "link", "set", dev, "up")
        _ip("link", "set", f"cr{tag}", "up")
        yield a, b
    finally:
        for ns in (a, b):
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", f"cr{tag}"], capture_output=True)


@pytest.fixture(scope="module")
def secret(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cluster") / "secret"
    subprocess.run([sys.executable, "-m", "backend", "make-secret", str(path)], cwd=ROOT, check=True, timeout=60)
    return path


def join(ns: str, secret_file: Path, log: Path) -> subprocess.Popen:
    """Host B's agent: the real `python -m backend join`, inside its namespace."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COMFYUI_TPU_PROCS_PER_HOST": "1"}
    return subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-m", "backend", "join", HOST_A,
                             "--secret-file", str(secret_file), "--device", "cpu"], cwd=ROOT, env=env,
                            stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True)


@pytest.fixture(scope="module")
def cluster(namespaces, secret, comfyui_dir, tiny_models, tmp_path_factory):
    a, b = namespaces
    work = tmp_path_factory.mktemp("host-a")
    env = {"COMFYUI_TPU_HOSTS": f"{HOST_A},{HOST_B}", "COMFYUI_TPU_CLUSTER_SECRET": str(secret),
           "COMFYUI_TPU_PROCS_PER_HOST": "1", "COMFYUI_TPU_SILENCE_TIMEOUT": "20"}
    srv = ComfyServer(str(comfyui_dir), str(tiny_models), work_dir=str(work), env=env, host=WEB_A,
                      prefix=["ip", "netns", "exec", a]).start()
    agent_log = work / "join.log"
    agent = join(b, secret, agent_log)
    srv.agent, srv.agent_log, srv.namespaces = agent, agent_log, (a, b)
    try:
        wait_joined(srv, 1)
        yield srv
    finally:
        srv.stop()
        agent.kill()


def hosts_of(srv: ComfyServer) -> dict:
    return device_info(srv)["hosts"]


def wait_joined(srv: ComfyServer, count: int, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        hosts = hosts_of(srv)
        if len(hosts["joined"]) == count:
            return hosts
        time.sleep(1)
    raise AssertionError(f"{count} host(s) did not join in {timeout:.0f} s: {hosts}\n{srv.agent_log.read_text()}")


def data_parallel(**sample) -> dict:
    """The demo prompt with Data Parallel auto (every process of every joined host) before Sample."""
    wf = prompt(**sample)
    wf["10"] = {"class_type": "TPUDataParallel", "inputs": {"pipeline": ["1", 0], "replicas": 0}}
    wf["2"]["inputs"]["pipeline"] = ["10", 0]
    return wf


def ns_pids(ns: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=30).stdout
    return [int(p) for p in out.split()]


def test_data_parallel_over_two_hosts_draws_the_same_images_as_one_worker(cluster):
    seed = 900
    spread = run_ok(cluster, data_parallel(seed=seed, batch_size=2))
    info = device_info(cluster)
    workers = info["workers"]
    assert len(workers) == 2, workers
    hosts = info["hosts"]
    assert [h["address"] for h in hosts["joined"]] == [HOST_B]
    assert list(hosts["joined"][0]["groups"].values()) == ["running"]
    b_pids = set(ns_pids(cluster.namespaces[1]))
    assert workers[1]["pid"] in b_pids and workers[0]["pid"] not in b_pids, "rank 1 must run on host B"
    alone = run_ok(cluster, prompt(seed=seed, batch_size=2))  # one worker, host A only
    assert len(spread["images"]) == len(alone["images"]) == 2
    for x, y in zip(spread["images"], alone["images"], strict=True):
        assert np.array_equal(pixels(x), pixels(y))


def test_what_the_hosts_open_is_bound_to_the_cluster_and_runs_no_pickle(cluster, tmp_path):
    run_ok(cluster, data_parallel(batch_size=2))
    a, b = cluster.namespaces
    listening = {}  # (namespace, address, port) → command; read with ss: each namespace has its own sockets
    for ns in (a, b):
        out = subprocess.run(["ip", "netns", "exec", ns, "ss", "-ltnpH"], capture_output=True, text=True,
                             timeout=30, check=True).stdout
        for line in out.splitlines():
            fields = line.split()
            ip, _, port = fields[3].rpartition(":")
            pid = int(re.search(r"pid=(\d+)", line)[1])
            listening[(ns, ip.strip("[]"), int(port))] = " ".join(psutil.Process(pid).cmdline()[:4])
    assert listening, "nothing listens: the group did not run"
    wildcard = {k: v for k, v in listening.items() if k[1] in ("0.0.0.0", "::", "*")}
    assert wildcard == {}, f"listening on every interface: {wildcard}"
    assert {ip for _, ip, _ in listening} <= {"127.0.0.1", "::1", HOST_A, HOST_B, WEB_A}, listening
    store_ports = [port for (ns, ip, port), cmd in listening.items() if ns == a and ip == HOST_A and
                   "bound_torchrun" in cmd]
    assert store_ports, f"host 0's rendezvous store was not found: {listening}"
    marker = tmp_path / "ran"
    # the attack on torchrun's store, from the other host: list the keys, put a pickled command in every one
    code = textwrap.dedent(f"""
        import os, pickle
        from datetime import timedelta
        from torch.distributed import TCPStore
        class RunsCode:
            def __reduce__(self):
                return (os.system, ("touch {marker}",))
        store = TCPStore("{HOST_A}", {store_ports[0]}, is_master=False, timeout=timedelta(seconds=10))
        keys = store.list_keys() if hasattr(store, "list_keys") else []
        for key in keys or ["torch.rendezvous.none"]:
            store.set(key, pickle.dumps(RunsCode()))
        print("attacked", len(keys))
    """)
    out = subprocess.run(["ip", "netns", "exec", b, sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("attacked"), out.stderr[-2000:]
    again = run_ok(cluster, data_parallel(batch_size=2))
    assert len(again["images"]) == 2
    assert not marker.exists(), "a connection to the store ran code"


def test_the_secret_crosses_no_command_line_environment_or_log(cluster, secret):
    run_ok(cluster, data_parallel(batch_size=2))
    key = secret.read_text().strip()
    for pid in ns_pids(cluster.namespaces[1]):
        p = psutil.Process(pid)
        assert key not in " ".join(p.cmdline()) and key not in json.dumps(p.environ())
    assert key not in cluster.log_path.read_text() and key not in cluster.agent_log.read_text()


def test_a_wrong_secret_is_refused_and_logged_without_the_secret(cluster, tmp_path, secret):
    wrong = tmp_path / "wrong"
    subprocess.run([sys.executable, "-m", "backend", "make-secret", str(wrong)], cwd=ROOT, check=True, timeout=60)
    log = tmp_path / "intruder.log"
    intruder = join(cluster.namespaces[1], wrong, log)
    try:
        assert intruder.wait(timeout=120) == 2
    finally:
        intruder.kill()
    assert "refused this host's cluster secret" in log.read_text()
    assert "failed authentication" in cluster.log_path.read_text()
    for text in (log.read_text(), cluster.log_path.read_text()):
        assert wrong.read_text().strip() not in text and secret.read_text().strip() not in text
    assert [h["address"] for h in hosts_of(cluster)["joined"]] == [HOST_B], "the real host B was dropped"


def test_a_host_that_dies_mid_prompt_fails_it_naming_host_and_rank_and_the_next_prompt_works(cluster, secret):
    run_ok(cluster, data_parallel(batch_size=2))
    b = cluster.namespaces[1]
    killed = []

    def on_message(msg):
        if msg["type"] == "progress" and not killed:
            killed.extend(ns_pids(b))
            for pid in killed:  # host B is gone: its agent, its torchrun, its worker
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    result = cluster.run(data_parallel(**{**LONG, "batch_size": 2}), timeout=120, on_message=on_message)
    assert killed and result["status"] == "error"
    message = error_message(result)
    assert "worker rank 1 (pid" in message and f"on host {HOST_B}" in message, message
    after = run_ok(cluster, data_parallel(batch_size=2))  # host B left: auto now runs on host A alone
    info = device_info(cluster)
    assert len(after["images"]) == 2 and len(info["workers"]) == 1
    left = info["hosts"]
    assert left["joined"] == [] and [x["address"] for x in left["left"]] == [HOST_B]
    cluster.agent = join(b, secret, cluster.agent_log)  # host B comes back: it joins again
    wait_joined(cluster, 1)
