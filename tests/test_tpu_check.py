"""`python -m backend tpu-check` on this CPU host: the same steps a TPU VM runs, on 1 and 2 CPU workers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
STEPS = ["detect the device", "build the tiny model", "start a worker group and load", "sample in strict eager",
         "sample in defer-and-fuse eager", "sample in debug eager (launch blocking)", "compile at two shapes",
         "sample the compiled shapes without recompiling", "restart and reuse the compile cache",
         "Shard TP over several devices", "Data Parallel over several devices: same images"]


@pytest.mark.workers
def test_tpu_check_runs_every_step_and_prints_a_report(tiny_models, tmp_path):
    report = tmp_path / "report.md"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COMFYUI_TPU_WORKER_THREADS": "1"}
    out = subprocess.run([sys.executable, "-m", "backend", "tpu-check", "--models", str(tiny_models), "--out",
                          str(report)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-3000:]
    summary = [line.split(None, 1) for line in out.stdout.splitlines()[-len(STEPS):]]
    assert [name.rsplit(" (", 1)[0] for _, name in summary] == STEPS
    assert [result for result, _ in summary] == ["works"] * len(STEPS), out.stdout
    text = report.read_text()
    assert text.strip() == out.stdout.strip()
    assert "- versions: python " in text and "torch " in text and "diffusers " in text and "torch_tpu " in text
    assert "| defer-and-fuse" not in text and "running strict eager on cpu" in text
    assert "2 reuses, 0 recompiles" in text and "cache folder reused" in text
    assert "TP 2 × 1 replica(s) = 2 workers" in text and "2 replicas: bit-identical to 1 worker(s)" in text


@pytest.mark.unit
def test_a_failing_step_is_reported_with_its_traceback_and_its_dependents_are_skipped():
    from backend.tpu_check import Report, Skip, render

    def boom() -> str:
        raise RuntimeError("no chip answered\nsecond line")

    def skip() -> str:
        raise Skip("this host has one device")

    report = Report()
    report.run("first", lambda: "fine")
    report.run("second", boom, needs=("first",))
    report.run("third", lambda: "never", needs=("second",))
    report.run("fourth", skip)
    assert [(s.result, s.detail) for s in report.steps] == [
        ("works", "fine"), ("fails", "RuntimeError: no chip answered"),
        ("skipped", "needs 'second', which did not work"), ("skipped", "this host has one device")]
    assert report.failed
    text = render(report, "python 3", None, ["comfyui-tpu: a worker request failed:", "Traceback ..."])
    assert "First error:\n```\nstep 'second':\nTraceback (most recent call last):" in text
    assert "RuntimeError: no chip answered\nsecond line" in text and "a worker request failed" in text
    assert text.splitlines()[-4:] == ["works    first (0.0 s)", "fails    second (0.0 s)", "skipped  third (0.0 s)",
                                      "skipped  fourth (0.0 s)"]
