"""Errors of the right kind: an input error only for a choice in the graph; a group that could not start (here or on
another host) is a crashed group, which gets the one retry; errors about a worker process carry its rank, pid
and host as fields, beside the words in the message."""

from __future__ import annotations

import threading
from multiprocessing.connection import Pipe
from pathlib import Path

import pytest

from backend.controller import group, hosts
from backend.controller.link import Link
from backend.protocol.errors import INPUT_ERRORS, InputError, RankError, WorkerCrashed
from backend.protocol.spec import GroupConfig

pytestmark = pytest.mark.unit


def _registry_with_one_host(answer: dict) -> tuple[hosts.HostRegistry, hosts.Host]:
    """Host 0's registry with one joined host whose agent (the other end of a pipe) answers a start request with
    `answer`; the registry's own reader thread takes the answer in, as it does a real agent's."""
    ours, agents = Pipe()
    registry = hosts.HostRegistry.__new__(hosts.HostRegistry)  # no listening socket: the agent is the pipe
    registry.cluster = hosts.Cluster(("10.0.0.1", "10.0.0.2"), "10.0.0.1", 29470, Path("/nonexistent"))
    registry._hosts, registry._left, registry._lock = {}, [], threading.Condition()
    host = hosts.Host(1, "10.0.0.2", "b", "cpu", 1, 4242, Link(ours, "10.0.0.2:5000"))
    registry._hosts[1] = host

    def agent():
        start = agents.recv()
        agents.send({**answer, "group_id": start["group_id"]})
        try:
            agents.recv()  # stays joined (an agent that hangs up has left) until host 0 closes the link
        except (EOFError, OSError):
            pass

    threading.Thread(target=agent, daemon=True).start()
    threading.Thread(target=registry._read_forever, args=(host,), daemon=True).start()
    return registry, host


def test_another_host_failing_to_start_its_workers_is_a_crashed_group_that_gets_the_retry():
    registry, host = _registry_with_one_host({"type": "ended", "why": "torchrun exited with code 1"})
    with pytest.raises(WorkerCrashed) as e:
        registry.start_group("123-abc", [host], 2, 1, 29500, "10.0.0.1:4000", "cpu")
    assert not isinstance(e.value, InputError), "an input error skips the retry a crashed group gets"
    assert e.value.request_started is False and e.value.host == "10.0.0.2"
    assert "host 1 (10.0.0.2) could not start its workers: ended (torchrun exited with code 1)" in str(e.value)


def test_a_group_that_could_not_start_is_started_once_more(monkeypatch):
    """What group.run does with that error: one more try, on a fresh group."""
    tries = []

    def get_group(config, on_status=None, should_interrupt=None):
        tries.append(config)
        if len(tries) == 1:
            raise WorkerCrashed("host 1 (10.0.0.2) could not start its workers", request_started=False,
                                host="10.0.0.2")
        return "a fresh group"

    monkeypatch.setattr(group, "get_group", get_group)
    assert group.run(GroupConfig("cpu", 2), lambda g: g) == "a fresh group" and len(tries) == 2


def test_errors_about_a_worker_carry_rank_pid_and_host_as_fields():
    e = WorkerCrashed("cpu worker rank 1 (pid 77 on host 10.0.0.2) stopped unexpectedly", request_started=True,
                      rank=1, pid=77, host="10.0.0.2")
    assert (e.rank, e.pid, e.host, e.request_started) == (1, 77, "10.0.0.2", True)
    assert isinstance(e, RankError) and (RankError("x").rank, RankError("x").pid, RankError("x").host) == (None,) * 3
    assert "OptionError" in INPUT_ERRORS and "SampleError" in INPUT_ERRORS, "a worker's input errors come back by name"
