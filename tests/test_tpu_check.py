"""`python -m backend tpu-check` on this CPU host: the same steps a TPU VM runs, on 1 and 2 CPU workers."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
STEPS = ["detect the device", "build the tiny model", "start a worker group and load", "sample in strict eager",
         "sample in defer-and-fuse eager", "sample in debug eager (launch blocking)", "compile at two shapes",
         "sample the compiled shapes without recompiling", "restart and reuse the compile cache",
         "Shard TP over several devices", "Data Parallel over several devices: same images",
         "sample a tiny video model (Wan)", "sample a tiny video with sound model (LTX-2)", "sample a tiny modular pipeline model (FLUX 3 [klein])",
         "sample a tiny quantized file model", "float64 on the device (FLUX's rotary embedding)", "random numbers drawn on the device",
         "eager torch.cat of SDXL's time_proj"]
TPU_ONLY = STEPS[-2:]  # they ask TorchTPU itself: skipped here, saying why
NO_TINY: list[str] = []  # kinds no family of this branch declares yet: declared, and skipped saying why


@pytest.mark.workers
def test_tpu_check_runs_every_step_and_prints_a_report_as_a_user_runs_it(tiny_models, tmp_path):
    """Exactly as a user runs it: none of the thread settings the other tests pin (OMP_NUM_THREADS,
    COMFYUI_TPU_WORKER_THREADS), so on this CPU host the 1-worker group and the 2-worker one get different torch
    thread counts (the cores are divided among a group's workers), and Data Parallel holds its promise for that
    case: bit-identical at equal thread counts, within 1e-5 otherwise."""
    from backend.tpu_check import DP_CPU_TOLERANCE

    report = tmp_path / "report.md"
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "COMFYUI_TPU_WORKER_THREADS")}
    out = subprocess.run([sys.executable, "-m", "backend", "tpu-check", "--models", str(tiny_models), "--out",
                          str(report)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-3000:]
    summary = [line.split(None, 1) for line in out.stdout.splitlines()[-len(STEPS):]]
    assert [name.rsplit(" (", 1)[0] for _, name in summary] == STEPS
    assert [result for result, _ in summary] == [
        "skipped" if name in TPU_ONLY + NO_TINY else "works" for name in STEPS], out.stdout
    text = report.read_text()
    assert text.strip() == out.stdout.strip()
    assert "- versions: python " in text and "torch " in text and "diffusers " in text and "torch_tpu " in text
    assert "| defer-and-fuse" not in text and "running strict eager on cpu" in text
    assert "3 reuses, 0 recompiles (one with 3 steps instead of 2)" in text and "cache folder reused" in text
    for step in TPU_ONLY:
        assert f"| {step} | skipped | 0.0 | asks TorchTPU itself, so it runs on a TPU only (this host runs cpu) |" \
            in text, step
    assert "TP 2 × 1 replica(s) = 2 workers" in text
    assert "| sample a tiny video model (Wan) | works | " in text and "(WanPipeline, tiny-wan): 5 frames 32x32" in text
    assert "| sample a tiny quantized file model | works | " in text and "in int8 + nvfp4 + fp8 and an int8 ConvRot " \
        "layer on cpu: 14 layers kept as comfy-kitchen tensors, 0 as plain buffers, 0 dequantized at load" in text
    for step in NO_TINY:
        kind = step.removeprefix("sample a tiny ").removesuffix(" model")
        assert f"| {step} | skipped | 0.0 | no family in this pack declares a {kind} pipeline with a tiny model " \
               "yet" in text, step
    dp = re.search(r"\| Data Parallel over several devices: same images \| works \| [\d.]+ \| 2 replicas: "
                   r"(bit-identical to|(\S+) off) 1 worker\(s\) \(torch threads per worker: (\S+) against (\S+)\)"
                   r"(.*) \|", text)
    assert dp, text
    same_threads = dp.group(3) == dp.group(4)
    expected = "bit-identical to" if same_threads else dp.group(1)
    assert dp.group(1) == expected, "equal thread counts must give the same pixels"
    assert float(dp.group(2) or 0) <= DP_CPU_TOLERANCE
    assert ("within the 1e-05 promised" in dp.group(5)) == (dp.group(2) is not None), dp.group(0)
    assert "| float64 on the device (FLUX's rotary embedding) | works | " in text
    assert "float64 runs on cpu: cos of 4096 values within 0 of the CPU's float64" in text
    assert "FLUX's rotary embedding runs in float64 on cpu" in text


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


@pytest.mark.workers
def test_the_tpu_only_probes_measure_what_they_report_when_pointed_at_the_cpu():
    """The two probes a TPU runs (a seeded device draw against the CPU's; SDXL's time_proj in an eager mode against
    the CPU), run here against the CPU itself, with a stand-in for torch.tpu's eager-mode switch: 0 difference."""
    from backend.tpu_check import _CAT_PROBE, _RNG_PROBE

    stub = ("import torch, types; torch.tpu = types.SimpleNamespace(EagerMode=types.SimpleNamespace("
            "DEFER_NEVER=0, DEFER_AND_FUSE=1), eager_mode=None)\n")
    rng = subprocess.run([sys.executable, "-c", _RNG_PROBE, "cpu"], capture_output=True, text=True, timeout=120)
    cat = subprocess.run([sys.executable, "-c", stub + _CAT_PROBE, "cpu", "DEFER_NEVER"], capture_output=True,
                         text=True, timeout=120)
    assert rng.stdout.split() == ["0.0", "True"], rng.stderr
    assert cat.stdout.split() == ["0.0"], cat.stderr


@pytest.mark.unit
def test_the_per_kind_steps_come_from_the_registry(monkeypatch):
    """A family declares its kind (`Pipeline.check_kind`, or a video pipeline's frame_step) and its tiny model:
    tpu-check then has a step for it, run with that tiny model; a kind no family declares stays a skipped step that
    says why, and a new kind joins the list by its declaration alone."""
    from dataclasses import replace

    from backend import families, tpu_check

    steps = {kind: (name, found) for kind, name, found in tpu_check.kind_steps()}
    assert list(steps) == list(tpu_check.KIND_STEPS)
    assert steps["video"][0] == "sample a tiny video model (Wan)"
    assert (steps["video"][1][0].id, steps["video"][1][1].class_name, steps["video"][1][2]) == (
        "wan", "WanPipeline", "wan")
    assert steps["video with sound"][0] == "sample a tiny video with sound model (LTX-2)"
    assert (steps["video with sound"][1][0].id, steps["video with sound"][1][2]) == ("ltx2", "ltx2")
    assert steps["modular pipeline"][0] == "sample a tiny modular pipeline model (FLUX 3 [klein])"
    assert steps["quantized file"][1] is None, "a kind of file, not of pipeline: tpu-check's own step"
    with pytest.raises(tpu_check.Skip, match="no family in this pack declares a kind nobody declares pipeline"):
        tpu_check.TpuCheck("cpu", Path("/nonexistent"), None).sample_kind("kind nobody declares", None)

    wan = families.FAMILIES["wan"]
    other = replace(wan, id="other", name="Another kind", tiny=("other",),
                    pipelines=(replace(wan.pipelines[0], check_kind="a kind of its own"),))
    monkeypatch.setattr(families, "FAMILIES", {**families.FAMILIES, "other": other})
    steps = {kind: (name, found) for kind, name, found in tpu_check.kind_steps()}
    assert steps["a kind of its own"][0] == "sample a tiny a kind of its own model (Another kind)"


@pytest.mark.workers
def test_the_quantized_file_step_runs_comfy_kitchens_layers_as_each_device_does(tiny_models):
    """tiny FLUX's T5 quantized by comfy-kitchen (int8, nvfp4, fp8) and read as the pack reads ComfyUI's files: on
    the CPU every layer stays a comfy-kitchen tensor; as a TPU runs them (the same probe told the device is a TPU,
    run on the CPU) the int8 and fp8 layers become plain buffers and the nvfp4 ones are dequantized at load, each
    within QUANT_TOLERANCE of comfy-kitchen's dequantized weights."""
    from backend import tpu_check, tpu_probes

    check = tpu_check.TpuCheck("cpu", tiny_models, None)
    check.kind = "cpu"
    assert "on cpu: 14 layers kept as comfy-kitchen tensors, 0 as plain buffers, 0 dequantized" in \
        check.sample_kind("quantized file", None)
    t5 = str(tiny_models / "tiny-flux" / "text_encoder_2")
    out, found = tpu_check._probe(tpu_probes._QUANT_PROBE, "cpu", "cpu", t5, "tpu", str(ROOT))
    assert "0 layers kept as comfy-kitchen tensors, 10 as plain buffers, 4 dequantized at load" in \
        tpu_probes.quant_report("cpu", found, tpu_check._why(out))
    with pytest.raises(AssertionError, match="relative errors"):
        tpu_probes.quant_report("tpu:0", ["0.5", "0.0", "0", "10", "4"], "")
