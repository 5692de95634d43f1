"""Several workers on the CPU (gloo, world size 2, one torch thread each): Shard TP and Data Parallel.

Tolerances: a sharded transformer sums its matmuls in another order, so TP images match one worker to
max abs diff <= 1e-4 in float32 (seen: ~1e-6). Data parallel changes nothing in the arithmetic (each image
is its own pipeline call with its own generator), so DP images are bit-identical to one worker's.

World-size-1 references are computed first (one module fixture) so that the group restarts only a few times.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
import threading
from pathlib import Path

import numpy as np
import psutil
import pytest
from helpers import run_ok, wait_gone

from backend.controller import api, capacity, group, layouts
from backend.protocol.errors import Interrupted, ParallelError, WorkerCrashed
from backend.protocol.messages import Status, Step
from backend.protocol.spec import Layout, SampleRequest, share

TP_TOLERANCE = 1e-4
FOX, CAR = "a red fox in the snow", "a blue car in the city"


def _request(**kw) -> SampleRequest:
    base = dict(prompt=FOX, width=64, height=64, steps=2, guidance=0.0, seed=100, batch_size=1)
    return SampleRequest(**{**base, **kw})


def _spec(tiny_models, name="tiny-flux", **kw):
    return api.make_spec(name, [str(tiny_models)], **kw)


@pytest.fixture(scope="module")
def refs(tiny_models) -> dict[str, np.ndarray]:
    """Images from a single worker (world size 1), drawn once for the whole module."""
    flux = _spec(tiny_models)
    qwen = _spec(tiny_models, "tiny-qwenimage")
    return {
        "flux4": api.sample(flux, _request(batch_size=4)),  # seeds 100..103
        "fox2": api.sample(flux, _request(seed=300, batch_size=2)),  # seeds 300, 301
        "car2": api.sample(flux, _request(prompt=CAR, seed=302, batch_size=2)),  # seeds 302, 303
        "qwen": api.sample(qwen, _request(guidance=1.0)),
    }


def _group_processes() -> list[psutil.Process]:
    g = group.current_group()
    assert g is not None and len(g.launcher.pids) == g.config.world_size
    return [psutil.Process(pid) for pid in g.launcher.pids]


# ---- validation: before anything starts


@pytest.mark.unit
def test_tp_is_refused_for_models_without_a_plan(tiny_models):
    for name in ("tiny-sd3", "tiny-sdxl"):
        with pytest.raises(ParallelError) as e:
            layouts.plan_tp(_spec(tiny_models, name), 2)
        text = str(e.value)
        assert "tensor-parallel plan" in text and name in text
        assert all(f in text for f in ("FLUX.1", "FLUX.2", "Qwen-Image")), text


@pytest.mark.unit
def test_tp_degree_is_checked_against_cores_chips_and_heads(tiny_models, monkeypatch):
    spec = _spec(tiny_models)  # tiny-flux: 2 attention heads
    monkeypatch.setattr(capacity.os, "cpu_count", lambda: 2)
    with pytest.raises(ParallelError, match=r"degree: 3 is more than this CPU host has 2 cores.*use at most 2"):
        layouts.plan_tp(spec, 3)
    monkeypatch.setattr(capacity.os, "cpu_count", lambda: 8)
    with pytest.raises(ParallelError, match=r"degree: 3 does not divide the 2 attention heads of 'tiny-flux'.*"
                                         r"use one of 1, 2"):
        layouts.plan_tp(spec, 3)
    assert layouts.plan_tp(spec, 0)[0].tp_degree == 1, "auto on the CPU is 1"
    assert layouts.plan_tp(spec, 2)[0].tp_degree == 2

    eight = capacity.Capacity("cuda", 8, None, "this host has 8 CUDA GPUs", True)  # as on an 8-GPU host
    monkeypatch.setattr(capacity, "host_capacity", lambda kind: eight)
    with pytest.raises(ParallelError, match=r"degree: 16 is more than this host has 8 CUDA GPUs"):
        layouts.plan_tp(spec, 16)
    with pytest.raises(ParallelError, match=r"degree: 3 does not divide the 8 chips"):
        layouts.plan_tp(spec, 3)
    tp, text = layouts.plan_tp(spec, 0)
    assert tp.tp_degree == 2 and "the largest degree that divides the 2 attention heads" in text
    with pytest.raises(ParallelError, match=r"replicas: 8 replicas × TP degree 2 = 16 workers"):
        layouts.plan_dp(tp, 8)
    assert layouts.plan_dp(tp, 0)[0].dp_replicas == 4, "auto = chips / degree"


@pytest.mark.unit
def test_on_tpu_only_worker_counts_torch_tpu_launches_pass(tiny_models, monkeypatch):
    """As on an 8-chip v5e host (TorchTPU launches 1, 4 or 8 workers) and one v7x chip (2 devices: only 2);
    tests/test_tpu_hosts.py holds the same rules against TorchTPU itself."""
    v5e = capacity.Capacity("tpu", 8, (1, 4, 8), "this host has 8 TPU v5e chips", True)
    monkeypatch.setattr(capacity, "host_capacity", lambda kind: v5e)
    spec = _spec(tiny_models).with_changes(kind="tpu")  # tiny-flux: 2 attention heads
    with pytest.raises(ParallelError, match=r"replicas: 2 replicas × TP degree 1 = 2 workers, but TorchTPU "
                                            r"launches only 1, 4 or 8 worker processes on this host \(this host has "
                                            r"8 TPU v5e chips\); use replicas 1, 4 or 8"):
        layouts.plan_dp(spec, 2)
    tp, text = layouts.plan_tp(spec, 2)
    assert "not 2: add Data Parallel after this node with replicas 2 or 4 (or 0 = auto)" in text
    with pytest.raises(ParallelError, match=r"use replicas 2 or 4"):
        api.checked(tp)  # Sample without Data Parallel
    assert layouts.plan_dp(tp, 0)[0].world_size == 8 and layouts.plan_dp(spec, 0)[0].dp_replicas == 8
    assert layouts.plan_tp(spec, 0)[0].tp_degree == 1, "auto: the largest degree that launches alone"

    v7x = capacity.Capacity("tpu", 2, (2,), "this host has 1 TPU v7 chip (2 devices)", True)
    monkeypatch.setattr(capacity, "host_capacity", lambda kind: v7x)
    default = api.checked(spec)
    assert (default.tp_degree, default.dp_replicas, default.load_in_turn) == (1, 2, True)
    with pytest.raises(ParallelError, match=r"replicas: 1 replica × TP degree 1 = 1 worker, but TorchTPU launches "
                                            r"only 2 worker processes.*use replicas 2"):
        layouts.plan_dp(spec, 1)
    assert layouts.plan_tp(spec, 0)[0].tp_degree == 2


@pytest.mark.unit
def test_offload_and_tp_are_refused_together(tiny_models):
    with pytest.raises(ParallelError, match=r"offload: 'model' cannot be combined with Shard TP.*'none'"):
        layouts.plan_tp(_spec(tiny_models, offload="model"), 2)


@pytest.mark.unit
def test_a_bad_spec_fails_before_any_worker_starts(tiny_models, monkeypatch):
    monkeypatch.setattr(capacity.os, "cpu_count", lambda: 2)
    before = group.current_group()
    bad = _spec(tiny_models).with_changes(tp_degree=2, dp_replicas=2)
    with pytest.raises(ParallelError, match=r"replicas: 2 replicas × TP degree 2 = 4 workers"):
        api.sample(bad, _request())
    with pytest.raises(ParallelError, match=r"offload"):
        api.load(_spec(tiny_models, offload="model").with_changes(tp_degree=2))
    assert group.current_group() is before


@pytest.mark.unit
def test_text_encoders_show_what_is_sharded(tiny_models):
    _, flux = layouts.plan_tp(_spec(tiny_models), 2, shard_text_encoders=True)
    assert "text_encoder (CLIPTextModel): replicated on every chip (no TP plan" in flux
    assert "text_encoder_2 (T5EncoderModel): replicated on every chip (no TP plan" in flux
    assert "transformer: sharded over 2 chips" in flux
    _, qwen = layouts.plan_tp(_spec(tiny_models, "tiny-qwenimage"), 2, shard_text_encoders=True)
    assert "text_encoder (Qwen2_5_VLForConditionalGeneration): sharded over 2 chips" in qwen
    tp, _ = layouts.plan_tp(_spec(tiny_models, "tiny-qwenimage"), 2, shard_text_encoders=True)
    with pytest.raises(ParallelError, match=r"shard_text_encoders: .*Data Parallel"):
        layouts.plan_dp(tp, 2)


@pytest.mark.unit
def test_images_are_split_in_order():
    req = _request(prompt=f"{FOX}\n\n  \n{CAR}\n", prompt_per_line=True, seed=10, batch_size=3)
    images = req.images()
    assert images == [(FOX, 10), (FOX, 11), (FOX, 12), (CAR, 13), (CAR, 14), (CAR, 15)]
    assert [list(share(5, 2, r)) for r in range(2)] == [[0, 1, 2], [3, 4]]
    assert [list(share(1, 2, r)) for r in range(2)] == [[0], []]
    assert [Layout(2, 4, r).replica for r in range(4)] == [0, 0, 1, 1]
    assert [Layout(2, 4, r).leader for r in range(4)] == [True, False, True, False]


@pytest.mark.workers
@pytest.mark.skipif(not os.environ.get("TPU_VENV"), reason="TPU_VENV is not set: run through scripts/test.sh")
def test_tpu_launch_env_comes_from_torch_tpu_once_for_all_ranks():
    """The real TorchTPU (installed, no TPU here): one child process computes the launch environment."""
    code = textwrap.dedent("""
        import json
        from backend.controller import process_env
        from backend.protocol.errors import DeviceError
        try:
            process_env.tpu_launch_env(2, process_env.worker_env("tpu"))
        except DeviceError as e:
            print(json.dumps(str(e)))
        pod = {**process_env.worker_env("tpu"), "TPU_WORKER_HOSTNAMES": "h0,h1", "JOB_COMPLETION_INDEX": "1"}
        print(json.dumps(process_env.tpu_launch_env(4, pod)))
    """)
    out = subprocess.run([f"{os.environ['TPU_VENV']}/bin/python", "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parent.parent, timeout=120)
    assert out.returncode == 0, out.stderr
    error, pod = (json.loads(line) for line in out.stdout.strip().splitlines()[-2:])
    assert "set_tpu_launch_env" in error and "expected TPU devices" in error  # no chip on this host
    assert pod["TORCH_TPU_SLICEBUILDER_ADDRESSES"].split(",")[4] == "h1:8070"
    assert (pod["NNODES"], pod["NODE_RANK"], pod["MASTER_ADDR"]) == ("2", "1", "h0")


# ---- two workers


@pytest.mark.workers
def test_tp2_gives_the_same_image_as_one_worker(tiny_models, refs):
    tp, _ = layouts.plan_tp(_spec(tiny_models), 2)
    images = api.sample(tp, _request(batch_size=4))
    assert images.shape == refs["flux4"].shape
    assert np.abs(images - refs["flux4"]).max() <= TP_TOLERANCE
    workers = api.worker_info()
    assert [w["rank"] for w in workers] == [0, 1] and len({w["pid"] for w in workers}) == 2
    assert workers[0]["steps"] == workers[1]["steps"], "both ranks ran every step"
    assert [w["device_mesh"] for w in workers] == [True, True]


@pytest.mark.workers
def test_tp2_with_sharded_text_encoder(tiny_models, refs):
    tp, _ = layouts.plan_tp(_spec(tiny_models, "tiny-qwenimage"), 2, shard_text_encoders=True)
    images = api.sample(tp, _request(guidance=1.0))
    assert np.abs(images - refs["qwen"]).max() <= TP_TOLERANCE


@pytest.mark.workers
def test_tp2_compiled_sharded_transformer(tiny_models, refs):
    from backend.protocol.spec import CompilePlan

    spec = _spec(tiny_models).with_changes(mode="compiled", compile=CompilePlan(backend="eager"))
    tp, _ = layouts.plan_tp(spec, 2)
    images = api.sample(tp, _request(batch_size=2))
    assert np.abs(images - refs["flux4"][:2]).max() <= TP_TOLERANCE
    assert api.worker_info()[1]["compile"]["compiles"] >= 1, "rank 1 compiled its shard too"


@pytest.mark.workers
def test_dp2_is_bit_identical_to_one_worker_and_keeps_the_order(tiny_models, refs):
    dp, _ = layouts.plan_dp(_spec(tiny_models), 2)
    api.shutdown()  # a fresh group: the TP tests' workers (same size) have built a device mesh
    api.load(dp)
    before = [w["steps"] for w in api.worker_info()]
    progress = []
    images = api.sample(dp, _request(batch_size=4), lambda m: progress.append((m.step, m.total))
                        if isinstance(m, Step) else None)
    assert np.array_equal(images, refs["flux4"]), "the same seeds must give the same pixels on 2 replicas"
    assert [w["device_mesh"] for w in api.worker_info()] == [False, False], "no mesh for Data Parallel alone"
    steps = [w["steps"] for w in api.worker_info()]
    assert [a - b for a, b in zip(steps, before, strict=True)] == [4, 4], "each replica drew 2 of 4 images"
    assert progress[-1] == (8, 8) and [s for s, _ in progress] == sorted(s for s, _ in progress), progress
    odd = api.sample(dp, _request(batch_size=3))  # 2 + 1
    assert np.array_equal(odd, refs["flux4"][:3])
    one = api.sample(dp, _request(batch_size=1))  # 1 + 0: replica 1 has nothing to draw
    assert np.array_equal(one, refs["flux4"][:1])


@pytest.mark.workers
def test_dp2_replicas_load_in_turn_and_give_the_same_images(tiny_models, refs):
    """Replica 1 reads its weights only after replica 0 has loaded (host memory: one load in flight)."""
    dp, _ = layouts.plan_dp(_spec(tiny_models, "tiny-qwenimage"), 2)
    assert api.checked(dp).load_in_turn and not api.checked(_spec(tiny_models)).load_in_turn
    said = []
    images = api.sample(dp, _request(guidance=1.0), lambda m: said.append(m.text) if isinstance(m, Status) else None)
    assert np.array_equal(images, refs["qwen"])
    assert any(t.startswith("replica 1 of 2 loaded; the next one loads now") for t in said), said
    assert [w["model"].endswith("tiny-qwenimage") for w in api.worker_info()] == [True, True]


@pytest.mark.workers
def test_dp2_prompt_per_line_splits_prompts_in_order(tiny_models, refs):
    dp, _ = layouts.plan_dp(_spec(tiny_models), 2)
    images = api.sample(dp, _request(prompt=f"{FOX}\n{CAR}", prompt_per_line=True, seed=300, batch_size=2))
    assert np.array_equal(images, np.concatenate([refs["fox2"], refs["car2"]]))


@pytest.mark.workers
def test_interrupt_stops_both_tp_ranks_at_the_same_step(tiny_models):
    tp, _ = layouts.plan_tp(_spec(tiny_models), 2)
    api.load(tp)
    before = [w["steps"] for w in api.worker_info()]
    stop, seen = threading.Event(), []

    def on_progress(msg):
        if isinstance(msg, Step):
            seen.append(msg.step)
            if msg.step == 3:
                stop.set()

    with pytest.raises(Interrupted):
        api.sample(tp, _request(steps=5000), on_progress, stop.is_set)
    assert max(seen) < 50, "the ranks did not stop a few steps after the flag"
    steps = [w["steps"] - b for w, b in zip(api.worker_info(), before, strict=True)]
    assert steps[0] == steps[1] >= 3, f"the ranks stopped at different steps: {steps}"
    assert api.sample(tp, _request()).shape == (1, 64, 64, 3), "the next request works"


@pytest.mark.workers
def test_sigkill_of_rank_1_fails_fast_naming_it_and_the_next_request_starts_fresh(tiny_models):
    tp, _ = layouts.plan_tp(_spec(tiny_models), 2)
    api.load(tp)
    old = _group_processes()
    victim = api.worker_info()[1]["pid"]
    killed = []

    def kill_on_step(msg):
        if isinstance(msg, Step) and msg.step == 2 and not killed:
            killed.append(victim)
            os.kill(victim, signal.SIGKILL)

    crash = rf"rank 1 \(pid {victim}\) stopped unexpectedly \(killed by SIGKILL"
    with pytest.raises(WorkerCrashed, match=crash) as e:
        api.sample(tp, _request(steps=5000), kill_on_step)
    assert (e.value.rank, e.value.pid, e.value.host) == (1, victim, None), "the message's rank and pid, as fields"
    left = wait_gone(old, timeout=10)
    assert [p.pid for p in left] == [], "the other rank was left running"
    assert api.sample(tp, _request()).shape == (1, 64, 64, 3)
    assert victim not in {w["pid"] for w in api.worker_info()}


# ---- through a real ComfyUI server


def _prompt(sample: dict, *middle: tuple[str, dict]) -> dict:
    """Load (tiny-flux) → [middle nodes] → Sample → Save Image, in ComfyUI's API format."""
    load = {"model": "tiny-flux", "dtype": "auto", "device": "auto", "offload": "none", "model_path": ""}
    wf = {"1": {"class_type": "LoadTPUPipeline", "inputs": load}}
    link = ["1", 0]
    for i, (cls, inputs) in enumerate(middle, start=10):
        wf[str(i)] = {"class_type": cls, "inputs": {"pipeline": link, **inputs}}
        link = [str(i), 0]
    wf["2"] = {"class_type": "TPUSample", "inputs": {
        "pipeline": link, "prompt": FOX, "negative_prompt": "", "width": 64, "height": 64, "steps": 2,
        "guidance": 0.0, "seed": 500, "batch_size": 1, **sample}}
    wf["3"] = {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "parallel"}}
    return wf


@pytest.mark.server
def test_server_shard_tp_workflow_writes_a_png(server):
    shard = ("TPUShardTP", {"degree": 2, "shard_text_encoders": False})
    result = run_ok(server, _prompt({"seed": 501}, shard), timeout=180)
    assert len(result["images"]) == 1 and result["images"][0].is_file()


@pytest.mark.server
def test_server_data_parallel_workflow_writes_one_png_per_image(server):
    wf = _prompt({"seed": 600, "batch_size": 4}, ("TPUDataParallel", {"replicas": 2}))
    result = run_ok(server, wf, timeout=180)
    assert len(result["images"]) == 4 and all(p.is_file() for p in result["images"])


@pytest.mark.server
def test_server_reports_tp_on_a_model_without_a_plan(server):
    from comfy_server import error_message

    wf = _prompt({"seed": 700}, ("TPUShardTP", {"degree": 2, "shard_text_encoders": False}))
    wf["1"]["inputs"]["model"] = "tiny-sd3"
    result = server.run(wf, timeout=60)
    assert result["status"] == "error"
    assert "no tensor-parallel plan" in error_message(result) and "FLUX.1" in error_message(result)
    assert server.proc.poll() is None
